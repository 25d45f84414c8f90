-- cancel: fail a live instance now, with a reason.
-- Contract: docs/guide.md. Params: id bigint | NULL, key text | NULL, reason text.
-- A running step's late outcome is dropped by the flush guard: locked_by is cleared
-- here, and should a retry let the same worker claim the row again before that step
-- returns, the new claim has a new claim counter (pick.sql), which the late outcome's
-- does not match (flush.sql, docs/design.md#outcomes).
-- `awaits` is kept: a row cancelled while parked (or woken from an Await) is parked on
-- those names again by a later retry (retry.sql).
-- Like any terminal outcome it clears the inbox and counts off a joining parent
-- (waking it at zero, with a notification).
-- Returns the concurrency key, shard and claimant the row held, read under its lock (the latest
-- version), so the caller credits a held gate slot exactly once.
WITH target AS (
    SELECT id, concurrency_key, concurrency_shard, locked_by FROM gen_durable
    WHERE (id = %(id)s::bigint OR correlation_guard = %(key)s::text)
      AND status NOT IN ('done', 'failed')
    LIMIT 1
    FOR NO KEY UPDATE
), upd AS (
    UPDATE gen_durable g
    SET status = 'failed', last_error = %(reason)s::text, last_traceback = NULL, locked_by = NULL,
        lease_expires_at = NULL, concurrency_shard = NULL,
        await_deadline = NULL, updated_at = now()
    FROM target t
    WHERE g.id = t.id AND g.status NOT IN ('done', 'failed')
    RETURNING g.id, g.parent_id, t.concurrency_key, t.concurrency_shard, t.locked_by
), purged AS (
    DELETE FROM gen_durable_signals s USING upd WHERE s.target_id = upd.id RETURNING s.id
), parent AS (
    UPDATE gen_durable p
    SET children_pending = GREATEST(p.children_pending - 1, 0),
        status = CASE WHEN p.status = 'awaiting_children' AND p.children_pending <= 1
                      THEN 'runnable'::gen_durable_status ELSE p.status END,
        eligible_at = CASE WHEN p.status = 'awaiting_children' AND p.children_pending <= 1
                           THEN now() ELSE p.eligible_at END,
        -- An executing parent keeps its updated_at: it is the claim's time, which the
        -- admin's "running" column and the overview's longest-running step read.
        updated_at = CASE WHEN p.status = 'executing' THEN p.updated_at ELSE now() END
    FROM upd
    WHERE p.id = upd.parent_id AND p.status NOT IN ('done', 'failed')  -- terminal rows stay as they are
    RETURNING p.status, p.queue
)
SELECT upd.id,
       (SELECT count(pg_notify('gen_durable', parent.queue)) FROM parent WHERE parent.status = 'runnable'),
       (SELECT pg_notify('gen_durable_result', upd.id::text)) IS NULL,
       upd.concurrency_key, upd.concurrency_shard, upd.locked_by
FROM upd
