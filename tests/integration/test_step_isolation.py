"""One step never poisons its thread, its worker or later steps: a transaction a step
leaves open is rolled back and discarded, whatever a step raises gets one recorded
outcome with a readable last_error, and user backoff values never overflow
(docs/design.md#isolation)."""

import logging
import threading
import uuid
import time

import pytest
from django.db import connection, connections, transaction

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import assert_failed, drain
from gen_durable.worker import scheduler
from tests.conftest import wait_until
from tests.helpers import record_rechecks

SIDE = "gd_test_side_effects"


@pytest.fixture
def side_table(transactional_db):
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {SIDE} (instance bigint PRIMARY KEY)")
        cur.execute(f"TRUNCATE {SIDE}")
    yield
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {SIDE}")


def _read_committed():
    """Side-effect rows as a second session sees them (only committed ones)."""
    import psycopg

    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as raw:
        return {r[0] for r in raw.execute(f"SELECT instance FROM {SIDE}").fetchall()}


class Leaky(gd.Machine):
    """Writes a side-effect row; the instance whose state says so leaves a transaction open."""

    name = "tests.isolation.Leaky"

    @gd.step
    def start(self, ctx):
        how = ctx.state.get("leak")
        if how == "atomic":
            transaction.atomic().__enter__()  # entered, never exited
        elif how == "begin":
            with connection.cursor() as cur:
                cur.execute("BEGIN")
        with connection.cursor() as cur:
            cur.execute(f"INSERT INTO {SIDE} (instance) VALUES (%s)", [ctx.id])
        return gd.Done()


@pytest.mark.parametrize("leak", ["atomic", "begin"])
def test_a_transaction_a_step_leaves_open_never_swallows_later_steps(engine, queue_name, side_table,
                                                                   monkeypatch, caplog, leak):
    # Persistent connections: without the clean-up, later steps on the same thread
    # write into the open transaction (raw BEGIN) or fail on the closed connection
    # (atomic block), while their instances are marked done.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", None)
    bad = gd.insert(Leaky, state={"leak": leak}, queue=queue_name)
    good = gd.insert_all([gd.Spec(Leaky, queue=queue_name) for _ in range(20)])
    caplog.set_level(logging.WARNING, logger="gen_durable.db")
    engine({queue_name: 1})  # one step thread: every step runs after the leaky one on it
    ids = [bad, *good]
    wait_until(lambda: Instance.objects.filter(id__in=ids, status__in=["done", "failed"]).count() == 21,
               timeout=30, what="every instance terminal")
    assert set(Instance.objects.filter(id__in=good, status="done").values_list("id", flat=True)) == set(good)
    assert _read_committed() == set(good)  # every done instance's write is durable
    row = assert_failed(bad, "TransactionLeftOpen")
    assert "tests.isolation.Leaky.start" in row["last_error"]
    assert any("tests.isolation.Leaky.start" in r.getMessage() and "rolled back" in r.getMessage()
               for r in caplog.records)


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")

    def __repr__(self):
        raise RuntimeError("no repr either")


class RaisesUnprintable(gd.Machine):
    name = "tests.isolation.RaisesUnprintable"

    @gd.step
    def start(self, ctx):
        raise Unprintable()


@gd.job(name="tests.isolation.unprintable_job", max_attempts=3)
def unprintable_job(args):
    raise Unprintable()


@pytest.mark.django_db
def test_an_exception_whose_repr_and_str_raise_fails_the_machine_once_with_a_readable_error():
    id_ = gd.insert(RaisesUnprintable)
    assert drain()["stop"] == 1
    row = assert_failed(id_, "Unprintable")
    assert row["attempt"] == 0


@pytest.mark.django_db
def test_a_job_raising_an_unprintable_exception_is_retried_by_its_backoff_then_failed():
    id_ = gd.insert(unprintable_job)
    tally = drain()
    assert tally["retry"] == 2 and tally["stop"] == 1
    row = assert_failed(id_, "Unprintable")
    assert row["attempt"] == 2


