"""Signals: delivery, dedup, name matching, Await semantics, timeouts and the lost
wake-up (docs/guide.md, docs/design.md#signals)."""

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import gen_durable as gd
from gen_durable import sql, telemetry
from gen_durable.models import Instance, Signal
from gen_durable.testing import assert_awaiting, assert_done, assert_failed, drain, fire_timeouts
from gen_durable.worker import flusher
from gen_durable.worker.claims import pick
from gen_durable.worker.executor import execute
from gen_durable.worker.maintenance import expire_awaits
from tests.conftest import wait_until
from tests.helpers import ConnectionThread, PausingDb
from tests.durable_app.durable import Plain
from tests.durable_app.signal_machines import (
    AwaitRetry,
    Collector,
    Consumer,
    Recorder,
    StopOnWake,
)
from tests.factories import TerminalFactory


def inbox(id_):
    """The names in an instance's inbox, by id."""
    return list(Signal.objects.filter(target_id=id_).order_by("id").values_list("name", flat=True))


def row(id_):
    return Instance.objects.get(id=id_)


def park(machine, queue, **kw):
    """Insert `machine` and run it until it parks; return its id."""
    id_ = gd.insert(machine, queue=queue, **kw)
    assert drain(queue)["await"] == 1
    return id_


def _waits_on_lock(pid):
    with connection.cursor() as cur:
        cur.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        found = cur.fetchone()
    return found is not None and found[0] == "Lock"


# --- delivery -----------------------------------------------------------------------


@pytest.mark.django_db
def test_signal_is_one_statement_by_id_and_by_key(queue_name, django_assert_num_queries):
    id_ = gd.insert(Recorder, queue=queue_name, correlation_key=f"order-{queue_name}")
    with django_assert_num_queries(1):
        by_id = gd.signal(id_, "x", {"n": 1})
    with django_assert_num_queries(1):
        by_key = gd.signal(f"order-{queue_name}", "y", {"n": 2})
    assert isinstance(by_id, int) and isinstance(by_key, int) and by_key > by_id
    assert list(Signal.objects.filter(target_id=id_).values_list("name", "payload")) == [
        ("x", {"n": 1}), ("y", {"n": 2})]


@pytest.mark.django_db
def test_signal_to_a_terminal_missing_or_unknown_target_raises_no_target_and_stores_nothing(queue_name):
    done = row(gd.insert(Plain, queue=queue_name, correlation_key=f"gone-{queue_name}"))
    drain(queue_name)
    assert_done(done.id)
    failed = TerminalFactory(queue=queue_name, status="failed", result=None)
    with pytest.raises(gd.NoTarget):
        gd.signal(done.id, "go")
    with pytest.raises(gd.NoTarget):
        gd.signal(failed.id, "go")
    with pytest.raises(gd.NoTarget):
        gd.signal(done.id + 1000, "go")
    with pytest.raises(gd.NoTarget):
        gd.signal(f"gone-{queue_name}", "go")  # a terminal row's key is freed (default scope)
    with pytest.raises(gd.NoTarget):
        gd.signal(f"nope-{queue_name}", "go")
    assert not Signal.objects.exists()


@pytest.mark.django_db
def test_dedup_key_redelivery_is_a_no_op_and_none_keys_never_conflict(queue_name):
    id_ = gd.insert(Recorder, queue=queue_name)
    first = gd.signal(id_, "go", {"n": 1}, dedup_key="k1")
    assert isinstance(first, int)
    assert gd.signal(id_, "go", {"n": 2}, dedup_key="k1") is None
    assert gd.signal(id_, "go", {"n": 3}) is not None
    assert gd.signal(id_, "go", {"n": 4}) is not None
    assert sorted(Signal.objects.filter(target_id=id_).values_list("payload", flat=True),
                  key=lambda p: p["n"]) == [{"n": 1}, {"n": 3}, {"n": 4}]
    # the dedup key is per target: another instance may receive "k1"
    other = gd.insert(Recorder, queue=queue_name)
    assert gd.signal(other, "go", dedup_key="k1") is not None


