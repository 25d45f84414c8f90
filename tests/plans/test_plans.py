"""Plan shapes of the hot statements at scale (docs/design.md#performance-contract).

A 100k-row fixture (30 % runnable, 0.5 % executing, the rest terminal) is enough for
the planner to choose the plans it chooses at 1M rows; bench/ records EXPLAIN ANALYZE
at 1M. Each test reads EXPLAIN (FORMAT JSON) — the statement is planned, not run.
"""

import json

import pytest
from django.db import connection

from gen_durable import sql
from tests.plans.seed import seed

TOTAL = 100_000


@pytest.fixture(scope="module")
def _seeded(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        with connection.cursor() as cur:
            cur.execute("TRUNCATE gen_durable, gen_durable_signals RESTART IDENTITY CASCADE")
            seed(cur, TOTAL)
        yield
        with connection.cursor() as cur:
            cur.execute("TRUNCATE gen_durable, gen_durable_signals RESTART IDENTITY CASCADE")


@pytest.fixture
def scale(_seeded, db):
    yield


def plan(statement, params):
    with connection.cursor() as cur:
        cur.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        raw = cur.fetchone()[0]
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def nodes(p):
    yield p
    for child in p.get("Plans", ()):
        yield from nodes(child)


def seq_scans_of_instances(p):
    return [n for n in nodes(p) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "gen_durable"]


def index_scans(p):
    return {n.get("Index Name") for n in nodes(p) if "Index" in n["Node Type"]}


PICK = {"queue": "q1", "limit": 50, "worker": "w", "ttl": 60.0, "gates": [], "held_ids": None, "held_claims": None}


def test_pick_rides_the_pick_index_and_stops_at_the_batch(scale):
    p = plan(sql.PICK, PICK)
    assert not seq_scans_of_instances(p)
    scans = [n for n in nodes(p) if n.get("Index Name") == "gen_durable_pick"]
    assert scans, "the claim must scan gen_durable_pick"
    assert all("queue = " in n.get("Index Cond", "") for n in scans)
    limits = [n for n in nodes(p) if n["Node Type"] == "Limit"]
    assert limits and limits[0]["Plan Rows"] <= 50
    # The K=1 probe uses the arbiter index, not a scan of the executing set.
    assert "gen_durable_concurrency_active" in index_scans(p)
    assert not any(n.get("Sort Key") for n in nodes(p) if n.get("Parent Relationship") == "Outer"
                   and n["Node Type"] == "Sort" and n.get("Plan Rows", 0) > 1000)


def test_pick_touches_about_a_batch_of_rows_when_run(scale):
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.PICK, PICK)
        raw = cur.fetchone()[0]
    p = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    scan = next(n for n in nodes(p) if n.get("Index Name") == "gen_durable_pick")
    assert scan["Actual Rows"] <= 2 * 50  # ~batch, not the 30k runnable rows


