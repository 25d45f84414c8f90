-- get: one instance by id or by live correlation key, as a snapshot.
-- Contract: docs/guide.md. Params: id bigint | NULL, key text | NULL.
-- Index: primary key or gen_durable_correlation.
SELECT id, fsm, fsm_version, step, status::text, state, result, last_error, attempt, queue,
       priority, correlation_key, awaits, parent_id, children_pending, eligible_at,
       inserted_at, updated_at
FROM gen_durable
WHERE id = %(id)s::bigint OR correlation_guard = %(key)s::text
ORDER BY id DESC
LIMIT 1
