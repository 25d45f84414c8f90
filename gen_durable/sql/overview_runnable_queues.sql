-- overview_runnable_queues: the queues that have runnable rows (admin overview).
-- No params. Index: gen_durable_pick, read as a loose index scan — one probe per
-- distinct queue (a recursive "next queue after this one"), never the runnable rows.
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM gen_durable WHERE status = 'runnable' ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT g.queue FROM gen_durable g
            WHERE g.status = 'runnable' AND g.queue > q.queue ORDER BY g.queue LIMIT 1)
    FROM q WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
