-- history_insert: timeline entries of committed attempts, one statement for many.
-- Contract: docs/design.md#history. Sent after the outcomes committed, for the ids that
--   committed only: an entry never describes an outcome that did not commit (a crash
--   before it loses entries, never adds one). The worker's flusher sends the entries
--   of consecutive flushes together (worker/flusher.py, HISTORY_DELAY / HISTORY_BATCH).
-- Params (one element per entry; arrays through unnest as in flush.sql): id bigint[],
--   attempt int[], error text[] (NULL when it raised nothing; bounded as last_error
--   is), began bigint[] (microseconds since the step started, NULL when unknown),
--   ended bigint[] (microseconds since it ended); step text[] (the step that ran),
--   outcome text[] (next | inline | retry | await | schedule | done | failed) and
--   worker text[] as in insert_all.sql (db.batch_column): the array, or NULL and the
--   one value as step_1 / outcome_1 / worker_1 when every entry shares it.
-- Times: the database's clock (now()) less what the worker measured on its monotonic
--   clock, so entries compare with updated_at and with each other across hosts.
-- Transaction: its own, after history_begin.sql (a 50 ms lock_timeout, an asynchronous
--   commit), unless a caller's transaction holds it (drain(), tests): then neither
--   setting, so nothing leaks into the caller's transaction.
-- Index: appends to the primary key and to gen_durable_history_instance.
INSERT INTO gen_durable_history (instance_id, attempt, step, outcome, error, worker, started_at, finished_at)
SELECT i.id, i.attempt, COALESCE(i.s, %(step_1)s::text), COALESCE(i.o, %(outcome_1)s::text), i.error,
       COALESCE(i.w, %(worker_1)s::text),
       now() - i.began * interval '1 microsecond', now() - i.ended * interval '1 microsecond'
FROM unnest(%(id)s::bigint[], %(attempt)s::int[], %(step)s::text[], %(outcome)s::text[],
            %(error)s::text[], %(worker)s::text[], %(began)s::bigint[], %(ended)s::bigint[])
     AS i(id, attempt, s, o, error, w, began, ended)
