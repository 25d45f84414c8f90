-- gc_select: ids of terminal rows past retention, at most `batch`.
-- Spec: SPEC §4.10; seeds: performance §4b; behaviours GC-01/02.
-- Params: retention float8 (seconds), batch int.
-- Index: gen_durable_gc (updated_at) WHERE status IN ('done', 'failed') — terminal rows
--   are never updated again, so updated_at is the termination instant.
-- A child whose parent is still live is spared (the parent reads it on the join).
SELECT g.id
FROM gen_durable g
WHERE g.status IN ('done', 'failed')
  AND g.updated_at < now() - make_interval(secs => %(retention)s::float8)
  AND NOT EXISTS (SELECT 1 FROM gen_durable p
                  WHERE p.id = g.parent_id AND p.status NOT IN ('done', 'failed'))
LIMIT %(batch)s
