"""Seed a scale fixture with generate_series (shared by tests/plans and bench/plans).

Shape (docs/design.md#performance-contract, scaled by `total`): 30 % runnable across 3 queues and
3 priorities, 0.5 % executing, the rest terminal (10 % of those children of terminal
parents); about 5 % of the rows (live or failed) get an inbox signal.
"""

SEED = """
INSERT INTO gen_durable (fsm, step, status, queue, priority, eligible_at, state,
                         locked_by, lease_expires_at, concurrency_key, updated_at)
SELECT 'tests.Plain', 'start',
       (CASE WHEN i %% 1000 < 300 THEN 'runnable'
             WHEN i %% 1000 < 305 THEN 'executing'
             WHEN i %% 2 = 0 THEN 'done' ELSE 'failed' END)::gen_durable_status,
       'q' || (i %% 3), (i %% 3)::smallint,
       now() - make_interval(secs => (i %% 5000)),
       '{}'::jsonb,
       CASE WHEN i %% 1000 BETWEEN 300 AND 304 THEN 'seed-worker' END,
       CASE WHEN i %% 1000 BETWEEN 300 AND 304 THEN now() + interval '60 seconds' END,
       CASE WHEN i %% 1000 BETWEEN 300 AND 304 THEN 'k' || i
            WHEN i %% 7 = 0 THEN 'k' || (i %% 500) END,
       now() - make_interval(secs => (i %% 200000))
FROM generate_series(1, %(total)s) AS i;
INSERT INTO gen_durable_signals (target_id, name, payload)
SELECT id, 'go', '{}'::jsonb FROM gen_durable WHERE id %% 13 = 0 AND status <> 'done';
ANALYZE gen_durable;
ANALYZE gen_durable_signals;
"""


def seed(cursor, total: int) -> None:
    for statement in SEED.strip().split(";\n"):
        if statement.strip():
            cursor.execute(statement, {"total": total})
