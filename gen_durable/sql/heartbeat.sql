-- heartbeat: extend the lease of every row this worker holds (running or buffered).
-- Contract: docs/design.md#leases. Statements: 1 per queue per tick.
-- Params: ids bigint[], worker text, ttl float8 (seconds).
-- Guard: locked_by = worker AND status = 'executing'. Locks in id order, SKIP LOCKED:
-- a row held by a flush or a wake is skipped this tick, never waited on.
WITH owned AS (
    SELECT id FROM gen_durable
    WHERE id = ANY (%(ids)s::bigint[]) AND locked_by = %(worker)s AND status = 'executing'
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE gen_durable g
SET lease_expires_at = now() + make_interval(secs => %(ttl)s::float8)
FROM owned
WHERE g.id = owned.id
RETURNING g.id
