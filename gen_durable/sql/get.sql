-- get: one instance by id or by correlation key (live or not), as a snapshot.
-- Contract: docs/guide.md. Params: id bigint | NULL, key text | NULL.
-- Index: primary key or gen_durable_correlation_key (hash; every row with a key, whatever
-- its status: a finished or failed instance is found by its key too). A key inserted
-- with an empty correlation_scope is no address and is not found. Of several rows with
-- the key, the one holding it (correlation_guard set: in its scope, live by default)
-- comes first, then the newest.
SELECT id, fsm, fsm_version, step, status::text, state, result, last_error, attempt, queue,
       priority, correlation_key, awaits, parent_id, children_pending, eligible_at,
       inserted_at, updated_at, last_traceback
FROM gen_durable
WHERE id = %(id)s::bigint OR (correlation_key = %(key)s::text AND correlation_scope <> '{}')
ORDER BY correlation_guard IS NULL, id DESC
LIMIT 1
