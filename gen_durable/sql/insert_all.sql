-- insert_all: a batch of instances in one statement (also the children of
-- ScheduleChildren, inside the flush transaction).
-- Contract: docs/guide.md, docs/design.md#identity (ordered by key), docs/design.md#wake-ups.
-- Params: parallel arrays of equal length, so the text is static and the parameter
--   count is fixed for any batch size: fsm text[], fsm_version int[], step text[],
--   state text[] (JSON), queue text[], priority int[], at timestamptz[], delay float8[],
--   concurrency_key text[], rate_limit text[], weight float8[], correlation_key text[],
--   scope text[] (comma-joined statuses, enum labels hold no comma; NULL = the default
--   live statuses, which skips the per-row parse), parent_id bigint[],
--   ord int[] (input position).
-- Rows go in ORDER BY correlation_key: two batches racing on the same new keys then
-- meet in one order on the unique index and conflict cleanly instead of deadlocking.
-- Index: gen_durable_correlation (arbiter). Returns the inserted rows only.
WITH input AS (
    SELECT *
    FROM unnest(%(fsm)s::text[], %(fsm_version)s::int[], %(step)s::text[], %(state)s::text[],
                %(queue)s::text[], %(priority)s::int[], %(at)s::timestamptz[], %(delay)s::float8[],
                %(concurrency_key)s::text[], %(rate_limit)s::text[], %(weight)s::float8[],
                %(correlation_key)s::text[], %(scope)s::text[], %(parent_id)s::bigint[],
                %(ord)s::int[])
         AS r(fsm, fsm_version, step, state, queue, priority, at, delay, concurrency_key,
              rate_limit, weight, correlation_key, scope, parent_id, ord)
), ins AS (
    INSERT INTO gen_durable (fsm, fsm_version, step, state, queue, priority, eligible_at,
                             concurrency_key, rate_limit, weight, correlation_key,
                             correlation_scope, parent_id)
    SELECT fsm, fsm_version, step, state::jsonb, queue, priority,
           COALESCE(at, now() + make_interval(secs => delay)),
           concurrency_key, rate_limit, weight, correlation_key,
           CASE WHEN scope IS NULL
                THEN '{runnable,executing,awaiting_signal,awaiting_children}'::gen_durable_status[]
                ELSE string_to_array(scope, ',')::gen_durable_status[] END,
           parent_id
    FROM input
    ORDER BY correlation_key, ord
    ON CONFLICT (correlation_guard) WHERE correlation_guard IS NOT NULL DO NOTHING
    RETURNING id, correlation_key, parent_id, queue, eligible_at <= now() AS due
), wake AS (
    -- Due rows wake their queue; rows scheduled for later re-arm the workers' timers.
    SELECT pg_notify(CASE WHEN due THEN 'gen_durable' ELSE 'gen_durable_timer' END, queue)
    FROM (SELECT DISTINCT queue, due FROM ins) q
)
SELECT ins.id, ins.correlation_key, ins.parent_id
FROM ins CROSS JOIN (SELECT count(*) FROM wake) w
