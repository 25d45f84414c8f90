-- paused_queues: the paused queues (gd.paused_queues, the admin overview). No params.
SELECT queue, paused_at FROM gen_durable_queue_pauses ORDER BY queue
