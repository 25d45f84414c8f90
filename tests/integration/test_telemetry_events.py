"""The telemetry events of gen_durable/telemetry.py's table that no other test asserts:
each is caused for real (a worker, a lost connection, a race, a deploy) and its
measurements and metadata checked; and a guard that every event of the table is
emitted by the engine and asserted by some test."""

import datetime as dt
import re
import threading
from pathlib import Path

import pytest
from django.db import connection, connections

import gen_durable as gd
from gen_durable import telemetry
from gen_durable.models import Instance
from gen_durable.testing import drain
from tests.conftest import wait_until
from tests.durable_app.durable import Plain
from tests.factories import HandedBackFactory, TerminalFactory

ROOT = Path(__file__).resolve().parents[2]
RELEASE = threading.Event()  # holds LongStep until the test lets it go


class LongStep(gd.Machine):
    """A step that runs until the test releases it (a shutdown cuts it off)."""

    name = "tests.events.LongStep"

    @gd.step
    def start(self, ctx):
        RELEASE.wait(30)
        return gd.Done({})


class LosesItsConnection(gd.Job):
    """Its first attempt's database session is terminated under it (by its own query)."""

    name = "tests.events.LosesItsConnection"

    def perform(self, args, ctx):
        if ctx.attempt == 0:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return None


def of(events, name):
    return [(m, md) for e, m, md in events if e == name]


# --- the guard -----------------------------------------------------------------------
def _table():
    return re.findall(r"^\| ([a-z_]+\.[a-z_]+) +\|", telemetry.__doc__, re.M)


def test_the_event_table_names_every_emitted_event_once():
    table = _table()
    assert len(table) == len(set(table))
    assert set(table) == set(telemetry.EVENTS)
    code = "\n".join(p.read_text() for p in (ROOT / "gen_durable").rglob("*.py"))
    emitted = set(re.findall(r'telemetry\.emit\(\s*"([a-z_]+\.[a-z_]+)"', code))
    emitted |= set(re.findall(r'event = "([a-z_]+\.[a-z_]+)"', code))  # limiter/postgres.py's contention
    emitted |= {"schedule.fired", "schedule.skipped"}  # schedules.py: one emit, either name
    assert emitted == set(table), (sorted(emitted - set(table)), sorted(set(table) - emitted))


def test_every_event_of_the_table_is_asserted_by_a_test():
    # by name, as the tests below do ("step.start" in a list of asserted events)
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    assert [e for e in _table() if f'"{e}"' not in tests] == []


# --- the events ----------------------------------------------------------------------
@pytest.mark.django_db
def test_step_start_names_the_step_before_it_runs(events, queue_name):
    id_ = gd.insert(Plain, queue=queue_name)
    drain(queue=queue_name)
    starts = of(events, "step.start")
    assert starts == [({}, {"id": id_, "fsm": "tests.Plain", "step": "start", "attempt": 0, "queue": queue_name})]
    names = [e for e, _, md in events if md.get("id") == id_ and e.startswith("step.")]
    assert names == ["step.start", "step.stop"]


def test_scheduler_saturation_after_each_pick_and_drain_at_shutdown(engine, committed, events, queue_name):
    sup = engine({queue_name: 3})
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(4)]
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 4, what="steps")
    saturation = [(m, md) for m, md in of(events, "scheduler.saturation") if md == {"queue": queue_name}]
    assert saturation
    for m, _ in saturation:  # in_flight: the claimed rows, running or buffered (claim-ahead)
        assert set(m) == {"in_flight", "buffer", "concurrency", "prefetch"}
        assert m["concurrency"] == 3 and m["in_flight"] >= 0 and m["buffer"] >= 0 and m["prefetch"] >= 0
    assert max(m["in_flight"] for m, _ in saturation) >= 1  # a pick that claimed says so
    sup.stop()
    assert [(m, md) for m, md in of(events, "scheduler.drain") if md == {"queue": queue_name}] == [
        ({"released": 0, "in_flight": 0}, {"queue": queue_name})]


