-- gc_select: lock and return ids of terminal rows past retention, at most `batch`, each
-- with whether any row names it as parent.
-- Contract: docs/design.md#gc.
-- Params: retention float8 (seconds), batch int.
-- Index: gen_durable_gc (updated_at) WHERE status IN ('done', 'failed') — terminal rows
--   are never updated again, so updated_at is the termination instant; the child probe
--   rides gen_durable_parent.
-- A child whose parent is still live is spared (the parent reads it on the join).
-- Locks: FOR UPDATE SKIP LOCKED, in one transaction with gc_children.sql and
--   gc_delete.sql: passes in any number of processes take disjoint batches and never
--   wait (docs/reliability.md "Deadlocks").
SELECT g.id, EXISTS (SELECT 1 FROM gen_durable c WHERE c.parent_id = g.id)
FROM gen_durable g
WHERE g.status IN ('done', 'failed')
  AND g.updated_at < now() - make_interval(secs => %(retention)s::float8)
  AND NOT EXISTS (SELECT 1 FROM gen_durable p
                  WHERE p.id = g.parent_id AND p.status NOT IN ('done', 'failed'))
LIMIT %(batch)s
FOR UPDATE OF g SKIP LOCKED
