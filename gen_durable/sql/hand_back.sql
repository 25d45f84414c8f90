-- hand_back: return claimed rows this worker cannot run (their machine, version or step
-- is not in its registry: a rolling deploy) untouched, for a worker that knows them.
-- Contract: docs/guide.md#deploying, docs/design.md#leases. No attempt bump, last_error kept.
-- Params: ids bigint[], claims bigint[] (each id's claim counter as pick.sql set it),
--   worker text. Guard: the claim AND locked_by = worker AND status = 'executing': a row
--   held back (locked at the first hand-back) and meanwhile cancelled, retried and claimed
--   again by this same worker is left to that newer claim — handing it back would make a
--   row runnable while its step runs (as release.sql).
-- The row leaves the pick's range (eligible_at far in the future: no pick meets it again,
-- the pick never filters for it) and is marked `unknown_since`; adopt_known.sql, run by
-- a worker that knows it, restores eligible_at := unknown_since.
-- Collisions as in release.sql: a row whose key another row holds while runnable waits.
-- Index: primary key, one probe per id (the input's status column: see heartbeat.sql).
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
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN g.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (g.correlation_scope)
                                                       THEN g.correlation_key END)
    ORDER BY g.id
    FOR NO KEY UPDATE OF g SKIP LOCKED
), owned_first AS (
    SELECT * FROM (SELECT x.*, row_number() OVER (
                       PARTITION BY CASE WHEN x.entering_key IS NULL THEN 'id:' || x.id
                                         ELSE 'key:' || x.entering_key END
                       ORDER BY x.id) AS rk
                   FROM owned x) y
    WHERE rk = 1
)
UPDATE gen_durable g
SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL,
    concurrency_shard = NULL, unknown_since = now(),
    eligible_at = '9999-01-01 00:00:00+00'::timestamptz, updated_at = now()
FROM owned_first owned
WHERE g.id = owned.id
RETURNING g.id
