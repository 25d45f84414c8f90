-- heartbeat: extend the lease of every row this worker holds (running or buffered).
-- Contract: docs/design.md#leases. Statements: 1 per queue per tick.
-- Params: ids bigint[], worker text, ttl float8 (seconds).
-- Guard: locked_by = worker AND status = 'executing'. Locks in id order, SKIP LOCKED:
-- a row held by a flush or a wake is skipped this tick, never waited on.
-- Index: primary key, one probe per id. The status to match comes from the materialized
-- input, as in flush.sql: written as status = 'executing' it lets the planner walk
-- gen_durable_lease — every worker's executing rows and the dead entries a drain leaves
-- there until a vacuum — for the few ids of one worker (tests/plans).
WITH input AS MATERIALIZED (
    SELECT i.id, 'executing'::gen_durable_status AS claimed FROM unnest(%(ids)s::bigint[]) AS i(id)
), owned AS (
    SELECT g.id FROM input i
    JOIN gen_durable g ON g.id = i.id AND g.status = i.claimed
    WHERE g.locked_by = %(worker)s
    ORDER BY g.id
    FOR NO KEY UPDATE OF g SKIP LOCKED
)
UPDATE gen_durable g
SET lease_expires_at = now() + make_interval(secs => %(ttl)s::float8)
FROM owned
WHERE g.id = owned.id
RETURNING g.id
