-- reconcile_count: executing rows holding a gate slot, per (concurrency_key, shard).
-- Params: names text[] (the gate names whose counters reconcile_lock took). The caller
--   maps each concurrency_key to its counter (the gate's name, or the key itself for a
--   per-key gate) and sums.
-- A shard of -1 marks a row claimed but not yet admitted: it holds no slot.
-- Index: gen_durable_lease (status = 'executing'): cost tracks the in-flight rows.
SELECT concurrency_key, concurrency_shard, count(*)
FROM gen_durable
WHERE status = 'executing' AND concurrency_shard >= 0
  AND concurrency_name = ANY (%(names)s::text[])
GROUP BY concurrency_key, concurrency_shard
