"""Slot accounting of the feeder (worker/scheduler.py): no database, no threads started."""

import contextlib
import threading
import time
from types import SimpleNamespace

import pytest

from gen_durable.conf import get_settings
from gen_durable.worker.scheduler import Run, Scheduler, TimedOut


def scheduler(concurrency=4, prefetch=0, max_batch=3):
    s = get_settings()
    settings = SimpleNamespace(**{**s.__dict__, "PREFETCH": prefetch, "MIN_DEMAND": 1,
                                  "FLUSH": {"MAX_BATCH": max_batch, "MAX_DELAY": 0}})
    return Scheduler("q", concurrency, worker_id="w", prefix="p", flusher=None, limiter=None,
                     settings=settings)


def test_running_and_buffered_rows_take_slots():
    sch = scheduler(concurrency=4, prefetch=2)
    sch.buffer.extend([SimpleNamespace(id=i) for i in range(2)])
    sch.in_flight = {10: object(), 11: object()}
    sch.running = 2
    assert sch.demand() == 4 + 2 - (2 + 2)


def test_rows_waiting_for_their_flush_hold_no_slot_up_to_max_batch():
    sch = scheduler(concurrency=4, max_batch=3)
    sch.in_flight = {i: object() for i in range(3)}  # all three handed to the flusher
    sch.running = 0
    assert sch.demand() == 4
    sch.in_flight[99] = object()                    # a fourth waiting row: beyond MAX_BATCH
    assert sch.demand() == 3


def test_settle_frees_a_whole_flushed_batch_and_wakes_the_feeder():
    sch = scheduler()
    sch.in_flight = {1: object(), 2: object(), 3: object()}
    sch.settle([1, 2, 7])
    assert list(sch.in_flight) == [3] and sch.completed == 2 and sch._wake.is_set()
    sch._wake.clear()
    sch.settle([3], completed=False)  # a failed flush: freed, not counted as completed
    assert sch.in_flight == {} and sch.completed == 2 and sch._wake.is_set()


@pytest.mark.parametrize("by_claim", [True, False], ids=["by-claim", "control-by-id-only"])
def test_an_older_runs_end_leaves_the_newer_claim_of_the_same_row_in_flight(by_claim):
    """This worker claimed a row again (a cancel and retry, or a claim a crash undid)
    while the older run was still in flight: that run's end frees its slot, and the
    newer claim stays in flight — heartbeated, its chain continued. Settled by id alone
    (control), the older run's end drops the newer claim, whose lease then lapses while
    its step runs."""
    sch = scheduler()
    newer = SimpleNamespace(id=1, claim=8)
    sch.in_flight = {1: newer}
    if by_claim:
        sch.settle([1], claims=[7])
        assert sch.in_flight == {1: newer} and sch.held_ids() == [1] and sch.completed == 0
        sch.settle([1], claims=[8])
        assert sch.in_flight == {} and sch.completed == 1
    else:
        sch.settle([1])
        assert sch.in_flight == {} and sch.held_ids() == []


