-- reclaim: at start-up, release a dead predecessor's claims on this host and queue.
-- Spec: SPEC §4.9; behaviours LSE-05. No attempt bump.
-- Params: queue text, prefix text (host-level worker prefix), margin float8 (seconds:
--   LEASE_TTL - 2 x HEARTBEAT_INTERVAL). A live owner heartbeats, so its leases stay
--   above the margin; only claims not renewed for two intervals are taken.
-- starts_with() is a literal prefix test (LIKE would treat percent signs and underscores in names as patterns).
-- Index: gen_durable_lease. Locks: id order, SKIP LOCKED.
WITH stale AS (
    SELECT id FROM gen_durable
    WHERE status = 'executing' AND queue = %(queue)s
      AND starts_with(locked_by, %(prefix)s)
      AND lease_expires_at < now() + make_interval(secs => %(margin)s::float8)
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
)
UPDATE gen_durable g
SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
    concurrency_shard = NULL, eligible_at = now(), updated_at = now()
FROM stale
WHERE g.id = stale.id
RETURNING g.id