@pytest.mark.parametrize("name, params", [
    ("LOAD_SIGNALS", {"ids": list(range(1, 51))}),
    ("LOAD_CHILDREN", {"ids": list(range(1, 51))}),
    # A next and a done, as the flusher sends them (`_arrays`: tests below build theirs with it).
    ("FLUSH", {"id": [1, 2], "worker": None, "worker_1": "w", "kind": ["next", "done"], "kind_1": None,
               "step": ["s", None], "state": None, "result": [None, "{}"], "error": None, "tb": None, "delay": None,
               "awaits": None, "timeout": None, "set_key": None, "new_key": None, "rate_limit": None,
               "weight": None, "weight_1": 1.0, "detail": None, "claim": None, "claim_1": 1,
               "c_target": [1], "c_id": [5], "lease": 60.0,
               "renew": 40.0, "inline": []}),
    ("PARK_RECHECK", {"id": [1, 2], "p_target": [1], "p_id": [3]}),
    ("SPAWN_PARK", {"id": [1], "n": [3]}),
    ("JOIN_PARENTS", {"parent_id": [1, 2], "n": [1, 2]}),
    ("HEARTBEAT", {"ids": list(range(1, 51)), "worker": "w", "ttl": 60.0}),
    ("STILL_OWNED", {"ids": list(range(1, 51)), "claims": [1] * 50, "worker": "w"}),
    ("RELEASE", {"ids": list(range(1, 51)), "claims": [1] * 50, "worker": "w"}),
    ("RECLAIM", {"queue": "q1", "prefix": "host:q1:", "margin": 20.0, "history": True}),
    ("REAP", {"limit": 1000, "history": True}),
    ("EXPIRE_AWAITS", {"force": False, "limit": 1000}),
    ("GC_DELETE", {"ids": list(range(1, 1001))}),
    ("SIGNAL", {"id": 1, "key": None, "name": "go", "payload": "{}", "dedup_key": None}),
    ("SIGNAL", {"id": None, "key": "order:1", "name": "go", "payload": "{}", "dedup_key": None}),
    ("GET", {"id": 1, "key": None}),
    ("GET", {"id": None, "key": "order:1"}),
    ("BULK_SELECT", {"after": 0, "window": 20000, "statuses": ["failed"], "queue": "q1", "fsm": None,
                     "batch": 1000}),
    ("BULK_MOVE", {"ids": list(range(1, 1001)), "queue": "q9"}),  # a finished instance's key too (gen_durable_correlation_key)
    ("CANCEL", {"id": None, "key": "order:1", "reason": "x"}),
    ("INSERT", {"fsm": "f", "fsm_version": 1, "step": "s", "state": "{}", "queue": "q", "priority": 0,
                "at": None, "delay": 0.0, "concurrency_key": None, "rate_limit": None, "weight": 1.0,
                "correlation_key": "k", "scope": ["runnable"]}),
    ("TASK_ENQUEUE", {"fsm": ["t.f"] * 2, "state": ['{"args": [], "kwargs": {}}'] * 2, "queue": ["q"] * 2,
                      "priority": [0, -5], "at": [None, None]}),
])
def test_no_hot_statement_scans_the_instance_table(scale, name, params):
    p = plan(getattr(sql, name), params)
    assert not seq_scans_of_instances(p), json.dumps(p, indent=1)[:3000]


def test_gc_deletes_by_primary_key(scale):
    # 1 % of the table per batch, as GC.BATCH 10,000 is of a 1M-row table.
    p = plan(sql.GC_DELETE, {"ids": list(range(1, 1001))})
    assert "gen_durable_pkey" in index_scans(p)


def test_reaper_rides_the_lease_index(scale):
    assert "gen_durable_lease" in index_scans(plan(sql.REAP, {"limit": 1000, "history": True}))


def flush_params(ids, kinds, consumed=(), **fields):
    """flush.sql's parameters for outcomes of `kinds` (one kind, or one per row, cycled)
    on rows `ids`, as the flusher builds them; consumed: the signal ids the first rows
    consume, one each."""
    import itertools

    from gen_durable.worker.executor import Entry
    from gen_durable.worker.flusher import _arrays

    kinds = itertools.cycle([kinds] if isinstance(kinds, str) else kinds)
    return _arrays([Entry(id=i, worker="w", kind=next(kinds), step="s", consumed=tuple(consumed[k:k + 1]),
                          **fields) for k, i in enumerate(ids)])


def test_flush_updates_by_primary_key_not_by_the_executing_set(scale):
    shared = flush_params(range(300, 350), "next")  # one worker, kind and weight: single values
    mixed = flush_params(range(300, 350), ["next", "done"])  # the kinds as an array
    assert (shared["kind"], mixed["kind_1"]) == (None, None)
    # The custom plan, and the generic one the worker's prepared statement runs.
    for arrays in (shared, mixed):
        for p in (plan(sql.FLUSH, arrays), generic_plan(sql.FLUSH, arrays)):
            update = next(n for n in nodes(p)
                          if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "gen_durable")
            used = index_scans(update)
            assert "gen_durable_pkey" in used and "gen_durable_lease" not in used, used


