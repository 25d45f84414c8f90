-- gc_delete: delete terminal rows by id (a second statement after gc_select.sql).
-- Contract: docs/design.md#gc — `id = ANY($ids)` rides the primary key
--   (cost tracks the batch); `id IN (subquery)` would sequentially scan the table.
-- Params: ids bigint[] (rows gc_select.sql locked in this transaction). Signals cascade;
--   children's parent_id is set NULL (FKs) — rows gc_children.sql locked already.
DELETE FROM gen_durable
WHERE id = ANY (%(ids)s::bigint[]) AND status IN ('done', 'failed')