@gd.job(name="tests.isolation.exponential", max_attempts=10**6, backoff=lambda attempt: 2 ** attempt)
def exponential(args):
    raise ValueError("flaky")


@pytest.mark.django_db
def test_a_user_backoff_of_2_to_the_attempt_is_clamped_not_an_overflow():
    id_ = gd.insert(exponential)
    Instance.objects.filter(id=id_).update(attempt=1024)
    drain(with_scheduled=False)  # the retry is ten years away: one step
    row = Instance.objects.get(id=id_)
    assert (row.status, row.attempt) == ("runnable", 1025)
    assert row.last_error.startswith("ValueError: flaky")


RAN: list = []
GATE = __import__("threading").Event()


class Blocker(gd.Machine):
    """The first instance holds the only step thread until GATE opens; others record that they ran."""

    name = "tests.isolation.Blocker"

    @gd.step
    def start(self, ctx):
        if ctx.state.get("block"):
            GATE.wait(30)
        else:
            RAN.append(ctx.id)
        return gd.Done()


def _blockers(kind):
    """(machine, gate, ran) of the sync or the `async def` blocker."""
    if kind == "sync":
        return Blocker, GATE, RAN
    from tests.durable_app.async_machines import ASYNC_GATE, ASYNC_RAN, AsyncBlocker

    return AsyncBlocker, ASYNC_GATE, ASYNC_RAN


