-- pause_queue: mark a queue paused (gd.pause_queue). Params: queue text.
-- Schedulers read the paused set at most once a second (queue_paused.sql), so every
-- worker stops claiming from the queue within about a second; rows already claimed
-- finish. Returns a row when the queue was not paused before.
INSERT INTO gen_durable_queue_pauses (queue) VALUES (%(queue)s::text)
ON CONFLICT (queue) DO NOTHING
RETURNING queue
