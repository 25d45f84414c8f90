-- unknown_waiting: rows handed back by a worker that did not know them, per (queue,
-- machine, version, step), for the admin overview and `manage.py durable_versions`.
-- Params: none. Index: gen_durable_unknown (only such rows; none outside a deploy).
SELECT queue, fsm, fsm_version, step, count(*), min(id), min(unknown_since)
FROM gen_durable
WHERE unknown_since IS NOT NULL AND status = 'runnable'
GROUP BY queue, fsm, fsm_version, step
ORDER BY queue, fsm, fsm_version, step
