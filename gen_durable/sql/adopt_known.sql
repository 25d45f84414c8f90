-- adopt_known: make rows another worker handed back (hand_back.sql) runnable again when
-- this worker knows their (machine, version, step); its next pick claims them.
-- Contract: docs/guide.md#deploying. Params: queue text, fsms text[], versions int[],
--   steps text[] (the worker's registry, one element per known step), limit int.
-- Index: gen_durable_unknown (queue, fsm, fsm_version) WHERE unknown_since IS NOT
--   NULL AND status = 'runnable' — only such rows, none outside a deploy.
-- eligible_at := unknown_since: the row goes back to about its place in the queue.
-- Locks: FOR NO KEY UPDATE SKIP LOCKED, id order; never waits.
WITH known AS (
    SELECT * FROM unnest(%(fsms)s::text[], %(versions)s::int[], %(steps)s::text[]) AS k(fsm, fsm_version, step)
), waiting AS (
    SELECT g.id FROM gen_durable g
    JOIN known k ON g.fsm = k.fsm AND g.fsm_version = k.fsm_version AND g.step = k.step
    WHERE g.queue = %(queue)s AND g.unknown_since IS NOT NULL AND g.status = 'runnable'
    ORDER BY g.id
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF g SKIP LOCKED
)
UPDATE gen_durable g
SET eligible_at = LEAST(g.unknown_since, now()), unknown_since = NULL
FROM waiting w
WHERE g.id = w.id
RETURNING g.id
