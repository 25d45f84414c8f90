"""A claim a server crash undid is never minted twice to the same worker
(docs/design.md#leases, "Claims across a crash").

The feeder commits claims without waiting for the WAL flush, so a crash can lose a claim
whose step is already running here: the row comes back runnable with its older claim
counter, and this same worker may claim it again. Before, that second claim got the
very counter the first run holds, and the first run's late outcome (a flush retried
across the outage) passed the flush guard over the second claim — one instance running
two steps at once. The feeder now hands the next pick the claims it made on an earlier
connection session; a row among them gets a counter above the held one.

These tests stage the crash's effect statement by statement (the row restored to its
image before the claim, the feeder's session ended); tests/faults/test_claim_lost_in_a_crash.py
shows the same loss on a real crash of a cluster of its own.
"""

import dataclasses
import threading

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.conf import get_settings
from gen_durable.limiter import get_limiter
from gen_durable.models import Instance
from gen_durable.outcomes import Next
from gen_durable.worker import executor
from gen_durable.worker.flusher import flush
from gen_durable.worker.scheduler import Scheduler, TimedOut
from tests.conftest import wait_until
from tests.durable_app.durable import Counter

WORKER = "crash-claims-worker"


def _feeder(queue):
    """A Scheduler whose picks buffer rows but start no step thread: the test plays the steps."""
    sch = Scheduler(queue, 4, worker_id=WORKER, prefix="crash-claims", flusher=None,
                    limiter=get_limiter(None), settings=get_settings())
    sch._dispatch_locked = lambda: None
    return sch


def _run(sch):
    """The buffered claim starts its step (it is in flight until its outcome commits)."""
    job = sch.buffer.popleft()
    with sch._lock:
        sch._take_locked(job)
    return job


def _lose_the_claim(id_):
    """What a crash leaves of a claim whose commit had not reached the disk: the row as it
    was before the claim."""
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL, "
                    "claim = claim - 1 WHERE id = %s", [id_])


def _outcome(job, n):
    entry = executor.to_entry(Next("start", state={"target": 3, "n": n}), Counter, job, consumed=(), presented=())
    entry.attempt, entry.began, entry.ended = job.attempt, 0.0, 0.0
    return entry


@pytest.mark.parametrize("reconnected", [True, False], ids=["after-reconnect", "control-no-held-claims"])
def test_the_first_runs_late_outcome_is_stale_over_the_same_workers_claim_after_a_crash(
        committed, queue_name, reconnected):
    id_ = gd.insert(Counter, state={"target": 3}, queue=queue_name)
    sch = _feeder(queue_name)
    assert sch.run_once() == 1
    first = _run(sch)
    _lose_the_claim(id_)
    if reconnected:
        connection.close()  # a crash ends every session, the feeder's among them

    assert sch.run_once() == 1
    second = sch.buffer[0]
    assert (second.id, second.worker) == (first.id, first.worker)

    res = flush([_outcome(first, 1)])  # the first run's outcome, retried across the outage
    row = Instance.objects.get(id=id_)
    if reconnected:
        assert second.claim > first.claim
        assert res.committed == {} and [e.id for e in res.stale] == [id_]
        assert (row.status, row.locked_by, row.claim, row.state) == \
            ("executing", WORKER, second.claim, {"target": 3})
        # The second claim's own outcome commits.
        assert flush([_outcome(second, 1)]).committed == {id_: "runnable"}
    else:
        # Without the held claims the crash hands out the first run's counter again, and
        # its outcome commits over the second claim while that claim's step is to run.
        assert second.claim == first.claim
        assert res.committed == {id_: "runnable"}
        assert row.state == {"target": 3, "n": 1}


def test_no_claim_is_held_back_on_the_session_that_made_it(committed, queue_name):
    """The normal case costs nothing: the same session, no held claims sent."""
    gd.insert(Counter, state={"target": 3}, queue=queue_name)
    sch = _feeder(queue_name)
    assert sch.run_once() == 1
    _run(sch)
    assert sch._held_claims() is None
    connection.close()
    held = sch._held_claims()
    assert list(held.values()) == [next(iter(sch.in_flight.values())).claim]
    # Claims made on the new session are not suspect: once the older ones are gone, none is sent.
    sch.in_flight.clear()
    assert sch._held_claims() is None


def test_behind_a_transaction_pooler_every_held_claim_is_sent(committed, queue_name, settings):
    """A pooler keeps the client's session across a server restart: no session change tells."""
    gd.insert(Counter, state={"target": 3}, queue=queue_name)
    sch = _feeder(queue_name)
    assert sch.run_once() == 1
    job = sch.buffer[0]
    settings.GEN_DURABLE = {**getattr(settings, "GEN_DURABLE", {}), "POOLER": "transaction"}
    assert sch._held_claims() == {job.id: job.claim}


