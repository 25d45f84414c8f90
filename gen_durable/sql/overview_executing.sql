-- overview_executing: executing rows per (claimant, queue) (admin overview).
-- No params. Index: gen_durable_lease (its predicate is status = 'executing'), so the
-- work is bounded by the rows in flight, not the table.
-- Per group also its longest-running row (claimed first: updated_at is the claim, which
-- nothing touches while a row executes): id, machine, step, attempt and seconds running.
SELECT locked_by, queue, count(*), min(lease_expires_at),
       (array_agg(id ORDER BY updated_at, id))[1], (array_agg(fsm ORDER BY updated_at, id))[1],
       (array_agg(step ORDER BY updated_at, id))[1], (array_agg(attempt ORDER BY updated_at, id))[1],
       extract(epoch FROM now() - min(updated_at))::float8
FROM gen_durable
WHERE status = 'executing'
GROUP BY locked_by, queue
ORDER BY locked_by, queue
