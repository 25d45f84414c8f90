-- reap: return rows whose lease expired to runnable, attempt + 1.
-- The worker died, was killed or stalled inside the step: last_error says so, and the
-- attempt counts, so a step that kills its own process reaches its machine's max_attempts
-- (the executor fails a row claimed at attempt >= max_attempts without running it).
-- Contract: docs/design.md#leases, docs/design.md#decisions (clear the shard too).
-- Params: limit int (rows per statement; the reaper loops while a batch fills),
--   history bool (HISTORY on: each lost attempt gets its timeline entry, outcome
--   'lost', in this statement — docs/design.md#history).
-- Index: gen_durable_lease (lease_expires_at) WHERE status = 'executing' — cost tracks
--   the expired set, not the table. Locks: id order, SKIP LOCKED (several reapers may
--   run at once; no leader election). Reaped queues are notified on commit.
-- Returns the key, shard and claimant each row held (the locked version), so the caller
--   credits the gate slot in the same transaction (Redis: the claimant's slot only).
WITH expired AS (
    SELECT id, concurrency_key, concurrency_shard, locked_by, step, attempt, updated_at AS claimed_at,
           CASE WHEN correlation_guard IS NULL AND 'runnable' = ANY (correlation_scope)
                THEN correlation_key END AS entering_key
    FROM gen_durable
    WHERE status = 'executing' AND lease_expires_at < now()
      -- Skip (and leave waiting) a row whose key another row holds while runnable:
      -- its move would collide in the unique correlation index (docs/design.md#isolation).
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN gen_durable.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (gen_durable.correlation_scope)
                                                       THEN gen_durable.correlation_key END)
    ORDER BY id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), expired_first AS (
    -- Of two rows of this batch entering the scope of one key, only the lower id moves.
    SELECT * FROM (SELECT x.*, row_number() OVER (
                       PARTITION BY CASE WHEN x.entering_key IS NULL THEN 'id:' || x.id
                                         ELSE 'key:' || x.entering_key END
                       ORDER BY x.id) AS rk
                   FROM expired x) y
    WHERE rk = 1
), upd AS (
    UPDATE gen_durable g
    SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
        concurrency_shard = NULL, attempt = g.attempt + 1, eligible_at = now(),
        last_error = format('the worker died or lost its lease during step %%s (attempt %%s)',
                            g.step, g.attempt),
        last_traceback = NULL,  -- no traceback: the attempt ended without an exception
        updated_at = now(),
        -- A row that keeps an attempt_log (Django tasks) records the lost attempt too.
        attempt_log = CASE WHEN g.attempt_log IS NULL THEN NULL
                           ELSE g.attempt_log || jsonb_build_array(jsonb_build_object(
                                'worker_id', g.locked_by, 'started_at', g.updated_at,
                                'error', jsonb_build_object(
                                    'exception_class_path', 'gen_durable.exceptions.LeaseExpired',
                                    'traceback', 'gen_durable.exceptions.LeaseExpired: the lease of '
                                        || g.locked_by || ' expired before the attempt recorded an '
                                        || 'outcome (the worker died or stalled)'))) END
    FROM expired_first expired
    WHERE g.id = expired.id
    RETURNING g.id, g.queue, expired.concurrency_key, expired.concurrency_shard, expired.locked_by
), lost AS (
    -- The lost attempt, from its claim (updated_at) — or the end of the instance's newest
    -- entry, later for a link of an inline chain (updated_at stays at the chain's claim) —
    -- to now, with the text of last_error.
    INSERT INTO gen_durable_history (instance_id, attempt, step, outcome, error, worker, started_at, finished_at)
    SELECT x.id, x.attempt, x.step, 'lost',
           format('the worker died or lost its lease during step %%s (attempt %%s)', x.step, x.attempt),
           x.locked_by, GREATEST(x.claimed_at, (SELECT h.finished_at FROM gen_durable_history h
                                   WHERE h.instance_id = x.id ORDER BY h.id DESC LIMIT 1)), now()
    FROM upd JOIN expired_first x ON x.id = upd.id
    WHERE %(history)s::bool
), wake AS (
    SELECT pg_notify('gen_durable', queue) FROM (SELECT DISTINCT queue FROM upd) q
)
SELECT upd.id, upd.queue, upd.concurrency_key, upd.concurrency_shard, upd.locked_by FROM upd CROSS JOIN (SELECT count(*) FROM wake) w
