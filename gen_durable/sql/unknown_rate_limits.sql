-- unknown_rate_limits: rate-limit names of live rows that are not configured (start-up scan),
-- with how many rows name each and the lowest such id (for the warning: where to look).
-- Params: names text[] (the configured RATE_LIMITS names).
-- Run once per worker start and by `manage.py check --database`: it reads every runnable
-- and executing row with a rate limit (the pick index's runnable set plus the in-flight
-- rows) — not a hot-path statement; counting costs nothing more than listing the names.
-- At most 20 names come back, most rows first.
SELECT split_part(rate_limit, ':', 1) AS name, count(*) AS n, min(id) AS example
FROM gen_durable
WHERE status IN ('runnable', 'executing') AND rate_limit IS NOT NULL
  AND split_part(rate_limit, ':', 1) <> ALL (%(names)s::text[])
GROUP BY 1
ORDER BY 2 DESC, 1
LIMIT 20
