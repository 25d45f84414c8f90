-- pick: claim up to `limit` runnable rows of one queue and lease them to `worker`.
-- Contract: docs/design.md#pick, docs/design.md#concurrency-keys (K=1), docs/design.md#leases.
-- Params: queue text, limit int, worker text, ttl float8 (lease seconds),
--   gates text[] (configured gate names: their rows skip K=1 and get the provisional
--   shard -1, "claimed, not yet admitted": the limiter stamps the real shard on admission).
-- Index: gen_durable_pick (queue, priority, eligible_at) WHERE status = 'runnable' —
--   `queue = $1` equality (never ANY) lets the index hand rows over in order so LIMIT
--   stops after ~limit rows. The K=1 probe is a plain NOT EXISTS, planned as a Nested
--   Loop Anti Join probing gen_durable_concurrency_active once per candidate (flat in the
--   executing set; a NOT EXISTS inside an OR would build a hashed subplan over the whole
--   executing set, and a LEFT JOIN LATERAL ... IS NULL filter is mis-estimated at 0.5 percent
--   and drives the planner to sort the whole runnable set — both measured, tests/plans).
-- Locks: FOR NO KEY UPDATE SKIP LOCKED in the scan — a claim never waits, and NO KEY
--   strength stays compatible with the KEY SHARE a signal insert's FK check takes.
-- claim: the row's claim counter, incremented: the token its outcome carries to the
--   flush guard (flush.sql), as locked_by names the worker, not the claim.
--   held_ids bigint[], held_claims bigint[] (NULL, NULL but after a reconnect): claims
--   this worker still holds whose commit a server crash may have lost (the claim commits
--   asynchronously). Such a row is runnable again at its older counter; claimed again,
--   it gets a counter above the one the earlier run holds, so that run's late outcome
--   is stale instead of passing the guard (docs/design.md#leases, "Claims across a crash").
-- eligible_at comes back as epoch seconds: it only orders the batch in Python.
-- K=1: row_number() over the locked window keeps the most urgent row per unconfigured
--   key; the losers stay runnable. The unique arbiter index is the correctness backstop:
--   a racing claim of the same key aborts this statement and the caller retries.
WITH cand AS (
    SELECT g.id, g.concurrency_key, g.correlation_key, g.priority, g.eligible_at,
           (g.concurrency_key IS NOT NULL AND g.concurrency_name = ANY (%(gates)s::text[])) AS gated,
           (g.correlation_guard IS NULL AND g.correlation_key IS NOT NULL
            AND 'executing' = ANY (g.correlation_scope)) AS enters
    FROM gen_durable g
    WHERE g.queue = %(queue)s
      AND g.status = 'runnable'
      AND g.eligible_at <= now()
      AND NOT EXISTS (
          SELECT 1 FROM gen_durable x
          WHERE x.concurrency_key = g.concurrency_key
            AND x.status = 'executing' AND x.concurrency_shard IS NULL
            AND g.concurrency_name <> ALL (%(gates)s::text[]))
      -- A key reserved while executing but not while runnable: the claim would put it
      -- in the unique correlation index, so a row whose key another row holds waits.
      -- The probe key is NULL (no index descent) for every row that is not entering
      -- its scope, the default scope included.
      AND NOT EXISTS (
          SELECT 1 FROM gen_durable c
          WHERE c.correlation_guard = CASE WHEN g.correlation_guard IS NULL
                                                AND 'executing' = ANY (g.correlation_scope)
                                           THEN g.correlation_key END)
    ORDER BY g.priority, g.eligible_at
    LIMIT %(limit)s
    FOR NO KEY UPDATE OF g SKIP LOCKED
), ranked AS (
    SELECT c.id, c.gated, h.claim AS held,
           row_number() OVER (
               PARTITION BY CASE WHEN c.gated OR c.concurrency_key IS NULL THEN c.id::text
                                 ELSE c.concurrency_key END
               ORDER BY c.priority, c.eligible_at, c.id) AS rn,
           -- ...and of two such rows with one key in this batch, only the first.
           row_number() OVER (
               PARTITION BY CASE WHEN c.enters THEN c.correlation_key ELSE c.id::text END
               ORDER BY c.priority, c.eligible_at, c.id) AS rc
    FROM cand c
    LEFT JOIN unnest(%(held_ids)s::bigint[], %(held_claims)s::bigint[]) AS h(id, claim) ON h.id = c.id
)
UPDATE gen_durable g
SET status = 'executing',
    locked_by = %(worker)s,
    lease_expires_at = now() + make_interval(secs => %(ttl)s::float8),
    concurrency_shard = CASE WHEN r.gated THEN -1 END,
    updated_at = now(),
    claim = GREATEST(g.claim, r.held) + 1
FROM ranked r
WHERE g.id = r.id AND r.rn = 1 AND r.rc = 1
RETURNING g.id, g.fsm, g.fsm_version, g.step, g.state, g.attempt, g.awaits, g.queue,
          g.priority, extract(epoch FROM g.eligible_at)::float8, g.concurrency_key, g.concurrency_shard, g.rate_limit,
          g.weight, g.correlation_key, g.parent_id, g.claim
