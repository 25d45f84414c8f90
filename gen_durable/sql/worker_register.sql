-- worker_register: a worker process announces itself, or refreshes its row (heartbeat).
-- Params: id text (the supervisor token), host text, pid int, queues text[],
--   stale float8 (seconds: rows not seen for longer belong to dead processes and go).
-- Upsert, so a row removed while the process lived comes back on the next beat.
WITH pruned AS (
    DELETE FROM gen_durable_workers
    WHERE last_seen < now() - make_interval(secs => %(stale)s::float8) AND id <> %(id)s::text
    RETURNING id
)
INSERT INTO gen_durable_workers AS w (id, host, pid, queues)
SELECT %(id)s::text, %(host)s::text, %(pid)s::int, %(queues)s::text[]
FROM (SELECT count(*) FROM pruned) p
ON CONFLICT (id) DO UPDATE SET last_seen = now(), queues = EXCLUDED.queues
RETURNING w.id
