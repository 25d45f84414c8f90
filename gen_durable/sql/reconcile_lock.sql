-- reconcile_lock: first statement of the gate reconciler's transaction (GC sweep).
-- Locks every gate counter shard it can, FOR UPDATE SKIP LOCKED in (key, shard) order —
-- a shard a picker or a credit holds right now is left for the next sweep.
-- Holding these locks freezes the counters: admissions debit and stamp under the same
-- lock, and credits commit together with the rows leaving executing, so the count that
-- follows (reconcile_count, a fresh snapshot) is consistent with the locked counters.
-- Params: none. Cost tracks the number of gate shards (idle full keys are deleted).
SELECT id, key, shard, capacity, available
FROM gen_durable_buckets
WHERE kind = 'conc'
ORDER BY key, shard
FOR UPDATE SKIP LOCKED