@pytest.mark.parametrize("name, params", [
    ("STILL_OWNED", {"ids": list(range(300, 350)), "claims": [1] * 50, "worker": "seed-worker"}),
    ("HEARTBEAT", {"ids": list(range(300, 350)), "worker": "seed-worker", "ttl": 60.0}),
    ("RELEASE", {"ids": list(range(300, 350)), "claims": [1] * 50, "worker": "seed-worker"}),
    ("HAND_BACK", {"ids": list(range(300, 350)), "claims": [1] * 50, "worker": "seed-worker"}),
])
def test_a_workers_own_rows_are_probed_by_primary_key_not_through_the_executing_set(scale, name, params):
    """The statements on one worker's claimed rows (the re-check of prefetched rows, the
    lease heartbeat, release, hand-back): one primary-key probe per id. Their first forms
    (status as a restriction) walked gen_durable_lease — every worker's executing rows and
    every dead entry a drain leaves in that index until a vacuum; the re-check took ~10 ms
    a call late in a 200k drain, one of its most expensive statements
    (bench/results/profile/drain_200k.md)."""
    for p in (plan(getattr(sql, name), params), generic_plan(getattr(sql, name), params)):
        used = index_scans(p)
        assert "gen_durable_pkey" in used and "gen_durable_lease" not in used, json.dumps(p, indent=1)[:3000]


def generic_plan(statement, params):
    """The plan of `statement` as a server-side prepared statement runs it once its plan
    is cached: generic, the parameters unknown (the worker's connections prepare the hot
    statements: OPTIONS server_side_binding, prepare_threshold)."""
    import re

    import psycopg

    from gen_durable.db import pg_array

    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", statement)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", statement).replace("%%", "%")
    values = [pg_array(params[n]) if isinstance(params[n], list) else params[n] for n in names]
    connection.ensure_connection()
    with psycopg.ClientCursor(connection.connection) as cur:  # the values as literals: typed by PREPARE
        cur.execute("PREPARE gd_plan_test AS " + text)
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("EXPLAIN (FORMAT JSON) EXECUTE gd_plan_test (" + ", ".join(["%s"] * len(names)) + ")", values)
        raw = cur.fetchone()[0]
        cur.execute("DEALLOCATE gd_plan_test")
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def test_flush_reads_the_inline_rows_inboxes_by_their_target_index(scale):
    """The inboxes flush.sql returns for rows that continue inline: one probe of
    gen_durable_signals_target per id, as load_signals.sql, never a scan of the inboxes —
    and, in the generic plan a prepared flush runs, never a probe per committed row with
    the whole id array as a second key (which walked the array at every probe: its first
    form joined the inboxes with the updated rows, ~20 µs per row)."""
    ids = list(range(300, 350))
    arrays = flush_params(ids, "inline", consumed=[1, 2, 3, 4, 5], state='{"k": 1}')
    custom, generic = plan(sql.FLUSH, arrays), generic_plan(sql.FLUSH, arrays)
    for whole in (custom, generic):
        inboxes = [n for n in whole["Plans"] if n.get("Parent Relationship") == "Member"][-1]  # UNION ALL's 2nd
        scans = [n for n in nodes(inboxes) if n.get("Relation Name") == "gen_durable_signals"]
        assert scans and all(n.get("Parent Relationship") != "Inner" for n in scans), \
            json.dumps(inboxes, indent=1)[:3000]
    # What the worker runs: the array drives the target index (the planner may read a
    # small inbox table whole in a custom plan, as here).
    assert any(n.get("Index Name") == "gen_durable_signals_target" and "ANY" in n.get("Index Cond", "")
               for n in scans), json.dumps(inboxes, indent=1)[:3000]


