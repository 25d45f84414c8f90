-- queue_paused: is this queue paused, and does it hold rows a worker that did not know
-- them handed back (hand_back.sql)? Read by each scheduler at most once a second
-- (Scheduler.paused). Params: queue text. Index: primary key of the (tiny) pause table;
-- gen_durable_unknown (empty outside a deploy) for the second column.
SELECT EXISTS (SELECT 1 FROM gen_durable_queue_pauses WHERE queue = %(queue)s::text),
       EXISTS (SELECT 1 FROM gen_durable WHERE queue = %(queue)s::text
               AND unknown_since IS NOT NULL AND status = 'runnable')
