"""gd.retry, gd.pause_queue / gd.resume_queue and the worker registry (docs/admin.md)."""

import time

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance, QueuePause, Worker
from gen_durable.testing import assert_done, drain
from tests.conftest import wait_until
from tests.durable_app.durable import GiveUp, Plain
from tests.durable_app.signal_machines import FanOut, Recorder


def _row(id_):
    return Instance.objects.get(id=id_)


# --- retry -------------------------------------------------------------------------
@pytest.mark.django_db
def test_retry_of_a_failed_job_runs_its_step_again_with_a_fresh_attempt_count(queue_name):
    id_ = gd.insert(GiveUp, queue=queue_name)
    drain(queue=queue_name)
    row = _row(id_)
    assert (row.status, row.attempt, row.last_error) == ("failed", GiveUp.max_attempts - 1, "always")

    assert gd.retry(id_) == id_
    row = _row(id_)
    assert (row.status, row.step, row.attempt, row.last_error) == ("runnable", "perform", 0, "always")
    tally = drain(queue=queue_name)
    # the whole max_attempts budget again: retried max_attempts - 1 times, then failed
    assert (tally["retry"], tally["stop"]) == (GiveUp.max_attempts - 1, 1)


@pytest.mark.django_db
def test_retry_wakes_a_parked_instance_like_its_await_timeout(queue_name):
    id_ = gd.insert(Recorder, state={"names": ["go"]}, queue=queue_name)
    drain(queue=queue_name)
    assert _row(id_).status == "awaiting_signal"
    gd.retry(id_)
    row = _row(id_)
    assert (row.status, row.step, row.awaits, row.await_deadline) == ("runnable", "woke", ["go"], None)
    drain(queue=queue_name)
    assert assert_done(id_)["result"]["timed_out"] is True


@pytest.mark.django_db
def test_retry_makes_a_scheduled_row_due_now_and_keeps_its_attempt(queue_name):
    id_ = gd.insert(Plain, queue=queue_name, schedule_in=3600)
    Instance.objects.filter(id=id_).update(attempt=2)
    gd.retry(id_)
    assert drain(queue=queue_name, with_scheduled=False)["done"] == 1
    assert _row(id_).attempt == 2


@pytest.mark.django_db
def test_retry_refuses_done_executing_and_joining_instances_and_missing_ones(queue_name):
    done = gd.insert(Plain, queue=queue_name)
    drain(queue=queue_name)
    with pytest.raises(gd.NotRetryable, match="finished successfully"):
        gd.retry(done)
    running = gd.insert(Plain, queue=queue_name)
    Instance.objects.filter(id=running).update(status="executing", locked_by="w")
    with pytest.raises(gd.NotRetryable) as info:
        gd.retry(running)
    assert info.value.status == "executing"
    assert _row(running).status == "executing"
    with pytest.raises(gd.NoTarget):
        gd.retry(10**12)
    with pytest.raises(gd.InvalidInput):
        gd.retry(1.5)


@pytest.mark.django_db
def test_retry_of_a_failed_child_counts_it_on_its_parents_join_again(queue_name):
    parent = gd.insert(FanOut, state={"kids": [{"i": 1, "fail": True}, {"i": 2}]}, queue=queue_name)
    drain(queue=queue_name)
    # both children ran (one failed), the parent joined: revive the failed child of a
    # parent that is parked again instead (set up the join by hand)
    kid = Instance.objects.filter(parent_id=parent, status="failed").get()
    Instance.objects.filter(id=parent).update(status="awaiting_children", children_pending=0, step="join")
    gd.retry(kid.id)
    assert _row(parent).children_pending == 1
    drain(queue=queue_name)
    assert _row(kid.id).status == "failed"  # it fails again, and counts off again
    assert _row(parent).children_pending == 0


@pytest.mark.django_db
def test_retry_of_a_failed_instance_whose_key_is_taken_raises_and_changes_nothing(queue_name):
    id_ = gd.insert(GiveUp, queue=queue_name, correlation_key=f"{queue_name}:k")
    drain(queue=queue_name)
    other = gd.insert(Plain, queue=queue_name, correlation_key=f"{queue_name}:k")
    with pytest.raises(gd.DuplicateInstance):
        gd.retry(id_)
    assert _row(id_).status == "failed"
    assert _row(other).status == "runnable"


@pytest.mark.django_db(transaction=True)
def test_retry_by_live_correlation_key_and_the_async_twins(queue_name):
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    id_ = gd.insert(Plain, queue=queue_name, schedule_in=60, correlation_key=f"{queue_name}:x")

    async def main():
        try:
            return (await gd.aretry(f"{queue_name}:x"), await gd.apause_queue(queue_name),
                    await gd.apaused_queues(), await gd.aresume_queue(queue_name))
        finally:
            await sync_to_async(connections.close_all)()

    retried, paused, listed, resumed = asyncio.run(main())
    assert (retried, paused, queue_name in listed, resumed) == (id_, True, True, True)
    assert _row(id_).eligible_at <= Instance.objects.values_list("updated_at", flat=True).get(id=id_)


# --- pause / resume ----------------------------------------------------------------
@pytest.mark.django_db
def test_pause_and_resume_are_idempotent_rows_and_validate_the_name(queue_name):
    assert gd.pause_queue(queue_name) is True
    assert gd.pause_queue(queue_name) is False
    assert queue_name in gd.paused_queues()
    assert QueuePause.objects.filter(queue=queue_name).exists()
    assert gd.resume_queue(queue_name) is True
    assert gd.resume_queue(queue_name) is False
    assert queue_name not in gd.paused_queues()
    for bad in ("", "  ", None, 3):
        with pytest.raises(gd.InvalidInput):
            gd.pause_queue(bad)


