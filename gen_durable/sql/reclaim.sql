-- reclaim: at start-up, hand back a dead predecessor's claims on this host and queue.
-- Contract: docs/design.md#leases.
-- Params: queue text, prefix text (worker-id prefix), margin float8 (seconds),
--   history bool (HISTORY on: each handed-back attempt, counted or not, gets its timeline
--   entry, outcome 'lost' with the text of last_error, in this statement, as reap.sql
--   does — docs/design.md#history).
--   Host-level prefix, margin LEASE_TTL - 2 x HEARTBEAT_INTERVAL: a live owner
--   heartbeats, so its leases stay above the margin; only claims not renewed for two
--   intervals are taken. A dead process's own prefix (`--processes N` restarting a
--   child that died: its pid is known dead) with a margin past any lease: all of them.
-- The predecessor died holding the row, maybe inside its step. Which of its running
--   steps killed it is not known from one crash, so a bystander is not charged: the
--   attempt counts (a step that kills its process reaches max_attempts) when the row was
--   the dead worker's only one in this batch, or when its last_error says a worker
--   already died under this same step (it was running at the crash before too: the
--   culprit, present at every crash); otherwise attempt stays and last_error says it
--   was not counted. A counted attempt of a row that keeps an attempt_log (a Django
--   task) is recorded as LeaseExpired, as reap.sql does. Returns the key and shard each row held, for the
--   gate-slot credit.
-- starts_with() is a literal prefix test (LIKE would treat percent signs and underscores in names as patterns).
-- Index: gen_durable_lease. Locks: id order, SKIP LOCKED.
WITH stale AS (
    SELECT id, concurrency_key, concurrency_shard, locked_by,
           CASE WHEN correlation_guard IS NULL AND 'runnable' = ANY (correlation_scope)
                THEN correlation_key END AS entering_key
    FROM gen_durable
    WHERE status = 'executing' AND queue = %(queue)s
      AND starts_with(locked_by, %(prefix)s)
      AND lease_expires_at < now() + make_interval(secs => %(margin)s::float8)
      -- Skip (and leave waiting) a row whose key another row holds while runnable:
      -- its move would collide in the unique correlation index (docs/design.md#isolation).
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN gen_durable.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (gen_durable.correlation_scope)
                                                       THEN gen_durable.correlation_key END)
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
), stale_first AS (
    -- Of two rows of this batch entering the scope of one key, only the lower id moves.
    SELECT * FROM (SELECT x.*, row_number() OVER (
                       PARTITION BY CASE WHEN x.entering_key IS NULL THEN 'id:' || x.id
                                         ELSE 'key:' || x.entering_key END
                       ORDER BY x.id) AS rk,
                          count(*) OVER (PARTITION BY x.locked_by) AS crowd
                   FROM stale x) y
    WHERE rk = 1
), charged AS (
    SELECT s.*, g.step, g.attempt, g.updated_at AS claimed_at, (s.crowd = 1 OR COALESCE(g.last_error, '') LIKE 'the worker died%%during step ' || g.step || ' (%%') AS counted
    FROM stale_first s JOIN gen_durable g ON g.id = s.id
), upd AS (
    UPDATE gen_durable g
    SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
        concurrency_shard = NULL, attempt = g.attempt + stale.counted::int, eligible_at = now(),
        last_error = CASE WHEN stale.counted THEN
                         format('the worker died during step %%s (attempt %%s%%s); reclaimed at start-up', g.step,
                                g.attempt, CASE WHEN stale.crowd > 1 THEN format(
                                    ': it was running at the crash before too, beside %%s other step(s) now',
                                    stale.crowd - 1) ELSE '' END)
                     ELSE format('the worker died during step %%s (attempt %%s not counted: %%s other step(s) ran '
                                 'beside it, and a crash is charged to a row running at two in a row); '
                                 'reclaimed at start-up', g.step, g.attempt, stale.crowd - 1) END,
        last_traceback = NULL,  -- no traceback: the attempt ended without an exception
        updated_at = now(),
        attempt_log = CASE WHEN g.attempt_log IS NULL OR NOT stale.counted THEN g.attempt_log
                           ELSE g.attempt_log || jsonb_build_array(jsonb_build_object(
                                'worker_id', g.locked_by, 'started_at', g.updated_at,
                                'error', jsonb_build_object(
                                    'exception_class_path', 'gen_durable.exceptions.LeaseExpired',
                                    'traceback', 'gen_durable.exceptions.LeaseExpired: ' || g.locked_by
                                        || ' died before the attempt recorded an outcome (reclaimed at '
                                        || 'start-up by a worker on the same host)'))) END
    FROM charged stale
    WHERE g.id = stale.id
    RETURNING g.id, stale.concurrency_key, stale.concurrency_shard, stale.locked_by, g.last_error
), lost AS (
    -- The attempt the dead worker held, from its claim (or the end of the instance's
    -- newest entry, for a link of an inline chain: updated_at stays at the chain's claim).
    INSERT INTO gen_durable_history (instance_id, attempt, step, outcome, error, worker, started_at, finished_at)
    SELECT x.id, x.attempt, x.step, 'lost', upd.last_error, x.locked_by,
           GREATEST(x.claimed_at, (SELECT h.finished_at FROM gen_durable_history h WHERE h.instance_id = x.id
                                   ORDER BY h.id DESC LIMIT 1)), now()
    FROM upd JOIN charged x ON x.id = upd.id
    WHERE %(history)s::bool
)
SELECT id, concurrency_key, concurrency_shard, locked_by FROM upd
