-- abandon: at shutdown, hand back the rows whose steps were still running after
-- DRAIN_TIMEOUT: runnable at once, attempt + 1 (the step was cut off; it counts towards
-- max_attempts like a worker that died in it), last_error says why.
-- Params: ids bigint[], worker text, drain float8 (seconds, for the message), history
--   bool (HISTORY on: each cut-off attempt gets its timeline entry, outcome
--   'abandoned', in this statement — docs/design.md#history).
-- A row that keeps an attempt_log (a Django task) records the cut-off attempt as an
--   error of class gen_durable.exceptions.WorkerShutdown, so its TaskResult counts the
--   attempt the engine counts (as reap.sql records LeaseExpired).
-- Guard: locked_by = worker AND status = 'executing' (an outcome that committed first
--   wins). Locks: id order, SKIP LOCKED — a row locked at that instant keeps its lease
--   and comes back through the reaper. Returns the key and shard each row held (the
--   locked version) for the gate-slot credit; the queues are notified on commit.
WITH owned AS (
    SELECT id, concurrency_key, concurrency_shard, step, attempt, updated_at AS claimed_at,
           CASE WHEN correlation_guard IS NULL AND 'runnable' = ANY (correlation_scope)
                THEN correlation_key END AS entering_key
    FROM gen_durable
    WHERE id = ANY (%(ids)s::bigint[]) AND locked_by = %(worker)s AND status = 'executing'
      -- Skip (and leave waiting) a row whose key another row holds while runnable:
      -- its move would collide in the unique correlation index (docs/design.md#isolation).
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN gen_durable.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (gen_durable.correlation_scope)
                                                       THEN gen_durable.correlation_key END)
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
), owned_first AS (
    -- Of two rows of this batch entering the scope of one key, only the lower id moves.
    SELECT * FROM (SELECT x.*, row_number() OVER (
                       PARTITION BY CASE WHEN x.entering_key IS NULL THEN 'id:' || x.id
                                         ELSE 'key:' || x.entering_key END
                       ORDER BY x.id) AS rk
                   FROM owned x) y
    WHERE rk = 1
), upd AS (
    UPDATE gen_durable g
    SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
        concurrency_shard = NULL, attempt = g.attempt + 1, eligible_at = now(),
        last_error = format('the worker shut down during step %%s (attempt %%s): still running after '
                            'DRAIN_TIMEOUT (%%s s)', g.step, g.attempt, %(drain)s::float8),
        last_traceback = NULL,  -- no traceback: the attempt ended without an exception
        updated_at = now(),
        attempt_log = CASE WHEN g.attempt_log IS NULL THEN NULL
                           ELSE g.attempt_log || jsonb_build_array(jsonb_build_object(
                                'worker_id', g.locked_by, 'started_at', g.updated_at,
                                'error', jsonb_build_object(
                                    'exception_class_path', 'gen_durable.exceptions.WorkerShutdown',
                                    'traceback', format('gen_durable.exceptions.WorkerShutdown: %%s shut down '
                                        'while the attempt still ran after DRAIN_TIMEOUT (%%s s); handed back',
                                        g.locked_by, %(drain)s::float8)))) END
    FROM owned_first owned
    WHERE g.id = owned.id
    RETURNING g.id, g.queue, owned.concurrency_key, owned.concurrency_shard
), cut AS (
    -- The cut-off attempt, from its claim (updated_at) — or the end of the instance's newest
    -- entry, later for a link of an inline chain (updated_at stays at the chain's claim) —
    -- to now, with the text of last_error.
    INSERT INTO gen_durable_history (instance_id, attempt, step, outcome, error, worker, started_at, finished_at)
    SELECT x.id, x.attempt, x.step, 'abandoned',
           format('the worker shut down during step %%s (attempt %%s): still running after '
                  'DRAIN_TIMEOUT (%%s s)', x.step, x.attempt, %(drain)s::float8),
           %(worker)s, GREATEST(x.claimed_at, (SELECT h.finished_at FROM gen_durable_history h
                                   WHERE h.instance_id = x.id ORDER BY h.id DESC LIMIT 1)), now()
    FROM upd JOIN owned_first x ON x.id = upd.id
    WHERE %(history)s::bool
), wake AS (
    SELECT pg_notify('gen_durable', queue) FROM (SELECT DISTINCT queue FROM upd) q
)
SELECT upd.id, upd.queue, upd.concurrency_key, upd.concurrency_shard FROM upd CROSS JOIN (SELECT count(*) FROM wake) w