@pytest.mark.parametrize("how", ["after-reconnect", "pooled"])
def test_a_timed_out_rows_handle_task_in_the_buffer_is_a_held_claim(committed, queue_name, settings, how):
    """handle(StepTimeout) of an abandoned step waits in the buffer as a TimedOut task;
    the pick's held claims read its row's claim (they failed the pick on its attributes)."""
    gd.insert(Counter, state={"target": 3}, queue=queue_name)
    sch = _feeder(queue_name)
    assert sch.run_once() == 1
    job = sch.buffer.popleft()
    sch.buffer.append(TimedOut(job, 1.0, 2.0))
    if how == "pooled":
        settings.GEN_DURABLE = {**getattr(settings, "GEN_DURABLE", {}), "POOLER": "transaction"}
    else:
        connection.close()
    assert sch._held_claims() == {job.id: job.claim}
    assert sch.run_once() == 0  # the pick runs (nothing more to claim)


class _Flusher:
    """The flusher's side of a step thread, recorded (no flush runs)."""

    def __init__(self):
        self.submitted = []

    def step_started(self):
        pass

    def step_abandoned(self):
        pass

    def submit(self, entry):
        self.submitted.append(entry)


@pytest.mark.parametrize("claimed_again", ["in-flight", "buffered", None],
                         ids=["newer-claim-in-flight", "newer-claim-buffered", "control-same-claim"])
def test_a_hung_runs_timeout_task_is_dropped_once_this_worker_claimed_the_row_again(
        committed, queue_name, claimed_again):
    """A step hangs past its timeout after a crash undid its claim, and this worker has
    claimed the row again: the hung run's handle(StepTimeout) task is for a claim no
    longer held (its outcome would be stale). It is dropped, and the newer claim stays
    in flight. Before, taking it replaced the newer claim in flight, so that claim's end
    freed nothing and its inline chain was dropped. Control: the same claim still in
    flight, handle(StepTimeout) runs and its outcome goes to the flusher."""
    id_ = gd.insert(Counter, state={"target": 3}, queue=queue_name)
    sch = _feeder(queue_name)
    sch.flusher = _Flusher()
    assert sch.run_once() == 1
    hung = sch.buffer.popleft()
    newer = dataclasses.replace(hung, claim=hung.claim + 1) if claimed_again else hung
    sch.in_flight = {id_: newer if claimed_again == "in-flight" else hung}
    sch.buffer.append(TimedOut(hung, 1.0, 5.0))
    if claimed_again == "buffered":
        sch.buffer.append(newer)  # behind the task: the one step thread takes the task first
    thread = threading.Thread(target=sch._step_loop, daemon=True)
    with sch._lock:
        sch._threads += 1
    thread.start()
    try:
        if claimed_again == "in-flight":
            wait_until(lambda: not sch.buffer and sch._idle_threads == 1, what="the task to be taken")
            with sch._lock:
                assert (sch.running, sch.in_flight) == (0, {id_: newer})
            assert sch.flusher.submitted == []
        elif claimed_again == "buffered":
            # The task is dropped; the newer claim's own step runs and its outcome is the only one.
            wait_until(lambda: sch.flusher.submitted, what="the newer claim's outcome")
            assert [(e.claim, e.kind) for e in sch.flusher.submitted] == [(newer.claim, "next")]
        else:
            wait_until(lambda: sch.flusher.submitted, what="handle(StepTimeout)'s outcome")
            [entry] = sch.flusher.submitted
            assert (entry.id, entry.claim, entry.kind) == (id_, hung.claim, "stop")
    finally:
        with sch._lock:
            sch._stop_steps = True
            sch._lock.notify_all()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.parametrize("purged", [True, False], ids=["purged", "control-kept"])
def test_a_buffered_claim_the_crash_undid_does_not_start_beside_its_new_claim(
        committed, queue_name, monkeypatch, purged):
    """A claim waiting in the buffer (not started) is undone by the crash; the next pick
    claims its row again. The older entry must go: it would start the same step next to
    the new claim's (its re-check asks only whether the row is this worker's). Control:
    without the purge both entries of the row stay buffered."""
    id_ = gd.insert(Counter, state={"target": 3}, queue=queue_name)
    sch = _feeder(queue_name)
    assert sch.run_once() == 1
    older = sch.buffer[0]
    _lose_the_claim(id_)
    connection.close()
    if not purged:
        monkeypatch.setattr(sch, "_superseded_locked", lambda jobs: [])
    assert sch.run_once() == 1
    assert [(b.id, b.claim) for b in sch.buffer] == (
        [(id_, older.claim + 1)] if purged else [(id_, older.claim), (id_, older.claim + 1)])
