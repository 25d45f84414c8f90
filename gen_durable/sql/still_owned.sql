-- still_owned: which of these claimed rows are still held by this worker under this claim.
-- Params: ids bigint[], claims bigint[] (each id's claim counter as pick.sql set it),
--   worker text. Index: primary key (one probe per id).
-- Run before starting a step whose row waited in the worker's buffer (PREFETCH): a row
-- cancelled (or reaped) meanwhile is dropped instead of running its step
-- (docs/design.md#isolation) — and so is one cancelled, retried and claimed again by
-- this same worker (locked_by names the worker, not the claim): that newer claim runs
-- the step, not this one (docs/design.md#outcomes). No lock: cancel's own guard decides the rest.
SELECT g.id FROM unnest(%(ids)s::bigint[], %(claims)s::bigint[]) AS c(id, claim)
JOIN gen_durable g ON g.id = c.id AND g.claim = c.claim
WHERE g.locked_by = %(worker)s AND g.status = 'executing'
