-- expire_awaits: wake parked rows whose Await timeout passed (awaited == [] then).
-- Contract: docs/design.md#signals (resolution: about a second — the per-process timer,
-- worker/timers.py, runs it at the next deadline; the reaper pass runs it too, as a backstop).
-- Params: force bool (testing.fire_timeouts: fire every armed deadline now), limit int.
-- Index: gen_durable_await_deadline. Keeps awaits and attempt. Locks: id order, SKIP LOCKED.
WITH due AS (
    SELECT id,
           CASE WHEN correlation_guard IS NULL AND 'runnable' = ANY (correlation_scope)
                THEN correlation_key END AS entering_key
    FROM gen_durable
    WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL
      AND (await_deadline <= now() OR %(force)s::bool)
      -- Skip (and leave waiting) a row whose key another row holds while runnable:
      -- its move would collide in the unique correlation index (docs/design.md#isolation).
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN gen_durable.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (gen_durable.correlation_scope)
                                                       THEN gen_durable.correlation_key END)
    ORDER BY id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), due_first AS (
    -- Of two rows of this batch entering the scope of one key, only the lower id moves.
    SELECT * FROM (SELECT x.*, row_number() OVER (
                       PARTITION BY CASE WHEN x.entering_key IS NULL THEN 'id:' || x.id
                                         ELSE 'key:' || x.entering_key END
                       ORDER BY x.id) AS rk
                   FROM due x) y
    WHERE rk = 1
), upd AS (
    UPDATE gen_durable g
    SET status = 'runnable', eligible_at = now(), await_deadline = NULL, updated_at = now()
    FROM due_first due
    WHERE g.id = due.id
    RETURNING g.id, g.queue
), wake AS (
    SELECT pg_notify('gen_durable', queue) FROM (SELECT DISTINCT queue FROM upd) q
)
SELECT upd.id, upd.queue FROM upd CROSS JOIN (SELECT count(*) FROM wake) w
