-- schedules_list: the stored state of the given schedules (admin overview).
-- Params: names text[]. Index: primary key.
SELECT name, cron, timezone, next_run_at, last_tick_at, last_run_at, last_instance_id, last_error
FROM gen_durable_schedules
WHERE name = ANY (%(names)s::text[])
ORDER BY name
