-- reconcile_heal: last statement of the gate reconciler's transaction.
-- Params: id bigint[], capacity float8[], available float8[] (the healed counters of
--   locked shards); drop bigint[] (locked shards to delete: a gate no longer configured or
--   a shard beyond `shards` with nothing executing on it, and every shard of a key that
--   is idle and full — a missing shard is admitted as full, so deleting loses nothing).
WITH heal AS (
    UPDATE gen_durable_buckets b
    SET capacity = h.capacity, available = h.available
    FROM unnest(%(id)s::bigint[], %(capacity)s::float8[], %(available)s::float8[]) AS h(id, capacity, available)
    WHERE b.id = h.id AND (b.capacity <> h.capacity OR b.available <> h.available)
    RETURNING b.id
), dropped AS (
    DELETE FROM gen_durable_buckets b
    WHERE b.id = ANY (%(drop)s::bigint[])
    RETURNING b.id
)
SELECT (SELECT count(*) FROM heal), (SELECT count(*) FROM dropped)
