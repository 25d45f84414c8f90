-- limiter_lock: lock the counter shards of the keys a claimed batch needs (Postgres limiter).
-- Runs first in the admission transaction (limiter/postgres.py); limiter_debit follows.
-- Params: kind text[], key text[] (distinct (kind, key) pairs: 'conc' gate keys, 'rate' keys).
-- Locks: FOR UPDATE OF b SKIP LOCKED in (kind, key, shard) order — concurrent pickers take
--   disjoint shards of a hot key and never wait on each other, so counter locks cannot
--   form a deadlock cycle. The locked rows come back as their latest committed version.
-- Returns every existing shard of those keys: the grabbed ones with their counters
--   (available, seconds since the last refill), the ones another picker holds with NULLs —
--   a held shard is not cold: it exists and is simply not ours this time.
-- Index: gen_durable_buckets_kind_key_shard (unique), one probe per key.
WITH want AS (
    SELECT * FROM unnest(%(kind)s::text[], %(key)s::text[]) AS w(kind, key)
), grabbed AS (
    SELECT b.id, b.kind, b.key, b.shard, b.capacity, b.available,
           GREATEST(extract(epoch FROM now() - COALESCE(b.last_refill, now()))::float8, 0) AS elapsed
    FROM gen_durable_buckets b
    JOIN want w ON b.kind = w.kind AND b.key = w.key
    ORDER BY b.kind, b.key, b.shard
    FOR UPDATE OF b SKIP LOCKED
)
SELECT kind, key, shard, capacity, available, elapsed FROM grabbed
UNION ALL
SELECT b.kind, b.key, b.shard, NULL, NULL, NULL
FROM gen_durable_buckets b
JOIN want w ON b.kind = w.kind AND b.key = w.key
WHERE NOT EXISTS (SELECT 1 FROM grabbed g WHERE g.id = b.id)
