-- flush: apply a batch of step outcomes in one guarded UPDATE (group commit).
-- Contract: docs/design.md#outcomes, docs/design.md#signals (consume), docs/design.md#decisions.
-- Params (columns of the batch, one element per outcome, sorted by id; all but id may
--   come as NULL or as one value, below):
--   id bigint[], worker text[] (the claimant), kind text[] (next | inline | retry |
--   await | schedule | done | stop), step text[] (NULL keeps), state text[] (JSON, NULL keeps),
--   result text[] (JSON), error text[], tb text[] (the failed attempt's traceback: an
--   outcome that sets last_error sets last_traceback too, NULL when it has none),
--   delay float8[] (retry seconds), awaits text[]
--   (JSON array of names), timeout float8[] (await seconds or NULL), set_key bool[],
--   new_key text[], rate_limit text[], weight float8[], detail text[] (JSON object or
--   NULL: the attempt's record for rows that keep an attempt_log — Django tasks),
--   claim bigint[] (the claim counter the step ran under, as pick.sql set it).
--   A column whose every element would be NULL comes as NULL (unnest(a, b, …) pads it
--   with NULLs), and worker, kind, weight and claim come as in insert_all.sql (db.batch_column):
--   the array, or NULL when every outcome has the same value, which then comes as
--   <column>_1 — else a flush of 500 chain steps or jobs parses a dozen arrays of 500
--   copies. set_key is true or NULL, delay NULL but for a retry.
--   c_target bigint[], c_id bigint[]: the (owner, signal id) pairs a progressing
--   outcome consumes (exactly the ids its step was handed);
--   lease float8: an `inline` row's lease, renewed to this many seconds (LEASE_TTL)
--   when less than renew float8 seconds (LEASE_TTL - HEARTBEAT_INTERVAL) are left;
--   inline bigint[]: the ids of the `inline` outcomes.
-- `inline` is a Next whose step runs at once in the same worker (inline continuation):
--   the same transition, but the row stays `executing` under the same claimant with its
--   gate slot (concurrency_shard) kept; the next step runs only after this commit, so a
--   crash re-runs it through the reaper, as after a requeue. It changes no indexed
--   column (lease, updated_at and eligible_at stay; see lease_expires_at below), so it
--   is a HOT update where the page has room (the table's fillfactor leaves it).
-- Returns a row per committed outcome (id, status, queue, parent_id), then a row per
--   signal in the inbox of each `inline` row — for one that committed, what its next
--   step starts with — (target id, NULL, NULL, NULL, signal id, name, payload,
--   inserted_at): the inbox as of this statement, less what it consumed. A signal committing meanwhile is
--   not lost; it waits in the inbox for a later step, as after a re-pick.
-- One statement for a batch of plain outcomes: the worker runs it alone, outside an
--   explicit transaction (it commits as it ends), when the batch needs nothing else.
-- Notifies `gen_durable_result` once per flush with the ids that settled (done,
-- failed or parked), so await_result in another process answers at once ('*' when the
-- list would exceed NOTIFY's 8000-byte payload: every waiter re-reads).
-- awaits: set by an Await, kept by a Retry and by a Stop (a failed row woken from an Await
--   keeps the names, so retry.sql parks it on them again); cleared by every other outcome.
-- Guard: claim = the outcome's claim AND locked_by = worker AND status = 'executing'.
--   locked_by names the worker, not the claim: after a cancel and a retry the same
--   worker may claim the row again while the cancelled run still runs, and only the
--   claim counter (incremented by every pick, in the claim's own UPDATE) tells that
--   run's late outcome from the new one's. A stale outcome matches nothing,
--   and every rider keys off `upd`, so it consumes, purges and wakes nothing either.
-- Index: primary key (one point lookup per outcome); signals by id / by target.
--   The guard's status comes from the materialized input (`i.claimed`), so it is a join
--   clause, not a restriction: written as g.status = 'executing' it lets the planner
--   hash-join over gen_durable_lease — every executing row (and its dead index entries)
--   per flush — instead of one primary-key probe per outcome (tests/plans).
WITH input AS MATERIALIZED (
    SELECT i.*, COALESCE(i.w, %(worker_1)s::text) AS worker, COALESCE(i.k, %(kind_1)s::text) AS kind,
           COALESCE(i.wt, %(weight_1)s::float8) AS weight,
           COALESCE(i.cl, %(claim_1)s::bigint) AS claim, 'executing'::gen_durable_status AS claimed
    FROM unnest(%(id)s::bigint[], %(worker)s::text[], %(kind)s::text[], %(step)s::text[],
                %(state)s::text[], %(result)s::text[], %(error)s::text[], %(tb)s::text[], %(delay)s::float8[],
                %(awaits)s::text[], %(timeout)s::float8[], %(set_key)s::bool[],
                %(new_key)s::text[], %(rate_limit)s::text[], %(weight)s::float8[],
                %(detail)s::text[], %(claim)s::bigint[])
         AS i(id, w, k, step, state, result, error, tb, delay, awaits, timeout, set_key,
              new_key, rate_limit, wt, detail, cl)
), upd AS (
    UPDATE gen_durable g
    SET status = (CASE i.kind WHEN 'inline' THEN 'executing'
                              WHEN 'await' THEN 'awaiting_signal'
                              WHEN 'schedule' THEN 'awaiting_children'
                              WHEN 'done' THEN 'done' WHEN 'stop' THEN 'failed'
                              ELSE 'runnable' END)::gen_durable_status,
        step = COALESCE(i.step, g.step),
        state = COALESCE(i.state::jsonb, g.state),
        result = CASE WHEN i.kind = 'done' THEN i.result::jsonb ELSE g.result END,
        last_error = COALESCE(i.error, g.last_error),
        last_traceback = CASE WHEN i.error IS NULL THEN g.last_traceback ELSE i.tb END,
        attempt = CASE WHEN i.kind = 'retry' THEN g.attempt + 1
                       WHEN i.kind IN ('done', 'stop') THEN g.attempt ELSE 0 END,
        eligible_at = CASE WHEN i.kind = 'retry' THEN now() + make_interval(secs => i.delay)
                           WHEN i.kind IN ('done', 'stop', 'inline') THEN g.eligible_at ELSE now() END,
        awaits = CASE i.kind WHEN 'await' THEN ARRAY(SELECT jsonb_array_elements_text(i.awaits::jsonb))
                             WHEN 'retry' THEN g.awaits WHEN 'stop' THEN g.awaits END,
        await_deadline = CASE WHEN i.kind = 'await' AND i.timeout IS NOT NULL
                              THEN now() + make_interval(secs => i.timeout) END,
        concurrency_key = CASE WHEN i.set_key THEN i.new_key ELSE g.concurrency_key END,
        concurrency_shard = CASE WHEN i.kind = 'inline' THEN g.concurrency_shard END,
        rate_limit = CASE WHEN i.kind = 'retry' THEN g.rate_limit
                          WHEN i.kind IN ('next', 'inline') THEN i.rate_limit END,
        weight = CASE WHEN i.kind = 'retry' THEN g.weight WHEN i.kind IN ('next', 'inline') THEN i.weight
                      ELSE 1 END,
        children_pending = CASE WHEN i.kind = 'schedule' THEN 0 ELSE g.children_pending END,
        -- The attempt's record, with who ran it and when it was claimed: the claim set
        -- updated_at, and nothing touches an executing row's updated_at until now.
        attempt_log = CASE WHEN i.detail IS NULL THEN g.attempt_log
                           ELSE COALESCE(g.attempt_log, '[]'::jsonb) || jsonb_build_array(
                                i.detail::jsonb || jsonb_build_object('worker_id', g.locked_by,
                                                                      'started_at', g.updated_at)) END,
        locked_by = CASE WHEN i.kind = 'inline' THEN g.locked_by END,
        -- An inline row keeps its updated_at (the claim) and, while a heartbeat's worth
        -- of it is spent at most, its lease: no indexed column changes, so the
        -- transition is a HOT update. Past that it is renewed here: the heartbeat skips
        -- a row a flush holds, and a chain of quick steps is in nearly every flush —
        -- its lease must still look renewed at every heartbeat, as start-up reclaim
        -- (reclaim.sql) takes this host's rows not renewed for two.
        lease_expires_at = CASE WHEN i.kind <> 'inline' THEN NULL
                                WHEN g.lease_expires_at >= now() + make_interval(secs => %(renew)s::float8)
                                THEN g.lease_expires_at
                                ELSE now() + make_interval(secs => %(lease)s::float8) END,
        updated_at = CASE WHEN i.kind = 'inline' THEN g.updated_at ELSE now() END
    FROM input i
    WHERE g.id = i.id AND g.claim = i.claim AND g.locked_by = i.worker AND g.status = i.claimed
    RETURNING g.id, g.status, g.queue, g.parent_id
), consumed AS (
    DELETE FROM gen_durable_signals s
    USING upd, unnest(%(c_target)s::bigint[], %(c_id)s::bigint[]) AS c(target_id, id)
    WHERE s.id = c.id AND s.target_id = upd.id AND c.target_id = upd.id
      AND upd.status NOT IN ('done', 'failed')
    RETURNING s.id
), purged AS (
    DELETE FROM gen_durable_signals s
    USING upd
    WHERE s.target_id = upd.id AND upd.status IN ('done', 'failed')
), settled AS (
    -- One notification per flush names the rows that settled, for await_result
    -- waiters in other processes (docs/guide.md).
    SELECT pg_notify('gen_durable_result', CASE WHEN length(ids) > 7900 THEN '*' ELSE ids END)
    -- (Settled: done, failed or parked.)
    FROM (SELECT string_agg(id::text, ',') AS ids FROM upd
          WHERE status NOT IN ('executing', 'runnable')) s
    WHERE ids IS NOT NULL
)
-- (The NULLs take their types from the inbox rows below.)
SELECT upd.id, upd.status::text, upd.queue, upd.parent_id, NULL, NULL, NULL, NULL
FROM upd CROSS JOIN (SELECT count(*) FROM settled) n
UNION ALL
-- The inboxes of the rows that continue inline (index: gen_durable_signals_target, one
-- probe per id of the array). Not joined with upd: the worker reads only those of rows
-- that committed, and a join lets a generic plan probe the index once per committed row
-- with the whole array as a second key — every element each time.
SELECT s.target_id, NULL, NULL, NULL, s.id, s.name, s.payload::text, s.inserted_at
FROM gen_durable_signals s
WHERE s.target_id = ANY (%(inline)s::bigint[])
  AND s.id NOT IN (SELECT id FROM consumed)
