"""Timers fire on time: Await deadlines and scheduled rows, without the reaper or polling.

Each engine test sets the poll interval and the reaper far beyond its bounded wait, so
only the per-process timer can make the row move in time (docs/guide.md "Time").
"""

import threading

import pytest
from django.db import connection, connections
from django.test import override_settings

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker.maintenance import expire_awaits
from gen_durable.worker.timers import Timer, next_timers
from tests.conftest import wait_until
from tests.durable_app.time_machines import Recorder, retries_once
from tests.factories import InstanceFactory

SLOW = {"EXTRA_QUEUES": ["q*"], "POLL_INTERVAL": 30, "MAX_POLL_INTERVAL": 60, "REAPER": {"INTERVAL": 3600},
        "LEASE_TTL": 60, "HEARTBEAT_INTERVAL": 20, "GC": False}
WAIT = 15.0  # bounded wait: far below the 30-60 s the poll would take, generous under load


def status(id_):
    return Instance.objects.get(id=id_).status


def listening(sup):
    """Bounded wait for the worker's LISTEN: a due insert before it would wait for the poll."""
    wait_until(lambda: sup.listener.connects >= 1 and sup.timer.reads >= 1, timeout=WAIT, what="worker listening")
    return sup


@override_settings(GEN_DURABLE=SLOW)
def test_await_timeout_fires_without_reaper_or_poll(engine, queue_name):
    listening(engine({queue_name: 2}, reaper=False, gc=False))
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"], "timeout": 1})
    wait_until(lambda: status(id_) == "awaiting_signal", timeout=WAIT, what="parked")
    wait_until(lambda: status(id_) == "done", timeout=WAIT, what="await timeout fired and step ran")
    assert Instance.objects.get(id=id_).result["timed_out"] is True


@override_settings(GEN_DURABLE=SLOW)
def test_schedule_in_starts_without_poll(engine, queue_name):
    listening(engine({queue_name: 2}, reaper=False, gc=False))
    id_ = gd.insert(Recorder, queue=queue_name, schedule_in=1.0, state={"names": ["go"], "timeout": 3600})
    wait_until(lambda: status(id_) == "awaiting_signal", timeout=WAIT, what="scheduled row ran")


@override_settings(GEN_DURABLE=SLOW)
def test_retry_backoff_starts_without_poll(engine, queue_name):
    listening(engine({queue_name: 2}, reaper=False, gc=False))
    id_ = gd.insert(retries_once, queue=queue_name)
    wait_until(lambda: status(id_) == "done", timeout=WAIT, what="retried after its backoff")
    assert Instance.objects.get(id=id_).result == {"attempt": 1}


@pytest.mark.django_db
def test_next_timers_reads_the_earliest_await_and_future_row_per_queue(queue_name):
    other = queue_name + "x"
    InstanceFactory(queue=queue_name)  # due now: not a timer
    with connection.cursor() as cur:
        for queue, prio, secs in [(queue_name, 5, 40), (queue_name, -3, 90), (queue_name, 0, 20),
                                  (other, 0, 7)]:
            cur.execute("INSERT INTO gen_durable (fsm, step, queue, priority, eligible_at) "
                        "VALUES ('tests.Plain', 'start', %s, %s, now() + make_interval(secs => %s))",
                        [queue, prio, secs])
        cur.execute("INSERT INTO gen_durable (fsm, step, status, queue, await_deadline) VALUES "
                    "('tests.Plain', 'start', 'awaiting_signal', %s, now() + interval '12 s'), "
                    "('tests.Plain', 'start', 'awaiting_signal', %s, now() + interval '3 s')",
                    [queue_name, other])
    awaits, due, _ = next_timers([queue_name])
    assert 2 < awaits <= 3  # any queue's deadline: every worker fires them
    assert set(due) == {queue_name} and 19 < due[queue_name] <= 20
    assert next_timers(["nothing-here"])[1] == {}


@pytest.mark.django_db(transaction=True)
def test_several_timers_fire_each_deadline_exactly_once(clean_tables, events):
    """Four processes' timers race on the same 600 deadlines: each fires exactly once."""
    n = 600
    with connection.cursor() as cur:
        cur.execute("INSERT INTO gen_durable (fsm, step, status, queue, awaits, await_deadline) "
                    "SELECT 'tests.Plain', 'start', 'awaiting_signal', 'hammer', '{go}', "
                    "now() + interval '0.5 s' FROM generate_series(1, %s)", [n])
    timers = [Timer(["hammer"], lambda q: None) for _ in range(4)]
    for t in timers:
        t.start()
    try:
        wait_until(lambda: not Instance.objects.filter(status="awaiting_signal").exists(),
                   timeout=WAIT, what="every deadline fired")
    finally:
        for t in timers:
            t.stop()
    assert sum(t.fired for t in timers) == n
    assert sum(m["count"] for e, m, _ in events if e == "await.timeout") == n
    assert Instance.objects.filter(status="runnable", await_deadline__isnull=True).count() == n


@pytest.mark.django_db(transaction=True)
def test_negative_control_a_read_then_write_sweep_fires_twice(clean_tables):
    """Without the locked, status-guarded statement two sweeps both fire the same rows:
    the hammer above would see it."""
    n = 50
    with connection.cursor() as cur:
        cur.execute("INSERT INTO gen_durable (fsm, step, status, queue, await_deadline) "
                    "SELECT 'tests.Plain', 'start', 'awaiting_signal', 'hammer', now() - interval '1 s' "
                    "FROM generate_series(1, %s)", [n])
    barrier, fired = threading.Barrier(2), []

    def naive():
        with connections["default"].cursor() as cur:
            cur.execute("SELECT id FROM gen_durable WHERE status = 'awaiting_signal' AND await_deadline <= now()")
            ids = [r[0] for r in cur.fetchall()]
            barrier.wait()
            cur.execute("UPDATE gen_durable SET status = 'runnable', await_deadline = NULL WHERE id = ANY(%s) "
                        "RETURNING id", [ids])
            fired.extend(r[0] for r in cur.fetchall())
        connections.close_all()

    threads = [threading.Thread(target=naive) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(fired) == 2 * n  # every deadline fired twice
    assert expire_awaits() == []  # the real sweep finds nothing left, and never double-fires



@pytest.mark.parametrize("delay, channel", [(60, "gen_durable_timer"), (0, "gen_durable")], ids=["later", "due"])
def test_a_task_enqueue_notifies_the_timer_for_later_rows_and_the_queue_for_due_ones(transactional_db, delay, channel):
    """A Django task with run_after must wake every worker's timer, as gd.insert(schedule_in=)
    does; otherwise it starts at the timer's next periodic re-read (up to 30 s late)."""
    import datetime as dt

    import psycopg
    from django.utils import timezone

    from tests.durable_app.tasks import add

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN gen_durable_timer")
        listener.execute("LISTEN gen_durable")
        add.using(run_after=timezone.now() + dt.timedelta(seconds=delay)).enqueue(2, 3)
        got = [(n.channel, n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    assert got == [(channel, "default")]
