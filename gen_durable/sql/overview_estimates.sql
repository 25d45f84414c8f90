-- overview_estimates: rows per (queue, status) as the planner's statistics know them
-- (admin overview): the most common (queue, status) pairs of the extended statistics
-- gen_durable_queue_status, their frequencies, and the table's row estimate. Reads no
-- table rows; as current as the last ANALYZE (autovacuum), which it returns too, with
-- the rows changed since (n_mod_since_analyze) and the table's size in pages now
-- (pg_relation_size: no ANALYZE needed) — what tells the overview whether to sample.
-- No params. One row; the statistics columns are NULL before the first ANALYZE.
SELECT c.reltuples, greatest(t.last_analyze, t.last_autoanalyze),
       e.attnames, e.most_common_vals, e.most_common_freqs,
       t.n_mod_since_analyze, t.n_live_tup,
       pg_relation_size(c.oid) / current_setting('block_size')::int
FROM pg_class c
JOIN pg_stat_user_tables t ON t.relid = c.oid
LEFT JOIN pg_stats_ext e
       ON e.statistics_name = 'gen_durable_queue_status' AND e.tablename = 'gen_durable'
      AND e.schemaname = t.schemaname
WHERE c.oid = 'gen_durable'::regclass
