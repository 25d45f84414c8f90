-- load_signals: the inboxes of a whole claimed batch, one statement per pick.
-- Contract: docs/design.md#pick (enrichment), docs/design.md#signals.
-- Params: ids bigint[] (the claimed rows). Index: gen_durable_signals_target.
SELECT target_id, id, name, payload, inserted_at
FROM gen_durable_signals
WHERE target_id = ANY (%(ids)s::bigint[])
ORDER BY target_id, id
