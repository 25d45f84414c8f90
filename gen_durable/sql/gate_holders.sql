-- gate_holders: whether a row other than `ids` is executing with a gate slot claimed or held.
-- Params: ids bigint[] (the batch being admitted; {} for none).
-- The Redis limiter asks it once when its epoch key is missing (Redis lost its data, or is
-- new): if such rows exist, their slots must be re-asserted (their heartbeats renew them)
-- before gated rows are admitted again. Index: gen_durable_lease (status = 'executing').
SELECT EXISTS (SELECT 1 FROM gen_durable
               WHERE status = 'executing' AND lease_expires_at IS NOT NULL AND concurrency_shard IS NOT NULL
                 AND id <> ALL (%(ids)s::bigint[]))