@pytest.mark.parametrize("locked", [True, False], ids=["run-lock", "control-no-lock"])
def test_a_step_ending_while_the_watchdog_decides_is_finished_or_abandoned_never_both(monkeypatch, locked):
    """The watchdog saw the step active; before it marks it abandoned, the step returns.

    With the run's lock the step's end waits for the decision and then raises
    Abandoned (its late outcome is dropped; the TimedOut row runs handle()). Without it
    (control) the step returns its outcome AND is abandoned: two outcomes for one row.
    """
    from gen_durable.worker import scheduler as mod

    sch = scheduler(concurrency=1)
    sch.flusher = SimpleNamespace(step_abandoned=lambda: None)
    sch._stop_steps = True  # abandon_overdue's dispatch starts no thread here
    job = SimpleNamespace(id=7, fsm="m", step="s")
    run = mod.Run(job)
    if not locked:
        run.lock = contextlib.nullcontext()  # the control: no exclusion at all
    sch._runs["t"] = run
    sch.running = 1
    returning, deciding = threading.Event(), threading.Event()
    real = mod.past_deadline

    def slow_decision(started, timeout, now):
        deciding.set()
        returning.wait(5)
        # Give the step thread the chance to end meanwhile: without the lock it marks
        # itself inactive at once; with it, it waits on the lock held here (then this
        # bounded wait just runs out — the outcome does not depend on it).
        deadline = time.monotonic() + 1.0
        while run.active and time.monotonic() < deadline:
            time.sleep(0.001)
        return True

    def step():
        deciding.wait(5)
        returning.set()
        return "entry"

    outcome = {}

    def step_thread():
        try:
            outcome["value"] = sch._timed(run, job, step)
        except mod.Abandoned:
            outcome["value"] = "abandoned"

    monkeypatch.setattr(mod, "job_timeout", lambda job: 30.0)
    t = threading.Thread(target=step_thread)
    t.start()
    while not run.active:
        time.sleep(0.001)
    monkeypatch.setattr(mod, "past_deadline", slow_decision)
    abandoned = sch.abandon_overdue()
    monkeypatch.setattr(mod, "past_deadline", real)
    t.join(5)
    finished = outcome["value"] == "entry"
    if locked:
        assert abandoned == 1 and outcome["value"] == "abandoned"
    else:
        assert abandoned == 1 and finished  # both: the race the lock closes
    assert run.abandoned


def test_an_async_chains_next_task_stays_known_when_its_commit_beats_the_last_tasks_end():
    """The commit of an async step's inline outcome can land — and its next step start as
    a task of its own — before the task that submitted it has finished (the loop thread
    waiting for the GIL while the flusher commits). Each task is then still known to the
    scheduler, so stop() cancels a running one (found by a review: tasks were keyed by
    instance id, and the ending task removed its successor's)."""
    import json

    from gen_durable.worker.claims import Claimed
    from tests.conftest import wait_until
    from tests.durable_app import async_machines as am

    sch = scheduler(concurrency=2)
    done = []

    def submit(entry, wait=False):
        if entry.kind == "inline":  # committed at once, before the submitting task ends
            sch.continue_chains([entry], {entry.id: "executing"})
        else:
            done.append(entry)

    sch.flusher = SimpleNamespace(step_started=lambda: None, step_abandoned=lambda: None, submit=submit)
    from gen_durable.worker import aio

    futures = []
    real_submit = aio.submit

    def submit_task(coro):  # each step's task, in order: a's, then b's
        futures.append(real_submit(coro))
        return futures[-1]

    aio_submit, aio.submit = aio.submit, submit_task
    job = Claimed(id=7, fsm="tests.AsyncChainGate", fsm_version=1, step="a", state={}, attempt=0, awaits=None,
                  queue="q", priority=0, eligible_at=0.0, concurrency_key=None, concurrency_shard=None,
                  rate_limit=None, weight=1.0, correlation_key=None, parent_id=None, claim=1, worker="w",
                  raw_state=json.dumps({}))
    job.is_async = True
    am.ASYNC_GATE.clear()
    am.ASYNC_B_STARTED.clear()
    try:
        with sch._lock:
            sch.buffer.append(job)
            sch._async_buffered = True
            sch._dispatch_locked()
        wait_until(lambda: am.ASYNC_B_STARTED == [7] and futures[0].done(), timeout=10,
                   what="step b running and step a's task ended")
        with sch._lock:
            assert len(sch._tasks) == 1, "the running step b's task is unknown to the scheduler"
    finally:
        am.ASYNC_GATE.set()
        aio.submit = aio_submit
    wait_until(lambda: [e.kind for e in done] == ["done"], timeout=10, what="b done")
    wait_until(lambda: not sch._tasks, timeout=5, what="b's task to leave")


def test_the_throughput_line_shows_a_low_rate_as_such():
    """A few steps a minute read as that, not as "0 steps/s" (found by a new-user trial)."""
    from gen_durable.worker.supervisor import throughput_text

    assert throughput_text({"default": 5 / 60, "email": 0.0, "bulk": 1234.4}) == \
        "default 0.083 steps/s, email 0 steps/s, bulk 1234 steps/s"
    assert throughput_text({"q": 9.96}) == "q 10 steps/s"


