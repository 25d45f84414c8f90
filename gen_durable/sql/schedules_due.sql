-- schedules_due: lock the configured schedules whose next tick has come (inside the
-- transaction that fires them). Params: names text[].
-- Locks: FOR UPDATE SKIP LOCKED in name order — a schedule another process is firing is
--   skipped, and once it commits its next_run_at is in the future, so the re-checked
--   predicate excludes it: a tick fires once.
-- Index: primary key (a handful of rows).
SELECT name, next_run_at, now()
FROM gen_durable_schedules
WHERE name = ANY (%(names)s::text[]) AND next_run_at <= now()
ORDER BY name
FOR UPDATE SKIP LOCKED
