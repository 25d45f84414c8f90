-- queue_paused: is this queue paused? Read by each scheduler at most once a second
-- (Scheduler.paused). Params: queue text. Index: primary key of the (tiny) pause table.
SELECT EXISTS (SELECT 1 FROM gen_durable_queue_pauses WHERE queue = %(queue)s::text)
