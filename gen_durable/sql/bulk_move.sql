-- bulk_move: move a batch of instances to another queue (gd.move_where).
-- Params: ids bigint[], queue text (the target). Index: primary key.
-- Guard: not executing (a claimed row belongs to its queue's worker until its outcome
-- commits) and not done; a row already in the target queue is left alone. The target
-- queue's workers are woken (NOTIFY on commit) when a moved row is runnable.
-- Returns one row per moved instance: (id, notified).
WITH upd AS (
    UPDATE gen_durable g
    SET queue = %(queue)s::text
    WHERE g.id = ANY (%(ids)s::bigint[]) AND g.status NOT IN ('executing', 'done')
      AND g.queue <> %(queue)s::text
    RETURNING g.id, g.status
)
SELECT upd.id, (CASE WHEN upd.status = 'runnable' THEN pg_notify('gen_durable', %(queue)s::text) END) IS NULL
FROM upd
