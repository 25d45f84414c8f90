-- park_recheck: wake a just-parked row whose inbox already holds a match.
-- Contract: docs/design.md#signals (the lost-wakeup fix).
-- Params: id bigint[] (rows flush.sql just parked), p_target bigint[], p_id bigint[]
--   (the signals each step was handed: they do not count as new arrivals).
-- Runs in the flush transaction right after the park, with a fresh snapshot: a signal
-- committed before the park is seen here; one committing after it waits on the park's
-- row lock in signal.sql and flips the parked row there. Whichever commits second sees
-- the other.
WITH parked AS (
    SELECT * FROM unnest(%(id)s::bigint[]) AS p(id)
), presented AS (
    SELECT * FROM unnest(%(p_target)s::bigint[], %(p_id)s::bigint[]) AS x(target_id, id)
), upd AS (
    UPDATE gen_durable g
    SET status = 'runnable', eligible_at = now(), await_deadline = NULL, updated_at = now()
    FROM parked p
    WHERE g.id = p.id AND g.status = 'awaiting_signal'
      AND EXISTS (SELECT 1 FROM gen_durable_signals s
                  WHERE s.target_id = g.id AND s.name = ANY (g.awaits)
                    AND NOT EXISTS (SELECT 1 FROM presented x
                                    WHERE x.target_id = g.id AND x.id = s.id))
    RETURNING g.id, g.queue
)
SELECT id, queue FROM upd