def test_concurrent_duplicate_deliveries_of_one_dedup_key_store_one_row(transactional_db, queue_name):
    id_ = gd.insert(Recorder, queue=queue_name)
    barrier = threading.Barrier(8)

    def deliver():
        barrier.wait(10)
        return gd.signal(id_, "go", {"from": threading.get_ident()}, dedup_key="pay-1")

    threads = [ConnectionThread(deliver) for _ in range(8)]
    for t in threads:
        t.start()
    returned = [t.join_result() for t in threads]
    assert sum(r is not None for r in returned) == 1
    assert Signal.objects.filter(target_id=id_).count() == 1
    assert Signal.objects.get(target_id=id_).id == next(r for r in returned if r is not None)


@pytest.mark.django_db
def test_wake_only_on_a_name_match_and_the_woken_row_keeps_its_awaits(queue_name):
    id_ = park(Recorder, queue_name, state={"names": ["go", "stop"]})
    gd.signal(id_, "other", {"n": 0})
    assert_awaiting(id_, ["go", "stop"])
    gd.signal(id_, "go", {"n": 1})
    r = row(id_)
    assert r.status == "runnable" and r.awaits == ["go", "stop"]
    assert inbox(id_) == ["other", "go"]


@pytest.mark.django_db
def test_a_key_with_empty_correlation_scope_is_neither_unique_nor_addressable(queue_name):
    key = f"free-{queue_name}"
    a = gd.insert(Recorder, queue=queue_name, correlation_key=key, correlation_scope=[])
    b = gd.insert(Recorder, queue=queue_name, correlation_key=key, correlation_scope=[])
    assert a != b
    with pytest.raises(gd.NoTarget):
        gd.signal(key, "go")
    assert gd.get(key) is None
    assert not Signal.objects.exists()
    assert gd.signal(a, "go") is not None  # by id it is addressable


@pytest.mark.django_db
def test_a_parked_row_outside_its_correlation_scope_is_unreachable_by_key(queue_name):
    key = f"scoped-{queue_name}"
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]}, correlation_key=key,
                    correlation_scope=["runnable", "executing"])
    assert gd.signal(key, "noise") is not None  # runnable: in scope, addressable
    assert drain(queue_name)["await"] == 1
    assert_awaiting(id_, ["go"])
    with pytest.raises(gd.NoTarget):
        gd.signal(key, "go")
    assert inbox(id_) == ["noise"]
    gd.signal(id_, "go")
    assert row(id_).status == "runnable"


# --- Await semantics through drain ---------------------------------------------------


@pytest.mark.django_db
def test_awaited_is_the_matched_subset_in_id_order_and_all_is_the_whole_inbox(queue_name):
    id_ = park(Recorder, queue_name, state={"names": ["a", "b"]})
    x = gd.signal(id_, "x", 0)
    b = gd.signal(id_, "b", 2)
    a = gd.signal(id_, "a", 1)
    assert drain(queue_name)["done"] == 1
    result = row(id_).result
    assert [(s["id"], s["name"]) for s in result["awaited"]] == [(b, "b"), (a, "a")]
    assert [(s["id"], s["name"]) for s in result["all"]] == [(x, "x"), (b, "b"), (a, "a")]
    assert inbox(id_) == []


@pytest.mark.django_db
def test_a_progressing_outcome_consumes_only_the_ids_it_was_handed(queue_name):
    id_ = park(Consumer, queue_name)
    first = gd.signal(id_, "go", 1)
    [job] = pick(queue_name, 10, "w-consume", 30)
    assert [s.id for s in job.inbox] == [first]
    late = gd.signal(id_, "go", 2)  # arrives after the pick, before the outcome commits
    entry = execute(job)
    assert entry.kind == "next" and entry.consumed == (first,)
    assert flusher.flush([entry]).committed == {id_: "runnable"}
    assert list(Signal.objects.filter(target_id=id_).values_list("id", flat=True)) == [late]
    assert row(id_).awaits is None
    drain(queue_name)  # "again" re-awaits "go": the latecomer wakes it at once
    assert_done(id_, {"first": [1], "second": [2]})
    assert inbox(id_) == []


@pytest.mark.django_db
def test_retry_keeps_the_awaited_signals(queue_name):
    id_ = park(AwaitRetry, queue_name)
    gd.signal(id_, "go", {"v": 5})
    tally = drain(queue_name)
    assert tally["retry"] == 1
    assert_done(id_, {"v": 5, "attempt": 1})


