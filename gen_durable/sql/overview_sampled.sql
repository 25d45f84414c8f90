-- overview_sampled: rows awaiting a signal or children per queue in a sample of the
-- table read now (admin overview, when the planner's statistics are missing or stale:
-- no index holds every such row). Params: percent float8 (of the table's pages; the
-- overview asks for at most 1,000 pages — 100 reads a small table whole, exactly).
-- Scan: TABLESAMPLE SYSTEM reads whole random pages, so the work is bounded by the
-- pages asked for, not by the table. Returns (queue, status, n in the sample).
SELECT queue, status::text, count(*)
FROM gen_durable TABLESAMPLE SYSTEM (%(percent)s::float8)
WHERE status IN ('awaiting_signal', 'awaiting_children')
GROUP BY queue, status
