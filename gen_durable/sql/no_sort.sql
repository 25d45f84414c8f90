-- no_sort: turn the planner's sorts off for the rest of the transaction (set_config
-- local), so the next statement's ORDER BY … LIMIT reads its index in order and stops
-- at the limit. Without statistics (no ANALYZE yet) the planner would otherwise expect
-- a few hundred rows, read them all by a bitmap scan and sort them: every finished row.
-- Used by the admin overview's overview_finished, inside a savepoint rolled back after
-- it. No params.
SELECT set_config('enable_sort', 'off', true)
