-- spawn_park: set each spawning parent's join counter to the children that landed.
-- Contract: docs/design.md#children.
-- Params: id bigint[] (parents flush.sql just parked in awaiting_children), n int[].
-- Runs in the flush transaction after the children's insert_all.sql: the parent row
-- has been locked by flush.sql since the start of the transaction, so the reaper
-- (SKIP LOCKED) cannot take it between spawn and park, and the children become
-- visible only with the parked parent.
UPDATE gen_durable g
SET children_pending = c.n,
    status = CASE WHEN c.n = 0 THEN 'runnable' ELSE g.status END,
    eligible_at = now(),
    updated_at = now()
FROM unnest(%(id)s::bigint[], %(n)s::int[]) AS c(id, n)
WHERE g.id = c.id AND g.status = 'awaiting_children'
RETURNING g.id, g.status::text, g.queue
