-- burst_leftovers: what a `rundurable --burst` leaves in its queues, and why, when it
-- exits: per queue and reason, rows and an example id. Reasons: paused (the queue is
-- paused), unknown (handed back: no worker of this release knows its machine, version or
-- step), rate_limit (names a rate limit RATE_LIMITS lacks), executing (another worker's),
-- later (due later: a retry's back-off, a schedule, or deferred by the limiter — a weight
-- its bucket cannot hold, the limiter unreachable), runnable (due now, not claimed in time).
-- Params: q text[] (the worker's queues), rates text[] (configured rate limit names).
-- Reads the live rows of those queues once, at exit: never on a hot path.
SELECT g.queue,
       CASE WHEN p.queue IS NOT NULL THEN 'paused'
            WHEN g.unknown_since IS NOT NULL THEN 'unknown'
            WHEN g.status = 'executing' THEN 'executing'
            WHEN g.rate_limit IS NOT NULL AND split_part(g.rate_limit, ':', 1) <> ALL (%(rates)s::text[]) THEN 'rate_limit'
            WHEN g.eligible_at > now() THEN 'later'
            ELSE 'runnable' END AS why,
       count(*), min(g.id)
FROM gen_durable g
LEFT JOIN gen_durable_queue_pauses p ON p.queue = g.queue
WHERE g.queue = ANY (%(q)s::text[]) AND g.status IN ('runnable', 'executing')
GROUP BY 1, 2
ORDER BY 1, 2
