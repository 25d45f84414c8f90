-- overview_executing: executing rows per (claimant, queue) (admin overview).
-- No params. Index: gen_durable_lease (its predicate is status = 'executing'), so the
-- work is bounded by the rows in flight, not the table.
SELECT locked_by, queue, count(*), min(lease_expires_at)
FROM gen_durable
WHERE status = 'executing'
GROUP BY locked_by, queue
ORDER BY locked_by, queue
