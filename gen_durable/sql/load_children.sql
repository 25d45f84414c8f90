-- load_children: the children of a whole claimed batch, one statement per pick.
-- Contract: docs/design.md#pick (enrichment), docs/design.md#children.
-- Params: ids bigint[] (the claimed rows). Index: gen_durable_parent.
SELECT parent_id, id, fsm, status::text, state, result, last_error
FROM gen_durable
WHERE parent_id = ANY (%(ids)s::bigint[])
ORDER BY parent_id, id
