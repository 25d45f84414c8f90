"""Group commit in a running worker (worker/flusher.py, docs/design.md#outcomes).

FLUSH.MAX_DELAY is how long an outcome may wait for the outcomes of steps still
running, so that they share one commit; a lone outcome (nothing else running) is
committed at once. Counted in flushes and in whether each waited for the window
(telemetry `flush.stop`: count, held), not timed. The flusher's connection is opened when the worker starts, and a
worker whose flusher thread dies stops.
"""

import threading
import time

import pytest
import gen_durable as gd
from tests.conftest import wait_until
from tests.helpers import role_name, sessions


@gd.job(name="tests.groupcommit.BigResult")
def BigResult(args):
    return {"blob": "x" * args["size"]}


class Sleeper(gd.Machine):
    """One step: sleeps state["sleep"] seconds, then done. With state["after"], it first
    waits (up to 10 s) until a step with state["tag"] == that has started."""

    name = "tests.groupcommit.Sleeper"
    STARTED: dict = {}

    @gd.step
    def start(self, ctx):
        tag = ctx.state.get("tag")
        if tag:
            self.STARTED.setdefault(tag, threading.Event()).set()
        after = ctx.state.get("after")
        if after:
            self.STARTED.setdefault(after, threading.Event()).wait(10)
        time.sleep(ctx.state.get("sleep", 0))
        return gd.Done()


class Chain(gd.Machine):
    """state["n"] inline steps in a row, nothing else."""

    name = "tests.groupcommit.Chain"
    inline_execution = True

    @gd.step
    def start(self, ctx):
        n = ctx.state["n"] - 1
        return gd.Done() if n <= 0 else gd.Next("start", state={"n": n})


def flush_sizes(events):
    return [m["count"] for e, m, _ in events if e == "flush.stop"]


def held(events):
    """Per flush, whether its batch waited for the MAX_DELAY window."""
    return [m["held"] for e, m, _ in events if e == "flush.stop"]


def flushed(events, n):
    """The flush sizes once `n` outcomes were flushed (flush.stop follows the commit a
    waiter may already have seen)."""
    wait_until(lambda: sum(flush_sizes(events)) >= n, what=f"{n} outcomes flushed")
    return flush_sizes(events)


def with_delay(settings, delay):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "FLUSH": {"MAX_BATCH": 100, "MAX_DELAY": delay}}


@pytest.mark.parametrize("delay,expected,waited", [(30, [2], [True]), (0, [1, 1], [False, False])])
def test_an_outcome_waits_up_to_max_delay_for_a_running_step(engine, committed, queue_name, settings, events,
                                                              delay, expected, waited):
    """Two rows claimed together on two step threads, one done as soon as the other has
    started, the other 0.3 s later: with MAX_DELAY 30 s the first outcome waits for the
    second and they commit in one flush; with MAX_DELAY 0 each commits alone (the
    negative control)."""
    with_delay(settings, delay)
    tag = f"slow-{queue_name}"
    ids = gd.insert_all([gd.Spec(Sleeper, state={"after": tag}, queue=queue_name),
                         gd.Spec(Sleeper, state={"tag": tag, "sleep": 0.3}, queue=queue_name)])
    engine({queue_name: 2})
    for id_ in ids:
        assert gd.await_result(id_, timeout=20).status == "done"
    assert flushed(events, 2) == expected
    assert held(events) == waited


def test_a_lone_outcome_is_committed_without_waiting_for_max_delay(engine, committed, queue_name, settings, events):
    """Nothing else runs, so nothing could share the commit: MAX_DELAY (30 s here) is not
    waited out."""
    with_delay(settings, 30)
    engine({queue_name: 2})
    id_ = gd.insert(Sleeper, queue=queue_name)
    assert gd.await_result(id_, timeout=20).status == "done"
    assert flushed(events, 1) == [1]
    assert held(events) == [False]


def test_a_long_running_step_does_not_hold_the_other_outcomes(engine, committed, queue_name, settings, events):
    """A step that has run longer than MAX_DELAY is not about to finish: outcomes do not
    wait for it. Here, beside a 30 s step, a 20-link inline chain (each link commits
    before the next starts) with MAX_DELAY 0.1 s: not one of its flushes waited for the
    window (held for the long step, every one would). The long step is handed back when
    the worker stops at the end of the test."""
    with_delay(settings, 0.1)
    tag = f"long-{queue_name}"
    gd.insert(Sleeper, state={"tag": tag, "sleep": 30}, queue=queue_name)
    sup = engine({queue_name: 2})
    assert Sleeper.STARTED.setdefault(tag, threading.Event()).wait(10), "the long step started"
    wait_until(lambda: not any(s.young(0.1) for s in sup.schedulers.values()), what="the long step older than the window")
    chain = gd.insert(Chain, state={"n": 20}, queue=queue_name)
    assert gd.await_result(chain, timeout=30).status == "done"
    assert flushed(events, 20) == [1] * 20
    assert held(events) == [False] * 20, "a link waited for the long step"


def test_the_flusher_connects_when_the_worker_starts(engine, committed, queue_name, events):
    """Before any outcome: the first commit does not wait for Django's connection set-up."""
    sup = engine({queue_name: 1})
    name = role_name(sup, "flusher", queue_name)
    wait_until(lambda: sessions(name) == 1, what="the flusher's connection")
    assert flush_sizes(events) == [], "connected with nothing to flush yet"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the flusher's, on purpose
def test_a_worker_whose_flusher_thread_dies_stops_with_exit_code_1(committed, queue_name, monkeypatch, caplog):
    """Without its flusher nothing commits while the heartbeat keeps every held row leased:
    the worker notices the dead thread, stops (its held rows are handed back) and exits
    non-zero, so whatever runs it starts a new one."""
    from gen_durable.worker import flusher as flusher_module
    from gen_durable.worker.supervisor import Supervisor, WorkerConfig

    def broken(self):
        raise RuntimeError("flusher bug (test)")

    monkeypatch.setattr(flusher_module.Flusher, "_take", broken)
    sup = Supervisor(WorkerConfig(queues={queue_name: 1}))
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("code", sup.run(install_signals=False)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "the worker went on without its flusher"
    assert out["code"] == 1
    assert any("the flusher thread died" in r.getMessage() for r in caplog.records)
    # The dead thread closed its connection (left open, it blocked DROP DATABASE).
    assert sessions(role_name(sup, "flusher", queue_name)) == 0


@pytest.mark.django_db(transaction=True)
def test_flush_batches_are_bounded_by_encoded_bytes(engine, settings, queue_name, events, clean_tables):
    """FLUSH.MAX_BYTES 250 kB, results of 100 kB: at most two outcomes per flush however
    many wait (MAX_BATCH 100), so twelve outcomes take at least six flush statements."""
    from gen_durable.models import Instance

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "FLUSH": {"MAX_BATCH": 100, "MAX_DELAY": 0.05,
                                                              "MAX_BYTES": 250_000}}
    ids = [gd.insert(BigResult, args={"size": 100_000}, queue=queue_name) for _ in range(12)]
    engine({queue_name: 6})
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 12, timeout=60,
               what="all twelve done")

    def flushed():
        return [m["count"] for e, m, _ in list(events) if e == "flush.stop" and m["count"]]

    # flush.stop is emitted after its COMMIT: the rows can be seen done a moment before it.
    wait_until(lambda: sum(flushed()) == 12, what="the last flush's event")
    counts = flushed()
    assert sum(counts) == 12 and max(counts) <= 2 and len(counts) >= 6
    assert {len(r.result["blob"]) for r in Instance.objects.filter(id__in=ids)} == {100_000}
