-- overview_finished: done and failed rows per queue, counted — not estimated — among
-- the newest `cap` + 1 finished rows and the newest `cap` + 1 failed ones (admin
-- overview; independent of ANALYZE). Params: cap int.
-- Index: gen_durable_gc (updated_at) WHERE status IN ('done', 'failed') and
-- gen_durable_failed (updated_at) WHERE status = 'failed', each read backwards and
-- stopped after `cap` + 1 entries (their rows are fetched for the queue): bounded
-- whatever the size of the table. Returns (kind, queue, status, n, sampled): kind
-- 'finished' (done and failed) or 'failed'; sampled the rows that kind read — at most
-- `cap` means every such row was counted, more means n is a lower bound.
WITH fin AS (
    SELECT queue, status FROM gen_durable
    WHERE status IN ('done', 'failed')
    ORDER BY updated_at DESC LIMIT %(cap)s::int + 1
), fail AS (
    SELECT queue FROM gen_durable
    WHERE status = 'failed'
    ORDER BY updated_at DESC LIMIT %(cap)s::int + 1
)
SELECT 'finished', queue, status::text, count(*), (SELECT count(*) FROM fin) FROM fin GROUP BY queue, status
UNION ALL
SELECT 'failed', queue, 'failed', count(*), (SELECT count(*) FROM fail) FROM fail GROUP BY queue
