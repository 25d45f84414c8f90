-- signal: deliver one signal — resolve the target, insert into its inbox, wake it.
-- Contract: docs/guide.md, docs/design.md#signals.
-- Params: id bigint | NULL, key text | NULL (a live correlation_guard), name text,
--   payload text (JSON), dedup_key text | NULL.
-- Index: primary key or gen_durable_correlation (target); the primary key of
--   gen_durable_signal_dedup (ON CONFLICT: a dedup key already delivered to this
--   instance, consumed or not, stores nothing). Statements: 1.
-- Dedup: a key is recorded once per instance (across names) and kept until the
--   instance is deleted; a deduplicated delivery inserts no inbox row and wakes
--   nothing (the CASE also requires the insert to have happened).
-- The wake matches the target by id ALONE and decides the flip in CASE, never in the
-- WHERE: it always takes the row lock, so racing a park it queues behind the park's
-- lock and re-evaluates the CASE against the committed parked row. A WHERE on status
-- would skip the not-yet-parked row without waiting — the lost wake-up.
-- The target is resolved under that same row lock (FOR NO KEY UPDATE, compatible with
-- the inbox FK's KEY SHARE): a delivery racing an outcome that finishes the instance
-- waits for it and re-checks the status, so it raises NoTarget instead of leaving an
-- orphan signal in a terminal row's inbox (which the outcome's purge could not see).
-- Returns one row when the target exists: (signal id | NULL when deduplicated,
-- status after delivery, queue, notified, fsm, fsm_version: the caller checks the name
-- against what that machine awaits); no row → NoTarget. A woken row notifies its queue.
WITH target AS (
    SELECT id, fsm, fsm_version FROM gen_durable
    WHERE (id = %(id)s::bigint OR correlation_guard = %(key)s::text)
      AND status NOT IN ('done', 'failed')
    LIMIT 1
    FOR NO KEY UPDATE
), dedup AS (
    INSERT INTO gen_durable_signal_dedup (target_id, dedup_key)
    SELECT id, %(dedup_key)s::text FROM target WHERE %(dedup_key)s::text IS NOT NULL
    ON CONFLICT DO NOTHING
    RETURNING target_id
), ins AS (
    INSERT INTO gen_durable_signals (target_id, name, payload, dedup_key)
    SELECT id, %(name)s::text, %(payload)s::jsonb, %(dedup_key)s::text FROM target
    WHERE %(dedup_key)s::text IS NULL OR EXISTS (SELECT 1 FROM dedup)
    ON CONFLICT (target_id, dedup_key) DO NOTHING
    RETURNING id, target_id
), wake AS (
    UPDATE gen_durable g
    SET status = CASE WHEN g.status = 'awaiting_signal' AND %(name)s::text = ANY (g.awaits)
                      AND EXISTS (SELECT 1 FROM ins)
                      THEN 'runnable'::gen_durable_status ELSE g.status END,
        eligible_at = CASE WHEN g.status = 'awaiting_signal' AND %(name)s::text = ANY (g.awaits)
                      AND EXISTS (SELECT 1 FROM ins)
                           THEN now() ELSE g.eligible_at END,
        await_deadline = CASE WHEN g.status = 'awaiting_signal' AND %(name)s::text = ANY (g.awaits)
                      AND EXISTS (SELECT 1 FROM ins)
                              THEN NULL ELSE g.await_deadline END,
        updated_at = CASE WHEN g.status = 'awaiting_signal' AND %(name)s::text = ANY (g.awaits)
                      AND EXISTS (SELECT 1 FROM ins)
                          THEN now() ELSE g.updated_at END
    FROM target t
    WHERE g.id = t.id
    RETURNING g.id, g.status, g.queue
)
SELECT (SELECT ins.id FROM ins), wake.status::text, wake.queue,
       (CASE WHEN wake.status = 'runnable' THEN pg_notify('gen_durable', wake.queue) END) IS NULL,
       target.fsm, target.fsm_version
FROM target LEFT JOIN wake ON wake.id = target.id
