-- overview_workers: the registered worker processes and whether each is live (seen
-- within `live` seconds). Params: live float8. Table: gen_durable_workers (small).
SELECT id, host, pid, queues, started_at, last_seen,
       last_seen >= now() - make_interval(secs => %(live)s::float8) AS live
FROM gen_durable_workers
ORDER BY host, pid, id
