-- load_signals: the inboxes of a whole claimed batch, one statement per pick.
-- Spec: SPEC §4.2 (enrichment), §4.4; behaviours PICK-15.
-- Params: ids bigint[] (the claimed rows). Index: gen_durable_signals_target.
SELECT target_id, id, name, payload, inserted_at
FROM gen_durable_signals
WHERE target_id = ANY (%(ids)s::bigint[])
ORDER BY target_id, id
