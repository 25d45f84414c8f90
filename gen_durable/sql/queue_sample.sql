-- queue_sample: for each queue named, how many runnable rows wait in it (counted up to
-- cap + 1) and the id of its head row (first in pick order) — what the unserved-queue
-- warnings show (W006, worker start-up): roughly how much is stranded, and where to look.
-- Params: queues text[], cap int. Index: gen_durable_pick (queue, priority, eligible_at),
-- at most cap + 1 entries per queue for the count (read in index order, so a
-- sequential scan is never the cheaper plan for a dense queue) and one probe for the
-- head, whatever the queue's size (tests/plans).
SELECT q.queue,
       (SELECT count(*) FROM (SELECT 1 FROM gen_durable g
                              WHERE g.queue = q.queue AND g.status = 'runnable'
                              ORDER BY g.priority, g.eligible_at
                              LIMIT %(cap)s + 1) c) AS n,
       (SELECT g.id FROM gen_durable g
        WHERE g.queue = q.queue AND g.status = 'runnable'
        ORDER BY g.priority, g.eligible_at LIMIT 1) AS example
FROM unnest(%(queues)s::text[]) AS q(queue)
ORDER BY q.queue
