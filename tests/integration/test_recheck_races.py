"""Attacks on the re-check of buffered (prefetched) rows before their step starts
(`Scheduler._owned`): a row cancelled while it waited in the buffer, more than
RECHECK_FRESH before it starts, must never run its step — with several step threads
re-checking at once, and when a re-check statement fails."""

import asyncio
import threading
import time

import pytest

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker import scheduler
from tests.conftest import wait_until

GATE = threading.Event()
RAN: list = []


class Gated(gd.Machine):
    """Rows with state["block"] hold their step thread until GATE opens; the others
    record that their step ran."""

    name = "tests.recheck.Gated"

    @gd.step
    def start(self, ctx):
        if ctx.state.get("block"):
            GATE.wait(30)
        else:
            RAN.append(ctx.id)
        return gd.Done()


class AsyncGated(gd.Machine):
    """Gated, with an `async def` step."""

    name = "tests.recheck.AsyncGated"

    @gd.step
    async def start(self, ctx):
        if ctx.state.get("block"):
            for _ in range(6000):
                if GATE.is_set():
                    break
                await asyncio.sleep(0.005)
        else:
            RAN.append(ctx.id)
        return gd.Done()


@pytest.fixture
def gated():
    RAN.clear()
    GATE.clear()
    yield
    GATE.set()


def _fill(engine, queue_name, settings, *, concurrency, n, prefetch, machine=Gated):
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


@pytest.mark.parametrize("machine", [Gated, AsyncGated], ids=["sync", "async"])
@pytest.mark.parametrize("concurrency", [1, 4, 8])
def test_rows_cancelled_while_buffered_never_start_with_several_step_threads(
        engine, queue_name, settings, gated, concurrency, machine):
    """Every slot is busy; rows wait in the buffer, half of them are cancelled, and the
    cancels are older than RECHECK_FRESH when the slots free up. All step threads then
    take rows at once: none of the cancelled rows may run its step (the live ones all
    run, once). A re-check that another thread has in flight must not vouch for a row
    before its answer is in: the row's `checked` is set when the batch is taken, and the
    other threads started the rows of that batch at once — every cancelled row ran."""
    blockers, buffered = _fill(engine, queue_name, settings, concurrency=concurrency, n=120, prefetch=200,
                               machine=machine)
    cancelled = set(buffered[1::2])
    for id_ in cancelled:
        gd.cancel(id_, "customer left")
    time.sleep(scheduler.RECHECK_FRESH * 2)  # every cancel is older than the window
    GATE.set()
    live = [i for i in buffered if i not in cancelled]
    _settle(live, len(live))
    wait_until(lambda: Instance.objects.filter(id__in=blockers, status="done").count() == concurrency,
               what="blockers done")
    assert not cancelled & set(RAN), f"{len(cancelled & set(RAN))} of {len(cancelled)} cancelled rows ran their step"
    assert sorted(RAN) == sorted(live)


def test_a_failed_recheck_does_not_vouch_for_the_other_rows_of_its_batch(engine, queue_name, settings, gated,
                                                                         monkeypatch):
    """The re-check statement fails (a database error): the starting row runs (by
    design: its outcome meets the flush guard), but the other buffered rows of that
    batch were never re-checked — they must re-check before they start, not run on the
    failed statement's timestamp. A wide window makes "started within it" certain."""
    monkeypatch.setattr(scheduler, "RECHECK_FRESH", 0.5)
    calls = []
    real = scheduler.still_owned

    def failing_once(ids, worker, using=None):
        calls.append(list(ids))
        if len(calls) == 1:
            raise RuntimeError("connection lost during the re-check")
        return real(ids, worker, using)

    monkeypatch.setattr(scheduler, "still_owned", failing_once)
    blockers, buffered = _fill(engine, queue_name, settings, concurrency=1, n=6, prefetch=20)
    for id_ in buffered:
        gd.cancel(id_, "customer left")
    time.sleep(scheduler.RECHECK_FRESH * 2)  # every cancel is older than the window
    GATE.set()
    wait_until(lambda: Instance.objects.filter(id__in=blockers, status="done").count() == 1, what="blocker done")
    later = gd.insert(Gated, queue=queue_name)  # the slot goes on with fresh work
    wait_until(lambda: Instance.objects.filter(id=later, status="done").exists(), timeout=30, what="later done")
    assert len(calls[0]) == 6, calls  # one batch covered every buffered row, and failed
    assert set(RAN) - {later} <= {calls[0][0]}, f"rows of the failed re-check ran: {sorted(set(RAN) - {later})}"
