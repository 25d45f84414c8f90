-- release: hand claimed-but-unstarted rows back to runnable (shutdown, limiter denials).
-- Spec: SPEC §4.9, §5; behaviours LSE-06, PICK-12/14. No attempt bump.
-- Params: ids bigint[], worker text. Guard: locked_by = worker AND status = 'executing'.
WITH owned AS (
    SELECT id FROM gen_durable
    WHERE id = ANY (%(ids)s::bigint[]) AND locked_by = %(worker)s AND status = 'executing'
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE gen_durable g
SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
    concurrency_shard = NULL, updated_at = now()
FROM owned
WHERE g.id = owned.id
RETURNING g.id
