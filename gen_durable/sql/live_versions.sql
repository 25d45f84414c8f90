-- live_versions: live rows (every status but done and failed) per (machine, version,
-- step, status), with an example id and how many a worker that did not know them handed
-- back. For retiring a version (`manage.py durable_versions`) and system check W060.
-- Params: none. Reads every live row (no index serves fsm): an operator's command and
-- `check --database`, never a worker's or the admin's hot path.
SELECT fsm, fsm_version, step, status::text, count(*), min(id), count(unknown_since)
FROM gen_durable
WHERE status <> ALL ('{done,failed}'::gen_durable_status[])
GROUP BY fsm, fsm_version, step, status
ORDER BY fsm, fsm_version, step, status
