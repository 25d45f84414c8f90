-- schedules_sync: make one row per configured schedule (worker start-up).
-- Params (parallel arrays): name text[], cron text[], timezone text[],
--   next_run_at timestamptz[] (the first tick after now, computed from the database's now()).
-- A new schedule starts at its next tick (never fires for the past). An existing row keeps
-- its next_run_at — missed ticks then follow the schedule's catch-up policy — unless its
-- cron or timezone changed, which re-plans it from now. Idempotent: every process runs it.
INSERT INTO gen_durable_schedules AS s (name, cron, timezone, next_run_at)
SELECT * FROM unnest(%(name)s::text[], %(cron)s::text[], %(timezone)s::text[], %(next_run_at)s::timestamptz[])
ORDER BY 1
ON CONFLICT (name) DO UPDATE
SET cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, next_run_at = EXCLUDED.next_run_at,
    last_error = NULL, updated_at = now()
WHERE (s.cron, s.timezone) IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone)
