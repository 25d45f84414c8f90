-- history_gc_cap: keep at most `cap` timeline entries per instance (HISTORY['MAX_PER_INSTANCE']).
-- Contract: docs/design.md#history.
-- Params: after bigint (the last id a previous pass read; NULL: from the oldest entry,
--   so a GC process's first pass also trims what was written before it started or
--   before MAX_PER_INSTANCE was lowered), batch int, cap int.
-- Reads the next `batch` entries after `after` (primary key); only an instance with
--   an entry written since the last pass can have gone over the cap. For each of their
--   instances, the entries older than its newest `cap` (gen_durable_history_instance,
--   read backwards) go, at most `batch` per statement.
-- Returns (the last id read or NULL, entries read, entries deleted): the caller moves
--   `after` on unless the delete was full (then the same window again).
-- Locks: the delete takes rows in id order (a sorted id array on the primary key), so
--   passes in several processes wait for each other at worst, never deadlock.
WITH seen AS (
    SELECT id, instance_id FROM gen_durable_history
    WHERE id > COALESCE(%(after)s::bigint, 0)
    ORDER BY id LIMIT %(batch)s
), excess AS (
    SELECT x.id
    FROM (SELECT DISTINCT instance_id FROM seen) s
    CROSS JOIN LATERAL (SELECT h.id FROM gen_durable_history h WHERE h.instance_id = s.instance_id
                        ORDER BY h.id DESC OFFSET %(cap)s) x
    LIMIT %(batch)s
), gone AS (
    DELETE FROM gen_durable_history WHERE id = ANY (ARRAY(SELECT id FROM excess ORDER BY id))
    RETURNING 1
)
SELECT (SELECT max(id) FROM seen), (SELECT count(*) FROM seen), (SELECT count(*) FROM gone)