# --- the admin's queue overview and changelist (docs/admin.md) ------------------------
def test_overview_statements_never_scan_the_table(scale):
    from gen_durable.queues import COUNT_CAP

    cases = [
        (sql.OVERVIEW_RUNNABLE_QUEUES, None, {"gen_durable_pick"}),
        (sql.OVERVIEW_QUEUE_DEPTH, {"queues": ["q0", "q1", "q2"], "cap": COUNT_CAP}, {"gen_durable_pick"}),
        (sql.OVERVIEW_EXECUTING, None, {"gen_durable_lease"}),
        (sql.OVERVIEW_COMPLETIONS, {"minutes": 60}, {"gen_durable_gc", "gen_durable_failed"}),
        # the Prometheus view's completions (gen_durable.integrations.prometheus)
        (sql.METRICS_COMPLETIONS, None, {"gen_durable_gc", "gen_durable_failed"}),
        # the unserved-queue warnings (W006, worker start-up): bounded per queue too
        (sql.QUEUE_SAMPLE, {"queues": ["q0", "q1", "q2"], "cap": 1000}, {"gen_durable_pick"}),
    ]
    for statement, params, indexes in cases:
        p = plan(statement, params)
        assert not seq_scans_of_instances(p), statement.splitlines()[0]
        assert indexes <= index_scans(p), (statement.splitlines()[0], index_scans(p))
    # done / failed per queue: two capped backward scans of the partial indexes, never
    # the table (no ANALYZE needed); the awaiting sample reads the pages it asks for
    with connection.cursor() as cur:
        cur.execute(sql.NO_SORT)  # as the overview runs it (gen_durable/admin/overview.py)
    finished = plan(sql.OVERVIEW_FINISHED, {"cap": COUNT_CAP})
    assert_finished_counts_stop_at_the_cap(finished, COUNT_CAP)
    sampled = plan(sql.OVERVIEW_SAMPLED, {"percent": 100.0 * 1000 / 35_000})
    assert not seq_scans_of_instances(sampled)
    assert [n["Node Type"] for n in nodes(sampled) if n.get("Relation Name") == "gen_durable"] == ["Sample Scan"]
    # the chart counts from the index alone (status is implied by its predicate)
    chart = plan(sql.OVERVIEW_COMPLETIONS, {"minutes": 60})
    assert [n["Index Name"] for n in nodes(chart) if n["Node Type"] == "Index Only Scan"] == [
        "gen_durable_gc", "gen_durable_failed"]
    windows = plan(sql.METRICS_COMPLETIONS, None)
    assert sorted(n["Index Name"] for n in nodes(windows) if n["Node Type"] == "Index Only Scan") == [
        "gen_durable_failed", "gen_durable_gc"]


def assert_finished_counts_stop_at_the_cap(p, cap):
    assert not seq_scans_of_instances(p)
    assert not [n for n in nodes(p) if n["Node Type"] in ("Sort", "Bitmap Heap Scan")], json.dumps(p)[:2000]
    limits = [n for n in nodes(p) if n["Node Type"] == "Limit"]
    assert [n["Plans"][0].get("Index Name") for n in limits] == ["gen_durable_gc", "gen_durable_failed"]
    assert all(n["Plans"][0]["Scan Direction"] == "Backward" for n in limits)


def test_overview_finished_counts_stay_bounded_without_statistics(scale):
    """Before any ANALYZE the planner expects few finished rows and would read every one
    by a bitmap scan and sort them (the control below); with sorts off (sql/no_sort.sql)
    both capped counts walk their index backwards and stop at the cap."""
    from gen_durable.queues import COUNT_CAP

    with connection.cursor() as cur:  # rolled back with the test's transaction
        cur.execute("DELETE FROM pg_statistic WHERE starelid = 'gen_durable'::regclass")
        cur.execute("DELETE FROM pg_statistic_ext_data WHERE stxoid IN "
                    "(SELECT oid FROM pg_statistic_ext WHERE stxrelid = 'gen_durable'::regclass)")
    control = plan(sql.OVERVIEW_FINISHED, {"cap": COUNT_CAP})
    assert [n for n in nodes(control) if n["Node Type"] == "Sort"], "the control: a sort of every finished row"
    with connection.cursor() as cur:
        cur.execute(sql.NO_SORT)
    assert_finished_counts_stop_at_the_cap(plan(sql.OVERVIEW_FINISHED, {"cap": COUNT_CAP}), COUNT_CAP)


def test_changelist_pages_ride_an_index(scale):
    from gen_durable.models import Instance

    for qs in (Instance.objects.order_by("-id"),
               Instance.objects.filter(status="failed").order_by("-id"),
               Instance.objects.filter(queue="q1", status="runnable").order_by("-id"),
               Instance.objects.filter(id__in=[5, 7]).order_by("-id")):
        statement, params = qs[:50].query.sql_with_params()
        p = plan(statement, params)
        assert not seq_scans_of_instances(p), statement


