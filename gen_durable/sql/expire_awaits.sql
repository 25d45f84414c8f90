-- expire_awaits: wake parked rows whose Await timeout passed (awaited == [] then).
-- Spec: SPEC §4.4 (resolution: the reaper interval); behaviours SIG-09, TST-03.
-- Params: force bool (testing.fire_timeouts: fire every armed deadline now), limit int.
-- Index: gen_durable_await_deadline. Keeps awaits and attempt. Locks: id order, SKIP LOCKED.
WITH due AS (
    SELECT id FROM gen_durable
    WHERE status = 'awaiting_signal' AND await_deadline IS NOT NULL
      AND (await_deadline <= now() OR %(force)s::bool)
    ORDER BY id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), upd AS (
    UPDATE gen_durable g
    SET status = 'runnable', eligible_at = now(), await_deadline = NULL, updated_at = now()
    FROM due
    WHERE g.id = due.id
    RETURNING g.id, g.queue
), wake AS (
    SELECT pg_notify('gen_durable', queue) FROM (SELECT DISTINCT queue FROM upd) q
)
SELECT upd.id, upd.queue FROM upd CROSS JOIN (SELECT count(*) FROM wake) w