@pytest.mark.django_db
def test_a_pack_accumulates_across_wakes_delivered_out_of_order(queue_name):
    id_ = park(Collector, queue_name)
    for name, value in (("b", 2), ("a", 1), ("c", 4)):
        gd.signal(id_, name, value)
        drain(queue_name)
    assert_done(id_, {"sum": 7, "count": 3, "wakes": 3})
    assert inbox(id_) == []


@pytest.mark.django_db
def test_reawait_with_unconsumed_inputs_parks_until_a_new_arrival(queue_name):
    id_ = park(Collector, queue_name)
    gd.signal(id_, "b", 2)
    # One wake, one re-await; the presented "b" must not wake it again (no spinning).
    assert drain(queue_name, max_steps=5) == {"steps": 1, "await": 1}
    r = assert_awaiting(id_, ["a", "b", "c"])
    assert r["state"] == {"wakes": 1} and inbox(id_) == ["b"]
    gd.signal(id_, "noise", 0)  # not awaited: no wake either
    assert drain(queue_name, max_steps=5) == {}
    gd.signal(id_, "a", 1)  # a new matching arrival wakes it
    assert drain(queue_name, max_steps=5) == {"steps": 1, "await": 1}
    assert assert_awaiting(id_, "c")["state"] == {"wakes": 2}
    assert inbox(id_) == ["b", "noise", "a"]


@pytest.mark.django_db
@pytest.mark.filterwarnings("ignore::gen_durable.UnawaitedSignalWarning")  # the "noise", on purpose
def test_a_terminal_outcome_clears_the_inbox(queue_name):
    done = park(Recorder, queue_name, state={"names": ["go"]})
    stopped = park(StopOnWake, queue_name)
    plain = gd.insert(Plain, queue=queue_name)
    for id_ in (done, stopped):
        gd.signal(id_, "noise", 0)
        gd.signal(id_, "go", 1)
    gd.signal(plain, "noise", 0)  # a stray signal before it ever runs
    drain(queue_name)
    assert_done(done)
    assert_failed(stopped, "stopped on wake")
    assert_done(plain)
    assert not Signal.objects.filter(target_id__in=[done, stopped, plain]).exists()


@pytest.mark.django_db
def test_a_signal_before_the_park_is_seen_by_the_recheck(queue_name):
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    gd.signal(id_, "go", {"early": True})  # stored for a runnable row, no flip
    assert row(id_).status == "runnable"
    tally = drain(queue_name)
    assert tally == {"steps": 2, "await": 1, "done": 1}
    assert [s["payload"] for s in row(id_).result["awaited"]] == [{"early": True}]


# --- timeouts -----------------------------------------------------------------------


@pytest.mark.django_db
def test_await_timeout_wakes_the_step_with_nothing_awaited(queue_name):
    timed = park(Recorder, queue_name, state={"names": ["go"], "timeout": 3600})
    untimed = park(Recorder, queue_name, state={"names": ["go"]})
    assert row(timed).await_deadline is not None and row(untimed).await_deadline is None
    assert fire_timeouts() == 1
    r = row(timed)
    assert (r.status, r.awaits, r.attempt, r.await_deadline) == ("runnable", ["go"], 0, None)
    drain(queue_name)
    assert_done(timed, {"awaited": [], "all": [], "timed_out": True})
    assert_awaiting(untimed, "go")


@pytest.mark.django_db
def test_expire_awaits_fires_past_deadlines_only_and_emits_await_timeout(queue_name):
    past = park(Recorder, queue_name, state={"names": ["go"], "timeout": 3600})
    future = park(Recorder, queue_name, state={"names": ["go"], "timeout": 3600})
    Instance.objects.filter(id=past).update(await_deadline=row(past).await_deadline.replace(year=2000))
    events = []

    def handler(event, measurements, metadata):
        events.append((event, measurements))

    telemetry.attach("await.", handler)
    try:
        assert expire_awaits() == [past]
        assert expire_awaits() == []
    finally:
        telemetry.detach(handler)
    assert events == [("await.timeout", {"count": 1})]
    assert_awaiting(future, "go")
    drain(queue_name)
    assert_done(past, {"awaited": [], "all": [], "timed_out": True})


@pytest.mark.django_db
def test_a_signal_before_the_deadline_beats_the_timeout(queue_name):
    id_ = park(Recorder, queue_name, state={"names": ["go"], "timeout": 3600})
    gd.signal(id_, "go", {"paid": 10})
    r = row(id_)
    assert r.status == "runnable" and r.await_deadline is None
    assert fire_timeouts() == 0
    drain(queue_name)
    result = row(id_).result
    assert result["timed_out"] is False and [s["payload"] for s in result["awaited"]] == [{"paid": 10}]