def _buffered_behind_a_blocker(engine, queue_name, settings, blocker_cls, gate, ran, n):
    """One slot, busy with a blocking row; `n` rows claimed into the buffer behind it
    (PREFETCH) and left there past RECHECK_FRESH. Returns (blocker id, buffered ids)."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 5}
    ran.clear()
    gate.clear()
    blocker = gd.insert(blocker_cls, state={"block": True}, queue=queue_name)
    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.filter(id=blocker, status="executing").exists(), what="blocker running")
    buffered = gd.insert_all([gd.Spec(blocker_cls, queue=queue_name) for _ in range(n)])
    wait_until(lambda: Instance.objects.filter(id__in=buffered, status="executing").count() == n,
               timeout=30, what=f"{n} rows claimed into the buffer")
    time.sleep(scheduler.RECHECK_FRESH * 2)
    return blocker, buffered


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_row_cancelled_while_buffered_never_runs_its_step(engine, queue_name, settings, kind):
    """A row claimed beyond the free slots (PREFETCH) is re-checked before its step starts,
    for sync and `async def` steps alike."""
    Blocker, GATE, RAN = _blockers(kind)  # noqa: N806 (the module's names, per kind)
    # The claim proves a row ours for RECHECK_FRESH s (a cancel within it is caught by
    # the flush guard, as for a running step); this cancel comes after it.
    blocker, buffered = _buffered_behind_a_blocker(engine, queue_name, settings, Blocker, GATE, RAN, 3)
    for id_ in buffered:
        gd.cancel(id_, "customer left")
    GATE.set()
    wait_until(lambda: Instance.objects.filter(id=blocker, status="done").exists(), timeout=30, what="blocker done")
    later = gd.insert(Blocker, queue=queue_name)  # the slot goes on with fresh work
    wait_until(lambda: Instance.objects.filter(id=later, status="done").exists(), timeout=30, what="later done")
    assert RAN == [later]  # no cancelled row ran its step
    assert set(Instance.objects.filter(id__in=buffered).values_list("status", flat=True)) == {"failed"}


def test_buffered_rows_past_their_window_are_rechecked_in_one_statement(engine, queue_name, settings, monkeypatch):
    """Four rows wait in the buffer past RECHECK_FRESH: the first to start re-checks all
    four in one still_owned statement (not one round trip each), and all of them run."""
    calls = record_rechecks(monkeypatch)
    _blocker, buffered = _buffered_behind_a_blocker(engine, queue_name, settings, Blocker, GATE, RAN, 4)
    GATE.set()
    wait_until(lambda: Instance.objects.filter(id__in=buffered, status="done").count() == 4, timeout=30,
               what="buffered rows done")
    assert calls == [sorted(buffered)]
    assert sorted(RAN) == sorted(buffered)


class LeakyHandle(gd.Machine):
    """`start` hangs past its 0.3 s timeout (until its gate opens); the handle() that gets
    the StepTimeout leaves an atomic block open."""

    name = "tests.isolation.LeakyHandle"

    @gd.step(timeout=0.3)
    def start(self, ctx):
        from tests.durable_app.time_machines import hang

        hang(ctx)
        return gd.Done({"late": True})

    def handle(self, error, ctx):
        transaction.atomic().__enter__()  # entered, never exited
        return gd.Done({"handled": type(error).__name__})


def test_a_transaction_left_open_by_handle_after_a_step_timeout_is_not_blamed_on_the_next_step(
        engine, queue_name, side_table, monkeypatch, caplog):
    # handle(StepTimeout) runs on a live step thread outside the step path that cleans
    # up after user code; the thread is trusted clean before each step, so what handle()
    # leaves open must be rolled back there, not found by (and failing) the next step.
    from tests.durable_app.time_machines import gate

    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", None)
    name = f"g{uuid.uuid4().hex[:8]}"
    caplog.set_level(logging.WARNING, logger="gen_durable.db")
    try:
        bad = gd.insert(LeakyHandle, state={"gate": name}, queue=queue_name)
        engine({queue_name: 1})
        wait_until(lambda: Instance.objects.get(id=bad).status in ("done", "failed"), timeout=30,
                   what="the timed-out step handled")
        good = gd.insert_all([gd.Spec(Leaky, queue=queue_name) for _ in range(3)])
        wait_until(lambda: Instance.objects.filter(id__in=good, status__in=["done", "failed"]).count() == 3,
                   timeout=30, what="the later steps terminal")
        assert set(Instance.objects.filter(id__in=good, status="done").values_list("id", flat=True)) == set(good)
        assert _read_committed() == set(good)
        row = assert_failed(bad, "TransactionLeftOpen")
        assert "handle() of tests.isolation.LeakyHandle.start" in row["last_error"]
    finally:
        gate(name).set()


class Quick(gd.Machine):
    name = "tests.isolation.Quick"

    @gd.step
    def start(self, ctx):
        with connection.cursor() as cur:  # the step thread opens its connection
            cur.execute("SELECT 1")
        return gd.Done()


def test_a_step_thread_failing_after_its_step_gives_back_its_slot_and_is_replaced(engine, queue_name, monkeypatch,
                                                                               caplog):
    """The end-of-step connection checks raise once (an engine fault outside any step):
    that step's outcome still commits, the thread leaves giving back the slot it held,
    and another thread runs the rest. Without that, the queue's only slot stays taken
    and nothing more runs (concurrency 1 here)."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    real = BaseDatabaseWrapper.close_if_unusable_or_obsolete
    failed = []

    def once(self):
        if not failed and threading.current_thread().name.startswith("gd-step-"):
            failed.append(threading.current_thread().name)
            raise RuntimeError("injected: end-of-step check failed")
        return real(self)

    monkeypatch.setattr(BaseDatabaseWrapper, "close_if_unusable_or_obsolete", once)
    caplog.set_level(logging.ERROR, logger="gen_durable.scheduler")
    ids = gd.insert_all([gd.Spec(Quick, queue=queue_name) for _ in range(10)])
    sup = engine({queue_name: 1})
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 10, timeout=30,
               what="every instance done after the thread failure")
    sched = sup.schedulers[queue_name]
    wait_until(lambda: sched.running == 0 and not sched.in_flight, timeout=10, what="slots all given back")
    assert failed and any("failed outside a step" in r.getMessage() for r in caplog.records)