def test_scheduler_abandoned_counts_the_steps_a_shutdown_cut_off(engine, committed, events, queue_name, settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "DRAIN_TIMEOUT": 0.2}
    RELEASE.clear()
    sup = engine({queue_name: 2})
    ids = [gd.insert(LongStep, queue=queue_name) for _ in range(2)]
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="executing").count() == 2, what="both running")
    try:
        sup.stop()
    finally:
        RELEASE.set()
    assert [m for m, md in of(events, "scheduler.drain") if md == {"queue": queue_name}] == [
        {"released": 0, "in_flight": 2}]
    assert of(events, "scheduler.abandoned") == [({"count": 2}, {"queue": queue_name})]
    assert set(Instance.objects.filter(id__in=ids).values_list("status", "attempt")) == {("runnable", 1)}


@pytest.mark.django_db
def test_schedule_fired_names_the_schedule_its_tick_and_lateness(events):
    from tests.integration.test_schedules import minutely, set_next

    from gen_durable.schedules import fire_due, sync

    cron = minutely("events-fired")
    sync(cron)
    set_next("events-fired", "date_trunc('minute', now())")
    ((name, tick, instance),) = fire_due(cron)
    assert name == "events-fired" and instance is not None
    ((m, md),) = of(events, "schedule.fired")
    assert m == {"count": 1}
    assert md["schedule"] == "events-fired" and md["tick"] == tick and 0 <= md["late"] < 60
    assert Instance.objects.get(id=instance).state == {"from": "events-fired"}


@pytest.mark.django_db
def test_gc_swept_counts_the_rows_it_deleted(events):
    from gen_durable.worker.maintenance import gc

    old = dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=3)
    TerminalFactory.create_batch(3, updated_at=old)
    TerminalFactory(updated_at=old, status="failed")
    TerminalFactory()  # recent: kept
    assert gc(retention=86400, batch=2) == 4
    assert of(events, "gc.swept") == [({"count": 4, "buckets": 0, "gates": 0}, {})]
    assert gc(retention=86400, batch=2) == 0
    assert len(of(events, "gc.swept")) == 1  # a sweep that did nothing is silent


def _claimed_entry(queue):
    from gen_durable.outcomes import Done
    from gen_durable.worker import claims, executor

    gd.insert(Plain, queue=queue)
    (job,) = claims.pick(queue, 1, "events-worker", 60)
    return job, executor.to_entry(Done({}), Plain, job, consumed=(), presented=())