# --- statement counts -----------------------------------------------------------------


def test_an_await_park_flush_is_two_statements(transactional_db, queue_name):
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    [job] = pick(queue_name, 1, "w-count", 30)
    entry = execute(job)
    with CaptureQueriesContext(connection) as captured:
        result = flusher.flush([entry])
    assert result.committed == {id_: "awaiting_signal"}
    # flush.sql + park_recheck.sql in one transaction (the documented exception,
    # docs/design.md#signals); Django logs the transaction's BEGIN and COMMIT too. The
    # attempt's timeline entry follows the commit (docs/design.md#history).
    heads = [q["sql"].splitlines()[0] for q in captured.captured_queries]
    assert heads == ["BEGIN", sql.FLUSH.splitlines()[0], sql.PARK_RECHECK.splitlines()[0], "COMMIT",
                     "BEGIN", sql.HISTORY_BEGIN.splitlines()[0], sql.HISTORY_INSERT.splitlines()[0], "COMMIT"]


# --- the lost wake-up, deterministic with two sessions ----------------------

# A copy of signal.sql with the bug of the original issue #1: the flip condition in the
# wake's WHERE instead of a CASE. Built from the real text so only the wake differs.
_HEAD, _REST = sql.SIGNAL.split("), wake AS (", 1)
_WAKE, _TAIL = _REST.split("RETURNING g.id, g.status, g.queue\n)", 1)
assert "CASE WHEN g.status = 'awaiting_signal'" in _WAKE and "WHERE g.id = t.id" in _WAKE
SIGNAL_FLIP_IN_WHERE = (
    _HEAD + "), wake AS (\n"
    "    UPDATE gen_durable g\n"
    "    SET status = 'runnable', eligible_at = now(), await_deadline = NULL, updated_at = now()\n"
    "    FROM target t\n"
    "    WHERE g.id = t.id AND g.status = 'awaiting_signal' AND %(name)s::text = ANY (g.awaits)\n"
    "    RETURNING g.id, g.status, g.queue\n)" + _TAIL
)


def _deliver_with(text):
    def deliver(id_):
        params = {"id": id_, "key": None, "name": "go", "payload": '{"v": 1}', "dedup_key": None}
        with connection.cursor() as cur:
            cur.execute(text, params)
            return cur.fetchone()[0]
    return deliver


def _park_first(monkeypatch, queue_name, deliver):
    """Session A parks (row lock held, recheck not yet run); session B delivers "go" in
    its own transaction; A rechecks and commits; then B commits.

    Returns (id, how B's delivery statement went — "blocked" on A's row lock or
    "returned" at once —, A's FlushResult).
    """
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    [job] = pick(queue_name, 1, "worker-A", 30)
    entry = execute(job)
    assert entry.kind == "await"

    parked, go_recheck = threading.Event(), threading.Event()
    b_ready, b_statement_done, a_committed = threading.Event(), threading.Event(), threading.Event()
    b_pid = {}

    def before_recheck():
        parked.set()
        assert go_recheck.wait(30)

    monkeypatch.setattr(flusher, "db", PausingDb({sql.PARK_RECHECK: before_recheck}))
    session_a = ConnectionThread(lambda: flusher.flush([entry]))
    session_a.start()
    assert parked.wait(30), "session A never parked"

    def b():
        connection.ensure_connection()
        b_pid["pid"] = connection.connection.info.backend_pid
        b_ready.set()
        with transaction.atomic():
            sid = deliver(id_)
            b_statement_done.set()
            assert a_committed.wait(30)
        return sid

    session_b = ConnectionThread(b)
    session_b.start()
    assert b_ready.wait(30)
    how = wait_until(lambda: ("returned" if b_statement_done.is_set() else
                              "blocked" if _waits_on_lock(b_pid["pid"]) else None),
                     what="session B to block on the row lock or finish its statement")
    go_recheck.set()
    result = session_a.join_result()
    a_committed.set()
    assert isinstance(session_b.join_result(), int)
    return id_, how, result


