"""A late outcome of an earlier claim never commits over a later claim of the same row by
the same worker (flush.sql's claim-counter guard; docs/design.md#outcomes).

`locked_by` names the worker, not the claim: cancel + retry while a step runs lets the
same worker claim the row again, and a guard on `locked_by AND status` alone then
accepts the cancelled run's late outcome. The direct tests stage that interleaving
statement by statement (no sleeps): they fail without the claim counter in the guard.
"""

import time

import pytest

import gen_durable as gd
from gen_durable.models import HistoryEntry, Instance
from gen_durable.outcomes import Done, Next
from gen_durable.worker import claims, executor
from gen_durable.worker.flusher import flush
from tests.conftest import wait_until
from tests.durable_app.durable import Counter

WORKER = "claim-token-worker"


def _entry(result, job):
    entry = executor.to_entry(result, Counter, job, consumed=(), presented=())
    entry.attempt, entry.began, entry.ended = job.attempt, 0.0, 0.0
    return entry


def _pick_one(queue):
    jobs = claims.pick(queue, 1, WORKER, 60)
    assert len(jobs) == 1
    return jobs[0]


def _reclaimed(queue):
    """(first claim, second claim) of one row by the same worker, with a cancel and a
    retry between them — the first run is still "in flight" (its outcome unflushed)."""
    id_ = gd.insert(Counter, state={"target": 3}, queue=queue)
    first = _pick_one(queue)
    assert first.id == id_
    assert gd.cancel(id_, reason="operator")
    gd.retry(id_)
    second = _pick_one(queue)
    assert (second.id, second.worker) == (first.id, first.worker)  # same row, same locked_by
    assert second.claim == first.claim + 1
    return first, second


@pytest.mark.parametrize("kind", ["next", "inline", "done"])
def test_a_cancelled_runs_late_outcome_does_not_commit_over_the_same_workers_new_claim(
        committed, queue_name, kind):
    first, second = _reclaimed(queue_name)
    result = Done({"count": 99}) if kind == "done" else Next("start", state={"target": 3, "n": 1})
    late = _entry(result, first)
    if kind == "inline":  # a chain's step continuing in place (Counter does not ask to)
        late.kind = "inline"

    res = flush([late])

    assert res.committed == {} and [e.id for e in res.stale] == [first.id]
    row = Instance.objects.get(id=first.id)
    # Still the second claim's, untouched: executing under it, at its step, no progress.
    assert (row.status, row.locked_by, row.claim, row.state, row.result) == \
        ("executing", WORKER, second.claim, {"target": 3}, None)
    assert not HistoryEntry.objects.filter(instance_id=first.id).exists()

    # Negative control: the second claim's own outcome commits.
    res = flush([_entry(Next("start", state={"target": 3, "n": 1}), second)])
    assert res.committed == {second.id: "runnable"}
    row = Instance.objects.get(id=first.id)
    assert (row.status, row.state) == ("runnable", {"target": 3, "n": 1})


def test_the_guard_holds_per_row_in_a_mixed_batch(committed, queue_name):
    """Claims that differ within one flush (the claim column goes as an array, not as one
    value): the stale row's outcome is dropped, the other row's commits."""
    x1, x2 = _reclaimed(queue_name)
    z1, z2 = _reclaimed(queue_name)
    late = _entry(Next("start", state={"target": 3, "n": 1}), x1)
    current = _entry(Next("start", state={"target": 3, "n": 5}), z2)
    res = flush(sorted([late, current], key=lambda e: e.id))
    assert res.committed == {z2.id: "runnable"} and [e.id for e in res.stale] == [x1.id]
    assert Instance.objects.get(id=x1.id).state == {"target": 3}
    assert Instance.objects.get(id=z2.id).state == {"target": 3, "n": 5}


def test_a_prefetched_claim_rechecked_after_a_cancel_retry_and_reclaim_is_lost(committed, queue_name):
    """The buffer's re-check (still_owned) asks for the claim it holds: an older claim of a
    row this worker claimed again is not "still owned", so it never starts beside the new one."""
    first, second = _reclaimed(queue_name)
    assert claims.still_owned([first], WORKER) == set()
    assert claims.still_owned([second], WORKER) == {second.id}


def test_cancel_then_retry_during_a_step_same_worker(engine, committed, queue_name):
    """End to end (the reported interleaving): a 1 s step, cancel then retry while it
    runs; the same worker claims the row again. Only the second run's outcomes commit."""
    from tests.durable_app.durable import SlowCounter

    id_ = gd.insert(SlowCounter, state={"sleep": 1.0, "target": 2}, queue=queue_name)
    engine({queue_name: 2})
    wait_until(lambda: Instance.objects.get(id=id_).status == "executing", timeout=10, what="running")
    first_claim = Instance.objects.get(id=id_).claim
    gd.cancel(id_, reason="operator")
    gd.retry(id_)
    wait_until(lambda: Instance.objects.get(id=id_).status in ("done", "failed"), timeout=30, what="end")
    # Let the first run's late outcome reach the flush (its step sleeps 1 s in all).
    time.sleep(1.5)
    row = Instance.objects.get(id=id_)
    assert (row.status, row.result) == ("done", {"count": 2})
    assert row.claim > first_claim
    outcomes = list(HistoryEntry.objects.filter(instance_id=id_).order_by("id").values_list("outcome", flat=True))
    # Exactly the second run's two steps: nothing of the cancelled run committed (with
    # its late Next committed, the count restarts and a third step runs).
    assert len(outcomes) == 2 and outcomes[-1] == "done", outcomes


def test_releasing_an_older_claim_leaves_the_newer_one_holding_the_row(committed, queue_name):
    """The buffer hands back (release.sql) the claims it holds: an older claim of a row
    this worker claimed again releases nothing, so the newer claim keeps the row (and no
    gate slot is credited for it)."""
    first, second = _reclaimed(queue_name)
    assert claims.release([first], WORKER) == []
    row = Instance.objects.get(id=first.id)
    assert (row.status, row.locked_by, row.claim) == ("executing", WORKER, second.claim)
    assert claims.release([second], WORKER) == [second.id]
    assert Instance.objects.get(id=first.id).status == "runnable"
