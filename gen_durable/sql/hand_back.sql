-- hand_back: return claimed rows this worker cannot run (their machine, version or step
-- is not in its registry: a rolling deploy) untouched, for a worker that knows them.
-- Contract: docs/guide.md#deploying, docs/design.md#leases. No attempt bump, last_error kept.
-- Params: ids bigint[], worker text. Guard: locked_by = worker AND status = 'executing'.
-- The row leaves the pick's range (eligible_at far in the future: no pick meets it again,
-- the pick never filters for it) and is marked `unknown_since`; adopt_known.sql, run by
-- a worker that knows it, restores eligible_at := unknown_since.
-- Collisions as in release.sql: a row whose key another row holds while runnable waits.
WITH owned AS (
    SELECT id,
           CASE WHEN correlation_guard IS NULL AND 'runnable' = ANY (correlation_scope)
                THEN correlation_key END AS entering_key
    FROM gen_durable
    WHERE id = ANY (%(ids)s::bigint[]) AND locked_by = %(worker)s AND status = 'executing'
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN gen_durable.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (gen_durable.correlation_scope)
                                                       THEN gen_durable.correlation_key END)
    ORDER BY id
    FOR NO KEY UPDATE SKIP LOCKED
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