# --- rolling deploys (docs/guide.md, "Deploying") -------------------------------------
def test_deploy_statements_ride_the_unknown_index_never_the_table(scale):
    """The once-a-second "any handed-back rows here?" read, the adoption and the
    overview's list probe gen_durable_unknown (only handed-back rows) — none scans
    gen_durable, and the pick itself is unchanged (test above)."""
    known = {"queue": "q1", "fsms": ["f"] * 2, "versions": [1, 2], "steps": ["s", "t"], "limit": 50}
    for statement, params in ((sql.QUEUE_PAUSED, {"queue": "q1"}), (sql.ADOPT_KNOWN, known),
                              (sql.UNKNOWN_WAITING, None), (sql.HAND_BACK, {"ids": list(range(1, 51)), "claims": [1] * 50, "worker": "w"})):
        for p in (plan(statement, params),) + ((generic_plan(statement, params),) if params else ()):
            assert not seq_scans_of_instances(p), statement.splitlines()[0]
    for statement, params in ((sql.ADOPT_KNOWN, known), (sql.UNKNOWN_WAITING, None)):
        assert "gen_durable_unknown" in index_scans(plan(statement, params)), statement.splitlines()[0]


# --- the timeline (gen_durable_history) -------------------------------------------------------

@pytest.fixture
def timeline_rows(_seeded, db):
    """100,000 entries of 10,000 instances (10 each), analysed: the planner sees a table."""
    with connection.cursor() as cur:
        cur.execute("INSERT INTO gen_durable_history (instance_id, attempt, step, outcome, worker, started_at, "
                    "finished_at) SELECT mod(i, 10000), 0, 'start', 'next', 'w', now() - interval '1 hour', "
                    "now() - interval '1 hour' + i * interval '1 millisecond' FROM generate_series(1, 100000) i")
        cur.execute("ANALYZE gen_durable_history")
    yield


def seq_scans_of_history(p):
    return [n for n in nodes(p) if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "gen_durable_history"]


@pytest.mark.parametrize("name, params, index", [
    ("HISTORY_GC_AGE", {"retention": 60.0, "batch": 1000}, "gen_durable_history_pkey"),
    ("HISTORY_GC_CAP", {"after": 50_000, "batch": 1000, "cap": 5}, "gen_durable_history_instance"),
    ("HISTORY_GC_CAP", {"after": None, "batch": 1000, "cap": 5}, "gen_durable_history_instance"),
])
def test_the_timeline_gc_reads_a_batch_through_its_indexes(timeline_rows, name, params, index):
    p = plan(getattr(sql, name), params)
    assert not seq_scans_of_history(p), json.dumps(p, indent=1)[:3000]
    assert index in index_scans(p) and "gen_durable_history_pkey" in index_scans(p)


@pytest.mark.parametrize("name, params", [
    ("REAP", {"limit": 1000, "history": True}),
    ("RECLAIM", {"queue": "q1", "prefix": "host:q1:", "margin": 20.0, "history": True}),
    ("ABANDON", {"ids": list(range(1, 51)), "worker": "w", "drain": 5.0, "history": True}),
])
def test_a_hand_back_reads_each_rows_newest_entry_through_the_index(timeline_rows, name, params):
    """The `lost` / `abandoned` entry starts at the end of the instance's newest entry
    when that is later than the claim: one backward step of gen_durable_history_instance
    per row handed back, never a scan of the timeline."""
    p = plan(getattr(sql, name), params)
    assert not seq_scans_of_history(p), json.dumps(p, indent=1)[:3000]
    assert "gen_durable_history_instance" in index_scans(p)


def test_the_admin_timeline_reads_the_newest_entries_of_one_instance(timeline_rows):
    from gen_durable.models import HistoryEntry

    qs = HistoryEntry.objects.filter(instance_id=42).order_by("-id")[:50]
    query, params = qs.query.sql_with_params()
    p = plan(query, params)
    assert not seq_scans_of_history(p) and "gen_durable_history_instance" in index_scans(p)


def test_the_bulk_walk_jumps_a_gap_by_one_primary_key_descent(scale):
    p = plan(sql.BULK_NEXT, {"after": 1000})
    assert not seq_scans_of_instances(p), json.dumps(p, indent=1)[:3000]
    assert index_scans(p) == {"gen_durable_pkey"}, json.dumps(p, indent=1)[:3000]
    assert any(n["Node Type"] == "Limit" for n in nodes(p))  # min(id) as the index's first entry, not an aggregate of all
