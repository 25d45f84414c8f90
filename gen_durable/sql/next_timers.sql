-- next_timers: seconds (database clock) until each timer of one worker process is due.
-- Rows: ('await', NULL, s) — the earliest armed Await deadline of any queue (s <= 0: due);
--       ('queue', q, s)    — per served queue, the earliest runnable row not yet due (s > 0);
--       ('schedule', NULL, s) — the earliest next tick of the given cron schedules.
-- A kind with nothing armed returns no row (await, schedule: a NULL s).
-- Params: queues text[] (the queues this process serves), schedules text[] (schedule names).
-- Index: min(await_deadline) is one probe at the head of gen_durable_await_deadline. Per
--   queue, a loose index scan of gen_durable_pick (queue, priority, eligible_at) walks the
--   distinct priorities in use (one probe each) and seeks the first row past now() in
--   each (one probe each): a handful of probes whatever the number of rows (tests/plans).
--   Schedules: primary-key probes of gen_durable_schedules (one per name).
-- Reads only; takes no row lock.
WITH RECURSIVE prio AS (
    SELECT q.queue,
           (SELECT g.priority FROM gen_durable g
            WHERE g.queue = q.queue AND g.status = 'runnable'
            ORDER BY g.priority LIMIT 1) AS priority
    FROM unnest(%(queues)s::text[]) AS q(queue)
    UNION ALL
    SELECT p.queue,
           (SELECT g.priority FROM gen_durable g
            WHERE g.queue = p.queue AND g.status = 'runnable' AND g.priority > p.priority
            ORDER BY g.priority LIMIT 1)
    FROM prio p
    WHERE p.priority IS NOT NULL
)
SELECT 'await' AS kind, NULL::text AS queue,
       extract(epoch FROM min(await_deadline) - now())::float8 AS seconds
FROM gen_durable
WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL
UNION ALL
SELECT 'queue', p.queue, extract(epoch FROM min(n.eligible_at) - now())::float8
FROM prio p
CROSS JOIN LATERAL (
    SELECT g.eligible_at FROM gen_durable g
    WHERE g.queue = p.queue AND g.status = 'runnable' AND g.priority = p.priority
      AND g.eligible_at > now()
    ORDER BY g.eligible_at
    LIMIT 1
) n
WHERE p.priority IS NOT NULL
GROUP BY p.queue
UNION ALL
SELECT 'schedule', NULL, extract(epoch FROM min(next_run_at) - now())::float8
FROM gen_durable_schedules
WHERE name = ANY (%(schedules)s::text[])
