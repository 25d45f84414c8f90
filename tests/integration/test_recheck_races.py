"""Attacks on the re-check of buffered (prefetched) rows before their step starts
(`Scheduler._owned`): a row cancelled while it waited in the buffer, more than
RECHECK_FRESH before it starts, must never run its step — with several step threads
re-checking at once, and when a re-check statement fails."""

import time

import pytest

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker import scheduler
from tests.conftest import wait_until
from tests.integration.test_step_isolation import _blockers


@pytest.fixture(params=["sync", "async"])
def gated(request):
    """(machine, gate, ran) of the blocker machines of test_step_isolation, per kind:
    rows with state["block"] hold their step until the gate opens, the others record
    that their step ran."""
    machine, gate, ran = _blockers(request.param)
    ran.clear()
    gate.clear()
    yield machine, gate, ran
    gate.set()


def _fill(engine, queue_name, settings, *, concurrency, n, prefetch, machine):
    """`concurrency` blockers hold every slot; `n` rows are claimed into the buffer behind
    them. Returns (blocker ids, buffered ids)."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": prefetch}
    blockers = gd.insert_all([gd.Spec(machine, state={"block": True}, queue=queue_name) for _ in range(concurrency)])
    engine({queue_name: concurrency})
    wait_until(lambda: Instance.objects.filter(id__in=blockers, status="executing").count() == concurrency,
               what="blockers running")
    buffered = gd.insert_all([gd.Spec(machine, queue=queue_name) for _ in range(n)])
    wait_until(lambda: Instance.objects.filter(id__in=buffered, status="executing").count() == n,
               timeout=30, what=f"{n} rows claimed into the buffer")
    return blockers, buffered


def _settle(ids, n_live):
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == n_live, timeout=30,
               what="the live rows done")


@pytest.mark.parametrize("concurrency", [1, 4, 8])
def test_rows_cancelled_while_buffered_never_start_with_several_step_threads(
        engine, queue_name, settings, gated, concurrency):
    """Every slot is busy; rows wait in the buffer, half of them are cancelled, and the
    cancels are older than RECHECK_FRESH when the slots free up. All step threads then
    take rows at once: none of the cancelled rows may run its step (the live ones all
    run, once). A re-check that another thread has in flight must not vouch for a row
    before its answer is in: the row's `checked` is set when the batch is taken, and the
    other threads started the rows of that batch at once — every cancelled row ran."""
    machine, gate, ran = gated
    blockers, buffered = _fill(engine, queue_name, settings, concurrency=concurrency, n=120, prefetch=200,
                               machine=machine)
    cancelled = set(buffered[1::2])
    for id_ in cancelled:
        gd.cancel(id_, "customer left")
    time.sleep(scheduler.RECHECK_FRESH * 2)  # every cancel is older than the window
    gate.set()
    live = [i for i in buffered if i not in cancelled]
    _settle(live, len(live))
    wait_until(lambda: Instance.objects.filter(id__in=blockers, status="done").count() == concurrency,
               what="blockers done")
    assert not cancelled & set(ran), f"{len(cancelled & set(ran))} of {len(cancelled)} cancelled rows ran their step"
    assert sorted(ran) == sorted(live)


def test_a_failed_recheck_does_not_vouch_for_the_other_rows_of_its_batch(engine, queue_name, settings, gated,
                                                                         monkeypatch):
    """The re-check statement fails (a database error): the starting row runs (by
    design: its outcome meets the flush guard), but the other buffered rows of that
    batch were never re-checked — they must re-check before they start, not run on the
    failed statement's timestamp. A wide window makes "started within it" certain."""
    machine, gate, ran = gated
    monkeypatch.setattr(scheduler, "RECHECK_FRESH", 0.5)
    calls = []
    real = scheduler.still_owned

    def failing_once(jobs, worker, using=None):
        calls.append([j.id for j in jobs])
        if len(calls) == 1:
            raise RuntimeError("connection lost during the re-check")
        return real(jobs, worker, using)

    monkeypatch.setattr(scheduler, "still_owned", failing_once)
    blockers, buffered = _fill(engine, queue_name, settings, concurrency=1, n=6, prefetch=20, machine=machine)
    for id_ in buffered:
        gd.cancel(id_, "customer left")
    time.sleep(scheduler.RECHECK_FRESH * 2)  # every cancel is older than the window
    gate.set()
    wait_until(lambda: Instance.objects.filter(id__in=blockers, status="done").count() == 1, what="blocker done")
    later = gd.insert(machine, queue=queue_name)  # the slot goes on with fresh work
    wait_until(lambda: Instance.objects.filter(id=later, status="done").exists(), timeout=30, what="later done")
    assert len(calls[0]) == 6, calls  # one batch covered every buffered row, and failed
    assert set(ran) - {later} <= {calls[0][0]}, f"rows of the failed re-check ran: {sorted(set(ran) - {later})}"
