-- still_owned: which of these claimed rows are still held by this worker under this claim.
-- Params: ids bigint[], claims bigint[] (each id's claim counter as pick.sql set it),
--   worker text. Index: primary key (one probe per id).
-- Run before starting a step whose row waited in the worker's buffer (PREFETCH): a row
-- cancelled (or reaped) meanwhile is dropped instead of running its step
-- (docs/design.md#isolation) — and so is one cancelled, retried and claimed again by
-- this same worker (locked_by names the worker, not the claim): that newer claim runs
-- the step, not this one (docs/design.md#outcomes). No lock: cancel's own guard decides the rest.
-- The status to match comes from the materialized input, as in flush.sql: written as
-- g.status = 'executing' it lets the planner hash-join over gen_durable_lease — every
-- executing row and every dead entry a drain leaves in that index until a vacuum — where
-- one primary-key probe per id is all it takes (tests/plans).
WITH c AS MATERIALIZED (
    SELECT c.id, c.claim, 'executing'::gen_durable_status AS claimed
    FROM unnest(%(ids)s::bigint[], %(claims)s::bigint[]) AS c(id, claim)
)
SELECT g.id FROM c
JOIN gen_durable g ON g.id = c.id AND g.claim = c.claim AND g.status = c.claimed
WHERE g.locked_by = %(worker)s
