-- unknown_rate_limits: rate-limit names of live rows that are not configured (start-up scan).
-- Params: names text[] (the configured RATE_LIMITS names).
-- Run once per worker start and by `manage.py check --database`: it reads every runnable
-- and executing row with a rate limit (the pick index's runnable set plus the in-flight
-- rows) — not a hot-path statement. At most 20 names come back.
SELECT DISTINCT split_part(rate_limit, ':', 1)
FROM gen_durable
WHERE status IN ('runnable', 'executing') AND rate_limit IS NOT NULL
  AND split_part(rate_limit, ':', 1) <> ALL (%(names)s::text[])
LIMIT 20
