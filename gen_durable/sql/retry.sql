-- retry: make a failed, parked (awaiting a signal) or waiting runnable instance
-- runnable at its current step now (gd.retry; docs/guide.md "Operating").
-- Params: id bigint | NULL, key text | NULL (a live correlation_guard), step text | NULL
--   (resume at this step instead, with the committed state; the caller checked it is a
--   step of the row's machine; `awaits` is cleared: the new step awaited nothing).
-- A row a worker that did not know it handed back (unknown_since) loses the mark.
-- Index: primary key or gen_durable_correlation; the parent by primary key.
-- Attempt rule: a failed row starts a fresh count (attempt = 0, so a job gets its
-- whole max_attempts budget again); a live row keeps its attempt. last_error stays
-- as the record of what went wrong before. A parked row keeps `awaits` (like an
-- Await timeout: the step sees the matching inbox signals, or none).
-- A failed row that still has `awaits` — it failed parked on an Await (cancelled) or in
-- the step that Await woke (its timeout fired, or it stopped after the wake; the inbox
-- went with the failure) — is parked on those names again, without a deadline, at that
-- step: the next matching signal resumes it (re-running the step with no signal would
-- only fail again).
-- A failed child revived while its parent still waits on its children counts on the
-- join again (children_pending + 1): it was counted off when it failed.
-- A failed row whose correlation key another live instance now holds stays failed
-- (`blocked`); the unique index is the backstop for a race with an insert.
-- Returns one row when the target exists: (id, status before, retried bool, queue).
WITH target AS (
    SELECT id, status, correlation_key, correlation_scope FROM gen_durable
    WHERE id = %(id)s::bigint OR correlation_guard = %(key)s::text
    ORDER BY id DESC
    LIMIT 1
    FOR NO KEY UPDATE
), blocked AS (
    SELECT 1 FROM target t
    WHERE t.status = 'failed' AND 'runnable' = ANY (t.correlation_scope)
      AND EXISTS (SELECT 1 FROM gen_durable x
                  WHERE x.correlation_guard = t.correlation_key AND x.id <> t.id)
), upd AS (
    UPDATE gen_durable g
    SET status = CASE WHEN %(step)s::text IS NULL AND t.status = 'failed' AND g.awaits IS NOT NULL
                      THEN 'awaiting_signal'::gen_durable_status ELSE 'runnable' END,
        step = COALESCE(%(step)s::text, g.step),
        awaits = CASE WHEN %(step)s::text IS NULL THEN g.awaits END,
        unknown_since = NULL,
        eligible_at = now(),
        attempt = CASE WHEN t.status = 'failed' THEN 0 ELSE g.attempt END,
        await_deadline = NULL,
        locked_by = NULL,
        lease_expires_at = NULL,
        concurrency_shard = NULL,
        updated_at = now()
    FROM target t
    WHERE g.id = t.id
      AND t.status IN ('failed', 'awaiting_signal', 'runnable')
      AND NOT EXISTS (SELECT 1 FROM blocked)
    RETURNING g.id, g.queue, g.parent_id, t.status AS was, g.status AS became
), parent AS (
    UPDATE gen_durable p
    SET children_pending = p.children_pending + 1, updated_at = now()
    FROM upd
    WHERE p.id = upd.parent_id AND upd.was = 'failed' AND p.status = 'awaiting_children'
    RETURNING p.id
)
SELECT t.id, t.status::text, upd.id IS NOT NULL, upd.queue,
       (SELECT count(*) FROM parent),
       (CASE WHEN upd.became = 'runnable' THEN pg_notify('gen_durable', upd.queue) END) IS NULL,
       EXISTS (SELECT 1 FROM blocked)
FROM target t LEFT JOIN upd ON upd.id = t.id
