-- overview_queue_depth: per queue, its runnable rows (counted up to `cap`), those due
-- now (up to `cap`) and the oldest due row's eligible_at (admin overview, OTel gauges).
-- Params: queues text[], cap int. Index: gen_durable_pick (queue, priority,
-- eligible_at): the counts stop after `cap` index entries; the oldest due row is found
-- by a loose scan over the queue's distinct priorities (one probe each), so the work
-- is bounded whatever the size of the queue.
SELECT q.queue,
       (SELECT count(*) FROM (SELECT 1 FROM gen_durable g
                              WHERE g.queue = q.queue AND g.status = 'runnable'
                              LIMIT %(cap)s) c) AS runnable,
       (SELECT count(*) FROM (SELECT 1 FROM gen_durable g
                              WHERE g.queue = q.queue AND g.status = 'runnable'
                                AND g.eligible_at <= now()
                              LIMIT %(cap)s) c) AS due,
       (WITH RECURSIVE p(priority) AS (
            SELECT min(g.priority) FROM gen_durable g
            WHERE g.queue = q.queue AND g.status = 'runnable'
            UNION ALL
            SELECT (SELECT min(g.priority) FROM gen_durable g
                    WHERE g.queue = q.queue AND g.status = 'runnable' AND g.priority > p.priority)
            FROM p WHERE p.priority IS NOT NULL
        )
        SELECT min((SELECT min(g.eligible_at) FROM gen_durable g
                    WHERE g.queue = q.queue AND g.status = 'runnable' AND g.priority = p.priority))
        FROM p WHERE p.priority IS NOT NULL) AS oldest,
       now() AS at
FROM unnest(%(queues)s::text[]) AS q(queue)