def test_a_paused_queue_is_not_claimed_by_running_workers_until_resumed(engine, committed, queue_name):
    other = f"{queue_name}_b"
    sup = engine({queue_name: 2, other: 2})
    gd.insert(Plain, queue=queue_name)
    wait_until(lambda: Instance.objects.filter(queue=queue_name, status="done").count() == 1, what="first run")

    gd.pause_queue(queue_name)
    time.sleep(1.5)  # every scheduler re-reads the pause within about a second
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(3)]
    other_id = gd.insert(Plain, queue=other)
    wait_until(lambda: _row(other_id).status == "done", what="the other queue keeps running")
    time.sleep(1.2)
    assert Instance.objects.filter(id__in=ids, status="runnable").count() == 3  # nobody claimed them

    gd.resume_queue(queue_name)
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 3, timeout=15,
               what="the resumed queue drains")
    assert sup.schedulers[queue_name].paused() is False


def test_a_pause_survives_a_worker_restart(engine, committed, queue_name):
    gd.pause_queue(queue_name)
    try:
        engine({queue_name: 1})
        id_ = gd.insert(Plain, queue=queue_name)
        time.sleep(1.5)
        assert _row(id_).status == "runnable"
    finally:
        gd.resume_queue(queue_name)
    wait_until(lambda: _row(id_).status == "done", timeout=15, what="run after resume")


# --- worker registry ---------------------------------------------------------------
def test_a_worker_registers_its_queues_heartbeats_and_unregisters_on_stop(engine, committed, queue_name):
    sup = engine({queue_name: 1})
    row = Worker.objects.get(id=sup.token)
    assert row.queues == [queue_name] and row.pid > 0 and row.host
    first = row.last_seen
    wait_until(lambda: Worker.objects.get(id=sup.token).last_seen > first, what="a heartbeat refresh")
    sup.stop()
    assert not Worker.objects.filter(id=sup.token).exists()
    with connection.cursor() as cur:
        cur.execute("DELETE FROM gen_durable_workers")


def test_a_worker_whose_connection_died_meanwhile_still_unregisters_on_stop(engine, committed, queue_name, caplog):
    """After a server restart the stopping thread's connection is dead: the unregister
    reconnects once instead of leaving the row to expire with a warning."""
    sup = engine({queue_name: 1})
    assert Worker.objects.filter(id=sup.token).exists()
    from django.db import OperationalError

    with pytest.raises(OperationalError), connection.cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # this thread's own session ends
    with caplog.at_level("WARNING", "gen_durable"):
        sup.stop()
    assert not [r for r in caplog.records if "could not remove worker" in r.getMessage()]
    assert not Worker.objects.filter(id=sup.token).exists()


def test_retry_racing_an_insert_of_the_same_key_leaves_one_live_instance(committed, queue_name):
    """The insert holds the key uncommitted while retry revives the failed owner: retry
    waits on the unique index, then reports DuplicateInstance (never a raw IntegrityError,
    never two live rows with one key)."""
    import threading

    from django.db import transaction

    from tests.helpers import ConnectionThread

    key = f"{queue_name}:race"
    failed = gd.insert(Plain, queue=queue_name, correlation_key=key)
    Instance.objects.filter(id=failed).update(status="failed")
    held = threading.Event()

    def insert_and_hold():
        with transaction.atomic():
            id_ = gd.insert(Plain, queue=queue_name, correlation_key=key)
            held.set()
            time.sleep(0.5)  # retry runs meanwhile and waits on the key's index entry
        return id_

    inserter = ConnectionThread(insert_and_hold)
    inserter.start()
    assert held.wait(10)
    with pytest.raises(gd.DuplicateInstance):
        gd.retry(failed)
    winner = inserter.join_result()
    assert _row(failed).status == "failed"
    live = Instance.objects.filter(correlation_key=key).exclude(status__in=["done", "failed"])
    assert list(live.values_list("id", flat=True)) == [winner]


class PaysOrGivesUp(gd.Machine):
    name = "tests.operator.PaysOrGivesUp"

    @gd.step
    def start(self, ctx):
        return gd.Await("paid", next="ship", timeout=3600)

    @gd.step
    def ship(self, ctx):
        if not ctx.awaited:
            return gd.Stop("payment never arrived")
        return gd.Done({"paid": ctx.awaited[0].payload})


@pytest.mark.django_db
@pytest.mark.parametrize("how", ["cancelled while parked", "timed out"])
def test_retry_of_an_instance_that_failed_on_an_await_parks_it_again(how):
    """On main retry() re-ran `ship` with no signal: it failed again at once."""
    from gen_durable.testing import drain, fire_timeouts

    i = gd.insert(PaysOrGivesUp)
    drain()
    if how == "timed out":
        fire_timeouts()
        drain()
    else:
        gd.cancel(i, reason="by mistake")
    row = Instance.objects.get(id=i)
    assert (row.status, row.step, row.awaits) == ("failed", "ship", ["paid"])
    gd.retry(i)
    row = Instance.objects.get(id=i)
    assert (row.status, row.step, row.awaits, row.await_deadline) == ("awaiting_signal", "ship", ["paid"], None)
    drain()
    assert Instance.objects.get(id=i).status == "awaiting_signal"  # nothing ran it with no signal
    gd.signal(i, "paid", {"amount": 5})
    drain()
    row = Instance.objects.get(id=i)
    assert (row.status, row.result) == ("done", {"paid": {"amount": 5}})
