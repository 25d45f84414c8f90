-- schedules_advance: move a locked schedule (schedules_due.sql) to its next tick, recording
-- the tick it fired (tick NULL: it skipped the missed ones), in the transaction that
-- inserted the instance. Params: name text, next_run_at timestamptz, tick timestamptz|NULL,
-- instance bigint|NULL, error text|NULL. Index: primary key.
UPDATE gen_durable_schedules
SET next_run_at = %(next_run_at)s,
    last_tick_at = COALESCE(%(tick)s, last_tick_at),
    last_run_at = CASE WHEN %(tick)s::timestamptz IS NULL THEN last_run_at ELSE now() END,
    last_instance_id = CASE WHEN %(tick)s::timestamptz IS NULL THEN last_instance_id ELSE %(instance)s END,
    last_error = %(error)s,
    updated_at = now()
WHERE name = %(name)s
