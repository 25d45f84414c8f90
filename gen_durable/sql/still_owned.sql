-- still_owned: which of these claimed rows are still held by this worker.
-- Params: ids bigint[], worker text. Index: primary key (one probe per id).
-- Run before starting a step whose row waited in the worker's buffer (PREFETCH): a row
-- cancelled (or reaped) meanwhile is dropped instead of running its step
-- (docs/design.md#isolation). No lock: cancel's own guard decides the rest.
SELECT id FROM gen_durable
WHERE id = ANY (%(ids)s::bigint[]) AND locked_by = %(worker)s AND status = 'executing'
