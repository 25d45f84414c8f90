-- metrics_completions: rows that became done or failed in the last minute and in the
-- last hour, and of those the failed ones (gen_durable.integrations.prometheus).
-- No params. One row: (finished 1 min, finished 1 h, failed 1 min, failed 1 h).
-- Index: gen_durable_gc (updated_at) WHERE status IN ('done', 'failed') and
-- gen_durable_failed (updated_at) WHERE status = 'failed' — two index-only range scans
-- over the last hour, as overview_completions.sql (status is implied by each predicate).
SELECT f.minute, f.hour, x.minute, x.hour
FROM (SELECT count(*) FILTER (WHERE updated_at >= now() - interval '1 minute') AS minute, count(*) AS hour
      FROM gen_durable
      WHERE status IN ('done', 'failed') AND updated_at >= now() - interval '1 hour') f,
     (SELECT count(*) FILTER (WHERE updated_at >= now() - interval '1 minute') AS minute, count(*) AS hour
      FROM gen_durable
      WHERE status = 'failed' AND updated_at >= now() - interval '1 hour') x
