-- insert: one instance, deduplicated by its correlation key.
-- Contract: docs/guide.md, docs/design.md#identity, #wake-ups, #one-clock.
-- Params: fsm text, fsm_version int, step text, state text (JSON), queue text,
--   priority int (smallint range), at timestamptz | NULL (explicit instant),
--   delay float8 (seconds from the database's now(), used when at is NULL),
--   concurrency_key text, rate_limit text, weight float8, correlation_key text,
--   scope text[] (statuses in which the key is reserved).
-- Index: gen_durable_correlation is the ON CONFLICT arbiter; a NULL guard never conflicts.
-- Returns: one row (id) when inserted, none when the key is occupied.
-- A due row notifies its queue on commit: pg_notify is transactional and Postgres
-- folds identical (channel, payload) pairs of one transaction into one. A row scheduled
-- for later notifies `gen_durable_timer` instead, so every worker's timer re-reads its
-- next deadline (docs/guide.md "Time").
WITH ins AS (
    INSERT INTO gen_durable (fsm, fsm_version, step, state, queue, priority, eligible_at,
                             concurrency_key, rate_limit, weight, correlation_key,
                             correlation_scope)
    VALUES (%(fsm)s, %(fsm_version)s, %(step)s, %(state)s::jsonb, %(queue)s, %(priority)s,
            COALESCE(%(at)s::timestamptz, now() + make_interval(secs => %(delay)s::float8)),
            %(concurrency_key)s, %(rate_limit)s, %(weight)s::float8, %(correlation_key)s,
            %(scope)s::text[]::gen_durable_status[])
    ON CONFLICT (correlation_guard) WHERE correlation_guard IS NOT NULL DO NOTHING
    RETURNING id, queue, eligible_at <= now() AS due
)
SELECT id, pg_notify(CASE WHEN due THEN 'gen_durable' ELSE 'gen_durable_timer' END, queue) IS NULL AS notified
FROM ins