def test_a_queue_is_young_while_rows_wait_or_a_step_started_within_the_window():
    """Scheduler.young(window): what the flusher's group-commit window waits for."""
    from gen_durable.worker.scheduler import Run

    sch = scheduler()
    assert not sch.young(1.0)                              # nothing buffered, nothing running
    sch.buffer.append(SimpleNamespace(id=1))
    assert sch.young(1.0)                                  # the next step starts at once
    sch.buffer.clear()
    run = Run(SimpleNamespace(id=2))
    run.started, run.active = time.monotonic() - 5.0, True
    sch._runs[threading.current_thread()] = run
    assert not sch.young(1.0)                              # running for 5 s: not about to finish
    assert sch.young(10.0)
    run.started = time.monotonic()
    assert sch.young(1.0)                                  # just started
    run.active = False
    assert not sch.young(1.0)                              # between steps
    sch._async_started[object()] = time.monotonic()
    assert sch.young(1.0)                                  # an async step just started


# --- an async step's re-check of a prefetched row: the hop only when stale -----------------

def async_start(monkeypatch, checked_ago, lost=False):
    """Run `_async_step` on one prefetched row whose claim (or re-check) is `checked_ago`
    s old; return how many times it went to `_owned` (through Django's sync thread)."""
    import asyncio

    from gen_durable.worker.claims import Claimed

    sch = scheduler(concurrency=2)
    sch.flusher = SimpleNamespace(step_abandoned=lambda: None)
    hops, ran = [], []
    monkeypatch.setattr(sch, "_owned", lambda job: hops.append(job.id) or True)

    async def chain(job):
        ran.append(job.id)

    monkeypatch.setattr(sch, "arun_chain", chain)
    fields = {f: None for f in Claimed.__dataclass_fields__}
    job = Claimed(**{**fields, "id": 7, "prefetched": True, "checked": time.monotonic() - checked_ago,
                     "rechecked": False, "pending": None, "lost": lost})
    sch.running = 1
    token = object()
    asyncio.run(sch._async_step(job, token))
    assert ran == [7]
    return len(hops)


def test_a_fresh_prefetched_async_row_starts_without_the_sync_thread_hop(monkeypatch):
    from gen_durable.worker import scheduler as mod

    assert async_start(monkeypatch, checked_ago=0.0) == 0
    assert async_start(monkeypatch, checked_ago=mod.RECHECK_FRESH * 4) == 1  # stale: re-checked
    assert async_start(monkeypatch, checked_ago=0.0, lost=True) == 1  # dropped: `_owned` says so


def _hung(sch, job):
    """A step of `job` running past its timeout (a thread that never returned)."""
    run = Run(job)
    run.started, run.timeout, run.active = time.monotonic() - 100, 1.0, True
    sch._runs[object()] = run
    return run


@pytest.mark.parametrize("claimed_again", [True, False], ids=["newer-claim", "control-the-hung-claim"])
def test_a_hung_run_keeps_only_its_own_claim_out_of_the_heartbeat(claimed_again):
    """A hung step's lease is never renewed. When this worker claimed the row again (a
    crash undid the hung run's claim), the newer claim is heartbeated: matched by id
    alone it was not, and its lease lapsed every LEASE_TTL while its step ran."""
    sch = scheduler()
    hung = SimpleNamespace(id=1, claim=7)
    _hung(sch, hung)
    sch.in_flight = {1: SimpleNamespace(id=1, claim=8) if claimed_again else hung, 2: SimpleNamespace(id=2, claim=1)}
    sch.buffer.append(TimedOut(hung, 1.0, 100.0))  # the hung run's handle(StepTimeout), waiting
    assert sch.held_ids() == ([1, 2] if claimed_again else [2])
    # An older entry of the row (a stale buffered claim) does not bring it back either.
    sch.in_flight[1] = hung
    sch.buffer.append(SimpleNamespace(id=1, claim=6))
    assert sch.held_ids() == [2]
