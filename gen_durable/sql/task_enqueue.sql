-- task_enqueue: insert Django tasks (gen_durable.tasks) — one or a batch, one statement.
-- Params: parallel arrays of equal length: fsm text[] (the task's function path),
--   state text[] (JSON {"args": [...], "kwargs": {...}}), queue text[], priority int[]
--   (gen_durable's scale: smaller runs sooner), at timestamptz[] (run_after, NULL = now).
-- A task row starts its attempt_log as '[]': the flush appends one record per
--   finished attempt, the reaper one per lost attempt. Tasks carry no correlation,
--   concurrency or rate key, so no arbiter and no conflict.
-- Returns id and inserted_at (enqueued_at) per row; ids ascend in input order (rows
--   go in by position). Due rows notify their queue on commit, later rows the timer,
--   as insert.sql does.
WITH ins AS (
    INSERT INTO gen_durable (fsm, step, state, queue, priority, eligible_at, attempt_log)
    SELECT r.fsm, 'run', r.state::jsonb, r.queue, r.priority, COALESCE(r.at, now()), '[]'::jsonb
    FROM unnest(%(fsm)s::text[], %(state)s::text[], %(queue)s::text[], %(priority)s::int[],
                %(at)s::timestamptz[]) WITH ORDINALITY AS r(fsm, state, queue, priority, at, ord)
    ORDER BY r.ord
    RETURNING id, queue, eligible_at <= now() AS due, inserted_at
), wake AS (
    -- Due rows wake their queue; rows for later (run_after) wake every worker's timer,
    -- which re-reads its next deadline (as insert.sql does).
    SELECT pg_notify(CASE WHEN due THEN 'gen_durable' ELSE 'gen_durable_timer' END, queue)
    FROM (SELECT DISTINCT queue, due FROM ins) q
)
SELECT ins.id, ins.inserted_at
FROM ins CROSS JOIN (SELECT count(*) FROM wake) w
ORDER BY ins.id
