-- resume_queue: unpause a queue (gd.resume_queue) and wake its schedulers on commit.
-- Params: queue text. Returns a row when the queue was paused.
WITH gone AS (
    DELETE FROM gen_durable_queue_pauses WHERE queue = %(queue)s::text RETURNING queue
)
SELECT queue, pg_notify('gen_durable', queue) IS NULL FROM gone
