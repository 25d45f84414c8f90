-- overview_completions: rows that became done or failed per minute over the last
-- `minutes` minutes, and of those the failed ones (admin overview chart).
-- Params: minutes int. Returns (minute, count, failed): failed false for every finished
-- row, true for the failed ones only.
-- Index: gen_durable_gc (updated_at) WHERE status IN ('done', 'failed') and
-- gen_durable_failed (updated_at) WHERE status = 'failed' — two index-only range scans
-- over the last hour (status is implied by each predicate).
SELECT date_trunc('minute', updated_at) AS minute, count(*), false
FROM gen_durable
WHERE status IN ('done', 'failed')
  AND updated_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s::int - 1)
GROUP BY 1
UNION ALL
SELECT date_trunc('minute', updated_at), count(*), true
FROM gen_durable
WHERE status = 'failed'
  AND updated_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s::int - 1)
GROUP BY 1
ORDER BY 1
