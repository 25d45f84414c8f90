-- sync_limits: record this worker's configured limits in gen_durable_bucket_configs
-- (read by operators and the admin; admission takes them from the worker's settings).
-- Params: kind text[], name text[], rate float8[] (tokens per second, NULL for gates),
--   capacity float8[] (burst or limit), shards int[].
-- Upserts in (kind, name) order — DO UPDATE locks rows in input order, and two workers
-- of a rolling deploy upserting in different orders could deadlock. Names a worker does
-- not configure are left alone (another worker may still use them); last writer wins.
INSERT INTO gen_durable_bucket_configs AS c (kind, name, rate, capacity, shards, updated_at)
SELECT kind, name, rate, capacity, shards, now()
FROM unnest(%(kind)s::text[], %(name)s::text[], %(rate)s::float8[], %(capacity)s::float8[], %(shards)s::int[])
     AS i(kind, name, rate, capacity, shards)
ORDER BY kind, name
ON CONFLICT (kind, name) DO UPDATE
    SET rate = EXCLUDED.rate, capacity = EXCLUDED.capacity, shards = EXCLUDED.shards, updated_at = now()
