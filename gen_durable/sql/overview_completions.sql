-- overview_completions: rows that became done or failed per minute over the last
-- `minutes` minutes (admin overview chart). Params: minutes int.
-- Index: gen_durable_gc (updated_at) WHERE status IN ('done', 'failed') — an index-only
-- range scan over the last hour's terminal rows (status is implied by the predicate).
SELECT date_trunc('minute', updated_at) AS minute, count(*)
FROM gen_durable
WHERE status IN ('done', 'failed')
  AND updated_at >= date_trunc('minute', now()) - make_interval(mins => %(minutes)s::int - 1)
GROUP BY 1
ORDER BY 1
