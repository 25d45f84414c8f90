-- insert_all: a batch of instances in one statement (also the children of
-- ScheduleChildren, inside the flush transaction).
-- Contract: docs/guide.md, docs/design.md#identity (ordered by key), docs/design.md#wake-ups.
-- Params: per column an array and a single value (db.batch_column): the array has one
--   element per row, or is NULL when every row has the same value, which then comes as
--   <column>_1 (parsing 100,000 copies of a machine name costs more than the insert's
--   index work). state is always an array. The text is static and the parameter count
--   fixed for any batch size: fsm text, fsm_version int, step text, state text (JSON),
--   queue text, priority int, at timestamptz, delay float8, concurrency_key text,
--   rate_limit text, weight float8, correlation_key text, scope text (comma-joined
--   statuses, enum labels hold no comma; NULL = the default live statuses, which skips
--   the per-row parse), parent_id bigint. The unnest calls sit in a select list, so
--   they run in lockstep (ProjectSet) and a NULL array — no rows — pads with NULLs:
--   COALESCE(array element, single value) reads either form. Unlike unnest(a, b, …)
--   in FROM, a select list streams its rows instead of storing them all first (a
--   100,000-row batch spilled that store to disk: ~3 per cent of the statement).
-- Rows arrive sorted by correlation_key (code-point order; calls.insert_rows sorts a
-- batch that has keys, stably, so input order holds within a key), and the insert reads
-- them in array order — one ProjectSet feeds it, the order Django's bulk_create
-- relies on for RETURNING too. So two batches racing on the same new keys meet in one
-- order on the unique index and conflict cleanly instead of deadlocking, and ids
-- ascend with input position within a key (calls.map_returned). An ORDER BY here
-- would sort every batch on disk past work_mem (a tenth of a 100k-row insert).
-- Index: gen_durable_correlation (arbiter). Returns the inserted rows only.
WITH input AS (
    SELECT r.state,
           COALESCE(r.fsm, %(fsm_1)s::text) AS fsm,
           COALESCE(r.fsm_version, %(fsm_version_1)s::int) AS fsm_version,
           COALESCE(r.step, %(step_1)s::text) AS step,
           COALESCE(r.queue, %(queue_1)s::text) AS queue,
           COALESCE(r.priority, %(priority_1)s::int) AS priority,
           COALESCE(r.at, %(at_1)s::timestamptz) AS at,
           COALESCE(r.delay, %(delay_1)s::float8) AS delay,
           COALESCE(r.concurrency_key, %(concurrency_key_1)s::text) AS concurrency_key,
           COALESCE(r.rate_limit, %(rate_limit_1)s::text) AS rate_limit,
           COALESCE(r.weight, %(weight_1)s::float8) AS weight,
           COALESCE(r.correlation_key, %(correlation_key_1)s::text) AS correlation_key,
           COALESCE(r.scope, %(scope_1)s::text) AS scope,
           COALESCE(r.parent_id, %(parent_id_1)s::bigint) AS parent_id
    FROM (SELECT unnest(%(state)s::text[]) AS state, unnest(%(fsm)s::text[]) AS fsm,
                 unnest(%(fsm_version)s::int[]) AS fsm_version, unnest(%(step)s::text[]) AS step,
                 unnest(%(queue)s::text[]) AS queue, unnest(%(priority)s::int[]) AS priority,
                 unnest(%(at)s::timestamptz[]) AS at, unnest(%(delay)s::float8[]) AS delay,
                 unnest(%(concurrency_key)s::text[]) AS concurrency_key,
                 unnest(%(rate_limit)s::text[]) AS rate_limit, unnest(%(weight)s::float8[]) AS weight,
                 unnest(%(correlation_key)s::text[]) AS correlation_key,
                 unnest(%(scope)s::text[]) AS scope, unnest(%(parent_id)s::bigint[]) AS parent_id) r
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
    ON CONFLICT (correlation_guard) WHERE correlation_guard IS NOT NULL DO NOTHING
    RETURNING id, correlation_key, queue, eligible_at <= now() AS due
), wake AS (
    -- Due rows wake their queue; rows scheduled for later re-arm the workers' timers.
    SELECT pg_notify(CASE WHEN due THEN 'gen_durable' ELSE 'gen_durable_timer' END, queue)
    FROM (SELECT DISTINCT queue, due FROM ins) q
)
SELECT ins.id, ins.correlation_key
FROM ins CROSS JOIN (SELECT count(*) FROM wake) w
