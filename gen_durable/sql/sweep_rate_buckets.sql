-- sweep_rate_buckets: delete idle rate buckets (GC sweep, Postgres limiter).
-- Params: name text[], rate float8[] (per-shard tokens per second of each configured
--   rate limit).
-- A key goes all shards or none, when every shard exists, is lockable now, and either
-- its name is no longer configured or it has refilled to capacity (a missing bucket is
-- admitted as full, so deleting a full one changes nothing). A zero-rate key never
-- refills and is never swept: deleting it would hand out a fresh burst.
-- Locks: FOR UPDATE SKIP LOCKED in (key, shard) order; a held shard keeps its key.
WITH cfg AS (
    SELECT * FROM unnest(%(name)s::text[], %(rate)s::float8[]) AS c(name, rate)
), cand AS (
    SELECT b.id, b.key, b.capacity, b.available, b.last_refill
    FROM gen_durable_buckets b
    WHERE b.kind = 'rate'
    ORDER BY b.key, b.shard
    FOR UPDATE SKIP LOCKED
), idle AS (
    SELECT cand.key
    FROM cand LEFT JOIN cfg ON cfg.name = split_part(cand.key, ':', 1)
    GROUP BY cand.key
    HAVING bool_and(cfg.name IS NULL
                    OR (cfg.rate > 0 AND cand.available + GREATEST(extract(epoch FROM now() - cand.last_refill)::float8, 0) * cfg.rate
                                         >= cand.capacity))
       AND count(*) = (SELECT count(*) FROM gen_durable_buckets x WHERE x.kind = 'rate' AND x.key = cand.key)
)
DELETE FROM gen_durable_buckets b
USING cand, idle
WHERE b.id = cand.id AND cand.key = idle.key
RETURNING b.key
