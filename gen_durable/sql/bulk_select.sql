-- bulk_select: the next batch of ids matching an operator's filter (gd.cancel_where,
-- gd.retry_where, gd.move_where; manage.py durable_bulk), in id order after `after`.
-- Params: after bigint (0 at the start), window bigint (ids after `after` looked at),
-- statuses gen_durable_status[] | NULL, queue text | NULL, fsm text | NULL, batch int.
-- NULL filters match everything.
-- Index: primary key — a range of at most `window` ids per call, however few rows match
-- (a filter on status alone would let the planner read the whole table for every batch).
-- Locks nothing: each row is then changed by its own guarded statement, which skips a
-- row that moved on meanwhile.
SELECT id FROM gen_durable
WHERE id > %(after)s::bigint AND id <= %(after)s::bigint + %(window)s::bigint
  AND (%(statuses)s::gen_durable_status[] IS NULL OR status = ANY (%(statuses)s::gen_durable_status[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(fsm)s::text IS NULL OR fsm = %(fsm)s::text)
ORDER BY id
LIMIT %(batch)s::int
