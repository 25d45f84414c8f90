"""The timer's "next deadline" read stays a handful of index probes at scale.

Reuses the plan tests' seeded table and adds, inside the test's transaction, 20,000
armed Await deadlines and 20,000 runnable rows scheduled for later (three priorities),
so both indexes the read walks hold many entries; bench/plans.py records it at 1M rows.
"""

import json

from django.db import connection

from gen_durable import sql
from tests.plans.test_plans import _seeded, index_scans, nodes, seq_scans_of_instances  # noqa: F401

EXTRA = """
INSERT INTO gen_durable (fsm, step, status, queue, priority, eligible_at, await_deadline)
SELECT 'tests.Plain', 'start',
       (CASE WHEN i %% 2 = 0 THEN 'awaiting_signal' ELSE 'runnable' END)::gen_durable_status,
       'q1', (i %% 3)::smallint,
       now() + make_interval(secs => 60 + i),
       CASE WHEN i %% 2 = 0 THEN now() + make_interval(secs => 60 + i) END
FROM generate_series(1, 40000) AS i
"""


def test_next_deadline_read_is_index_probes_not_a_scan(_seeded, db):  # noqa: F811
    with connection.cursor() as cur:
        cur.execute(EXTRA, {})
        cur.execute("ANALYZE gen_durable")
        cur.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.NEXT_TIMERS, {"queues": "{q0,q1,q2}", "schedules": "{nightly}"})
        raw = cur.fetchone()[0]
    p = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    assert seq_scans_of_instances(p) == []
    assert {"gen_durable_await_deadline", "gen_durable_pick"} <= index_scans(p)
    # Flat: every probe of the instance table hands back at most one row per loop, and
    # there are a few loops per (queue, priority) — never a walk over the armed rows.
    assert "gen_durable_schedules_pkey" in index_scans(p) or any(
        n.get("Relation Name") == "gen_durable_schedules" for n in nodes(p))
    for n in nodes(p):
        if n.get("Relation Name") == "gen_durable":
            assert n["Actual Rows"] <= 1, (n["Node Type"], n.get("Index Name"), n["Actual Rows"])
            assert n["Actual Loops"] <= 20, (n["Node Type"], n.get("Index Name"), n["Actual Loops"])
