-- release: hand claimed-but-unstarted rows back to runnable (shutdown, limiter denials).
-- Contract: docs/design.md#leases, docs/design.md#worker. No attempt bump.
-- Params: ids bigint[], claims bigint[] (each id's claim counter as pick.sql set it),
--   worker text. Guard: the claim AND locked_by = worker AND status = 'executing': a
--   buffered claim whose row was cancelled, retried and claimed again by this same worker
--   releases nothing (nor credits a slot) — the newer claim holds the row now
--   (docs/design.md#outcomes).
-- Index: primary key, one probe per (id, claim) of the input, whose status column keeps
-- the planner off gen_durable_lease (see heartbeat.sql; a (id, claim) IN (unnest …)
-- filter was re-scanned for every row: quadratic in the batch).
WITH input AS MATERIALIZED (
    SELECT i.id, i.claim, 'executing'::gen_durable_status AS claimed
    FROM unnest(%(ids)s::bigint[], %(claims)s::bigint[]) AS i(id, claim)
), owned AS (
    SELECT g.id,
           CASE WHEN g.correlation_guard IS NULL AND 'runnable' = ANY (g.correlation_scope)
                THEN g.correlation_key END AS entering_key
    FROM input i
    JOIN gen_durable g ON g.id = i.id AND g.claim = i.claim AND g.status = i.claimed
    WHERE g.locked_by = %(worker)s
      -- Skip (and leave waiting) a row whose key another row holds while runnable:
      -- its move would collide in the unique correlation index (docs/design.md#isolation).
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN g.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (g.correlation_scope)
                                                       THEN g.correlation_key END)
    ORDER BY g.id
    FOR NO KEY UPDATE OF g SKIP LOCKED
), owned_first AS (
    -- Of two rows of this batch entering the scope of one key, only the lower id moves.
    SELECT * FROM (SELECT x.*, row_number() OVER (
                       PARTITION BY CASE WHEN x.entering_key IS NULL THEN 'id:' || x.id
                                         ELSE 'key:' || x.entering_key END
                       ORDER BY x.id) AS rk
                   FROM owned x) y
    WHERE rk = 1
)
UPDATE gen_durable g
SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
    concurrency_shard = NULL, updated_at = now()
FROM owned_first owned
WHERE g.id = owned.id
RETURNING g.id
