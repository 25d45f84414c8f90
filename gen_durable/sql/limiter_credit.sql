-- limiter_credit: give gate slots back (Postgres limiter).
-- Runs inside the transaction that took the rows out of executing (the flush of their
-- outcomes, a cancel, a reap, a release), so counters and executing rows change together
-- and the reconciler never sees a row gone with its slot still debited.
-- Params: key text[], shard int[], n int[] — aggregated per (key, shard), sorted.
-- Locks: FOR UPDATE in (key, shard) order. LEAST: a credit that meets a counter the
--   reconciler already healed to full cannot push it past capacity. A slot whose shard
--   is gone (swept or never minted) is dropped.
WITH c AS (
    SELECT * FROM unnest(%(key)s::text[], %(shard)s::int[], %(n)s::int[]) AS c(key, shard, n)
), locked AS (
    SELECT b.id, c.n
    FROM gen_durable_buckets b
    JOIN c ON b.kind = 'conc' AND b.key = c.key AND b.shard = c.shard
    ORDER BY b.key, b.shard
    FOR UPDATE OF b
)
UPDATE gen_durable_buckets b
SET available = LEAST(b.capacity, b.available + l.n)
FROM locked l
WHERE b.id = l.id
RETURNING b.id
