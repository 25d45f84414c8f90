-- history_gc_age: delete the oldest timeline entries past HISTORY['RETENTION'], at most `batch`.
-- Contract: docs/design.md#history.
-- Params: retention float8 (seconds), batch int.
-- Index: the primary key from its start. Ids grow with finished_at (both are taken as
--   the entry is written), so the oldest `batch` entries are the first `batch` ids: a
--   pass reads `batch` index entries whatever the table's size, and deletes those of
--   them past retention. A full batch deleted is followed by another (maintenance.py).
-- Locks: SKIP LOCKED — passes in several processes take disjoint batches, never wait.
WITH head AS (
    SELECT id, finished_at FROM gen_durable_history ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
)
DELETE FROM gen_durable_history
WHERE id = ANY (ARRAY(SELECT id FROM head
                      WHERE finished_at < now() - make_interval(secs => %(retention)s::float8)))
