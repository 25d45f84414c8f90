-- defer: hand claimed rows the limiter denied back to runnable, later.
-- Params: ids bigint[], delay float8[] (seconds from now(), per row; NULL keeps the row's
--   eligible_at: a claimed row handed back unadmitted-but-unneeded), worker text.
-- eligible_at = now() + delay: when the row's bucket can next admit it (or its gate's
--   re-offer time), so a throttled backlog leaves the head of the queue and the rows
--   behind it are claimed at once. attempt and priority are kept; the shard is cleared.
-- Guard: locked_by = worker AND status = 'executing'. Locks: id order, waiting (not SKIP
--   LOCKED): these rows are ours, and one skipped here would stay executing until its
--   lease lapsed and come back with attempt + 1. Other lockers of an executing row (a
--   heartbeat, a signal's wake, a sweep's scan) hold it for one statement.
WITH d AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(delay)s::float8[]) AS d(id, delay)
), owned AS (
    SELECT g.id, d.delay FROM gen_durable g JOIN d ON g.id = d.id
    WHERE g.locked_by = %(worker)s AND g.status = 'executing'
      -- Skip (and leave waiting) a row whose key another row holds while runnable:
      -- its move would collide in the unique correlation index (docs/design.md#isolation).
      AND NOT EXISTS (SELECT 1 FROM gen_durable c
                      WHERE c.correlation_guard = CASE WHEN g.correlation_guard IS NULL
                                                            AND 'runnable' = ANY (g.correlation_scope)
                                                       THEN g.correlation_key END)
    ORDER BY g.id
    FOR NO KEY UPDATE OF g
)
UPDATE gen_durable g
SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL, concurrency_shard = NULL,
    eligible_at = CASE WHEN owned.delay IS NULL THEN g.eligible_at
                       ELSE now() + make_interval(secs => owned.delay) END,
    updated_at = now()
FROM owned
WHERE g.id = owned.id
RETURNING g.id