def _terminate_own_session():
    """End this thread's database session from another one, and wait until it is gone."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    other = connections.create_connection("default")
    try:
        with other.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", [pid])

        def gone():
            with other.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
                return cur.fetchone()[0] == 0

        wait_until(gone, what="the terminated session to end")
    finally:
        other.close()


def test_flush_retry_when_the_flush_connection_was_lost_before_commit(committed, events, queue_name):
    from gen_durable.worker.flusher import Flusher

    job, entry = _claimed_entry(queue_name)
    _terminate_own_session()
    flusher = Flusher(retry_window=30)
    flusher._flush([(entry, None)])
    ((m, md),) = of(events, "flush.retry")
    assert m == {"count": 1, "delay": 0.0}  # at once the first time, on a new connection
    assert "OperationalError" in md["error"] or "InterfaceError" in md["error"]
    assert flusher.retries == 1
    assert [m["count"] for m, _ in of(events, "flush.stop")] == [1]
    assert Instance.objects.get(id=job.id).status == "done"


def test_flush_error_when_the_connection_stays_lost_past_the_retry_window(committed, events, queue_name):
    from gen_durable.worker.flusher import Flusher

    job, entry = _claimed_entry(queue_name)
    _terminate_own_session()
    failed = []
    Flusher(retry_window=0, on_failure=failed.append)._flush([(entry, None)])
    ((m, md),) = of(events, "flush.error")
    assert m == {"count": 1} and md["error"]
    assert of(events, "flush.retry") == [] and of(events, "flush.stop") == []
    assert failed == [[entry]]
    connection.close()
    assert Instance.objects.get(id=job.id).status == "executing"  # its lease recovers it


def test_step_connection_retry_when_a_step_loses_its_session(engine, committed, events, queue_name):
    engine({queue_name: 1})
    id_ = gd.insert(LosesItsConnection, queue=queue_name)
    wait_until(lambda: Instance.objects.get(id=id_).status == "done", timeout=20, what="the retried step")
    ((m, md),) = of(events, "step.connection_retry")
    assert md == {"id": id_, "fsm": "tests.events.LosesItsConnection", "step": "perform"}
    assert 0 < m["delay"] <= 1.0  # CONNECTION_RETRY_BASE, jittered
    row = Instance.objects.get(id=id_)
    assert (row.status, row.attempt) == ("done", 1)  # the retry cost an attempt


def test_rate_limit_contended_when_two_pickers_mint_one_cold_bucket(committed, events, queue_name, settings):
    """Another session mints the cold rate bucket first and has not committed: the
    pick's own mint waits on the unique key, fails once the other commits, and the
    admission retries against the winner's row."""
    from gen_durable.limiter import get_limiter
    from gen_durable.worker import claims

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"r": {"allowed": 10, "period": 1}}}
    limiter = get_limiter()
    ids = gd.insert_all([gd.Spec(Plain, queue=queue_name, rate_limit="r") for _ in range(2)])
    picked, pid, errors = [], [], []

    def picker():
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                pid.append(cur.fetchone()[0])
            picked.append(claims.pick(queue_name, 10, "picker", 60, gates=limiter.gate_names(), limiter=limiter))
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            errors.append(exc)
        finally:
            connection.close()

    holder = connections.create_connection("default")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cur:
            cur.execute("INSERT INTO gen_durable_buckets (kind, key, shard, capacity, available, last_refill) "
                        "VALUES ('rate', 'r', 0, 10, 10, now())")
        t = threading.Thread(target=picker)
        t.start()

        def waits_on_a_lock():
            with connection.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                            [pid[0] if pid else -1])
                return cur.fetchone()[0] == 1

        wait_until(waits_on_a_lock, what="the pick's mint to wait on the other session's")
        holder.commit()
    finally:
        holder.close()
    t.join(30)
    assert errors == []
    assert sorted(j.id for j in picked[0]) == ids
    assert of(events, "rate_limit.contended") == [({"count": 1}, {"queue": queue_name})]
    with connection.cursor() as cur:
        cur.execute("SELECT count(*), min(available) FROM gen_durable_buckets WHERE kind = 'rate' AND key = 'r'")
        count, available = cur.fetchone()
    assert count == 1 and available <= 8  # the winner's row, debited by this pick


def test_pick_unknown_and_scheduler_adopted_in_a_rolling_deploy(engine, committed, events, queue_name, monkeypatch):
    from gen_durable import registry
    from gen_durable.worker.claims import pick
    from tests.durable_app.deploy_machines import Added

    ids = [gd.insert(Added, queue=queue_name) for _ in range(3)]
    # This process "is" the old release: Added unregistered.
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))
    monkeypatch.setattr(registry, "_known", None)
    assert pick(queue_name, 10, "w-old", 30) == []
    assert of(events, "pick.unknown") == [({"count": 3}, {"queue": queue_name})]
    monkeypatch.undo()
    registry._known = None
    # The new release's worker makes them eligible again, then runs them.
    engine({queue_name: 2})
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 3, timeout=20,
               what="the adopted rows to run")
    adopted = of(events, "scheduler.adopted")  # in batches of the queue's demand
    assert sum(m["count"] for m, _ in adopted) == 3 and {md["queue"] for _, md in adopted} == {queue_name}


def test_scheduler_adopted_only_for_rows_this_process_knows(engine, committed, events, queue_name):
    known = HandedBackFactory(fsm="tests.Plain", queue=queue_name)
    unknown = HandedBackFactory(fsm="tests.NoSuchMachine", queue=queue_name)
    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.get(id=known.id).status == "done", timeout=20, what="the known row")
    assert of(events, "scheduler.adopted") == [({"count": 1}, {"queue": queue_name})]
    assert Instance.objects.get(id=unknown.id).status == "runnable"
