-- bulk_next: the first id after `after` (gd.cancel_where, gd.retry_where, gd.move_where;
-- manage.py durable_bulk; the admin's "all matching"), read when a window of the bulk walk
-- matched nothing: the walk jumps over a gap in the id space (an old row, the rows after it
-- deleted) instead of reading it a window at a time.
-- Params: after bigint.
-- Index: primary key — one descent, whatever the gap. No filter on purpose: a filter would
-- make it read every non-matching row after `after` (unbounded); the next window applies it.
SELECT min(id) FROM gen_durable WHERE id > %(after)s::bigint
