-- join_parents: count terminal children off their parents; wake a parent at zero.
-- Contract: docs/design.md#children.
-- Params: parent_id bigint[], n int[] (terminal children per parent in this flush).
-- Runs inside the flush transaction, after flush.sql, only for committed children.
-- Locks: parents are locked in id order first so two flushes never cross.
-- A woken parent notifies its queue on commit.
WITH d AS (
    SELECT * FROM unnest(%(parent_id)s::bigint[], %(n)s::int[]) AS d(id, n)
), locked AS (
    SELECT p.id FROM gen_durable p JOIN d ON p.id = d.id
    ORDER BY p.id
    FOR NO KEY UPDATE OF p
), upd AS (
    UPDATE gen_durable p
    SET children_pending = GREATEST(p.children_pending - d.n, 0),
        status = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - d.n <= 0
                      THEN 'runnable' ELSE p.status END,
        eligible_at = CASE WHEN p.status = 'awaiting_children' AND p.children_pending - d.n <= 0
                           THEN now() ELSE p.eligible_at END,
        -- An executing parent keeps its updated_at: it is the claim's time, which the
        -- admin's "running" column and the overview's longest-running step read.
        updated_at = CASE WHEN p.status = 'executing' THEN p.updated_at ELSE now() END
    FROM d JOIN locked l ON l.id = d.id
    -- A terminal parent (cancelled mid-join) is left alone: terminal rows are never
    -- updated again, so updated_at stays the termination instant GC ages it by.
    WHERE p.id = d.id AND p.status NOT IN ('done', 'failed')
    RETURNING p.id, p.status, p.queue
), wake AS (
    SELECT pg_notify('gen_durable', queue) FROM (SELECT DISTINCT queue FROM upd WHERE status = 'runnable') q
)
SELECT upd.id, upd.status::text, upd.queue FROM upd CROSS JOIN (SELECT count(*) FROM wake) w
