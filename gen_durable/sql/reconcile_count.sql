-- reconcile_count: executing rows holding a gate slot, per (key, shard).
-- Params: keys text[] (the gate keys whose shards reconcile_lock took).
-- A shard of -1 marks a row claimed but not yet admitted: it holds no slot.
-- Index: gen_durable_lease (status = 'executing'): cost tracks the in-flight rows.
SELECT concurrency_key, concurrency_shard, count(*)
FROM gen_durable
WHERE status = 'executing' AND concurrency_shard >= 0
  AND concurrency_key = ANY (%(keys)s::text[])
GROUP BY concurrency_key, concurrency_shard