def test_a_signal_racing_the_park_is_not_lost_park_first(transactional_db, queue_name, monkeypatch):
    id_, how, result = _park_first(monkeypatch, queue_name,
                                   lambda id_: gd.signal(id_, "go", {"v": 1}))
    assert how == "blocked"  # the wake queued behind the park's row lock
    assert result.committed == {id_: "awaiting_signal"}  # B's signal was invisible to the recheck
    r = row(id_)
    assert r.status == "runnable" and r.await_deadline is None  # B's wake re-evaluated the parked row
    assert inbox(id_) == ["go"]
    monkeypatch.undo()
    drain(queue_name)
    assert [s["payload"] for s in row(id_).result["awaited"]] == [{"v": 1}]


def test_negative_control_flip_in_where_loses_the_wakeup(transactional_db, queue_name, monkeypatch):
    """The scenario above with the original bug: proves the test detects it."""
    id_, _, result = _park_first(monkeypatch, queue_name, _deliver_with(SIGNAL_FLIP_IN_WHERE))
    # B may queue behind the park on the target's lock, but its status-filtered wake
    # judges the pre-park row of its snapshot and skips it without re-evaluation.
    assert result.committed == {id_: "awaiting_signal"}
    assert_awaiting(id_, "go")  # parked forever ...
    assert inbox(id_) == ["go"]  # ... with its wake-up in the inbox


def test_the_real_signal_sql_passes_the_same_harness(transactional_db, queue_name, monkeypatch):
    """The raw-cursor path of the negative control, with the shipped text: runnable."""
    id_, how, _ = _park_first(monkeypatch, queue_name, _deliver_with(sql.SIGNAL))
    assert how == "blocked"
    assert row(id_).status == "runnable"


def test_a_signal_racing_a_terminal_outcome_raises_no_target_and_stores_nothing(
        transactional_db, queue_name, monkeypatch):
    """Session A commits a Done (row lock held, not yet committed) while session B
    signals: B must wait, see the terminal row and raise NoTarget — never leave an
    orphan signal in a finished instance's inbox."""
    id_ = park(Recorder, queue_name, state={"names": ["go"]})
    gd.signal(id_, "go", 1)
    [job] = pick(queue_name, 1, "worker-A", 30)
    entry = execute(job)
    assert entry.kind == "done"
    flushed, finish = threading.Event(), threading.Event()

    def after_flush(*_):
        flushed.set()
        assert finish.wait(30)

    monkeypatch.setattr(flusher, "db", PausingDb({sql.FLUSH: after_flush}, after=True))
    a = ConnectionThread(lambda: flusher.flush([entry]))
    a.start()
    assert flushed.wait(30)
    b_pid = {}

    def b():
        connection.ensure_connection()
        b_pid["pid"] = connection.connection.info.backend_pid
        return gd.signal(id_, "late", {"v": 2})

    session_b = ConnectionThread(b)
    session_b.start()
    wait_until(lambda: "pid" in b_pid and _waits_on_lock(b_pid["pid"]), what="B to wait for A's row lock")
    finish.set()
    assert a.join_result().committed == {id_: "done"}
    with pytest.raises(gd.NoTarget):
        session_b.join_result()
    assert inbox(id_) == []


def test_a_signal_racing_the_park_is_not_lost_deliver_first(transactional_db, queue_name, monkeypatch):
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    [job] = pick(queue_name, 1, "worker-A", 30)
    entry = execute(job)
    opened, delivered = threading.Event(), threading.Event()
    seen_before_recheck = {}

    def before_recheck():
        with connection.cursor() as cur:
            cur.execute("SELECT status::text FROM gen_durable WHERE id = %s", [id_])
            seen_before_recheck["status"] = cur.fetchone()[0]

    monkeypatch.setattr(flusher, "db", PausingDb({sql.PARK_RECHECK: before_recheck}))

    def session_a():
        with transaction.atomic():
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
            opened.set()
            assert delivered.wait(30)
            return flusher.flush([entry])

    a = ConnectionThread(session_a)
    a.start()
    assert opened.wait(30)
    gd.signal(id_, "go", {"v": 2})  # B: delivered to the still-executing row, committed
    assert row(id_).status == "executing" and inbox(id_) == ["go"]
    delivered.set()
    result = a.join_result()
    assert seen_before_recheck == {"status": "awaiting_signal"}  # the park happened ...
    assert result.committed == {id_: "runnable"}  # ... and the recheck woke it
    assert row(id_).status == "runnable"
