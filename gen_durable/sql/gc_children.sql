-- gc_children: lock the children of a GC batch's parents (those outside the batch) and
-- return the parents with a child someone else holds: they stay for a later sweep.
-- Contract: docs/design.md#gc. Params: ids bigint[] (the parents of the batch, locked by gc_select.sql).
-- Why: deleting a parent rewrites its children (parent_id ON DELETE SET NULL). Taken
--   inside the DELETE, those row locks would wait on a child's flush or another GC pass
--   while they wait on us — a deadlock. Taken first, in id order and SKIP LOCKED, they
--   never wait; the DELETE then rewrites only rows this transaction holds.
-- Index: gen_durable_parent (parent_id), then the primary key.
WITH kids AS (
    SELECT c.id, c.parent_id FROM gen_durable c
    WHERE c.parent_id = ANY (%(ids)s::bigint[])
), locked AS (
    SELECT c.id FROM gen_durable c
    WHERE c.id IN (SELECT id FROM kids)
    ORDER BY c.id
    FOR NO KEY UPDATE SKIP LOCKED
)
SELECT DISTINCT k.parent_id FROM kids k
WHERE NOT EXISTS (SELECT 1 FROM locked l WHERE l.id = k.id)
