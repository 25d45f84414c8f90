"""The step loop under stress: a slot given back with the next take wakes the feeder, a step leaving a
transaction open before more steps on the same thread, steps ending at their timeout,
mixed sync/async/inline chains with cancels, the inputs of continued steps, and a stop
mid-stream — each instance gets exactly one outcome and the scheduler's books (running,
buffer, in flight, and the flusher's running steps) return to zero (docs/design.md#worker)."""

import random
import threading
import time

import pytest
from django.db import connection, connections, transaction

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until


def statuses(ids):
    return dict(Instance.objects.filter(id__in=ids).values_list("id", "status"))


def all_terminal(ids):
    return Instance.objects.filter(id__in=ids, status__in=["done", "failed"]).count() == len(ids)


def settled(sched):
    """The scheduler's books once nothing is left to run, and the flusher's count of
    steps started but not submitted (its group-commit window waits on it)."""
    with sched._lock:
        return (sched.running, len(sched.buffer), len(sched.in_flight), sched._continuations, sched.stuck,
                sched.flusher._running)


def wait_settled(sched, timeout=10):
    wait_until(lambda: settled(sched) == (0, 0, 0, 0, 0, 0), timeout=timeout,
               what="scheduler books back to zero (running, buffer, in_flight, continuations, stuck, "
                    "flusher running)")


# --- 1. the slot handed back with the next take vs the feeder's wake -----------------


class Quick(gd.Machine):
    name = "tests.steploop.Quick"

    @gd.step
    def start(self, ctx):
        return gd.Done()


class Queries(gd.Machine):
    """A step that reads the database (as most do): its thread's connection is open."""

    name = "tests.steploop.Queries"

    @gd.step
    def start(self, ctx):
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        return gd.Done()


def test_a_step_thread_that_hands_its_slot_back_with_an_empty_buffer_wakes_the_feeder(
        engine, queue_name, monkeypatch, settings):
    """Concurrency 1, a backlog of rows. The step thread submits its outcome and gives
    its slot back only at the top of its next loop iteration, after its post-step
    clean-up. A flush that commits meanwhile wakes the feeder through settle(), and the
    feeder computes demand = 0 (the owed slot still counts as running) and goes back to
    sleep for a whole poll interval unless the slot's return wakes it again. So every
    return of a slot that leaves the buffer empty must set the feeder's wake-up — from
    the step thread, with the slot already free: one per row here (with concurrency 1
    and no PREFETCH the buffer is empty whenever a slot comes back). Counted, not timed."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 0, "MIN_DEMAND": 1}  # no claim-ahead
    wakes = []

    class RecordingEvent(threading.Event):
        owner = None

        def set(self):
            sched = self.owner
            if sched is not None and threading.current_thread().name.startswith("gd-step-"):
                wakes.append((sched.running, len(sched.buffer)))
            super().set()

    with monkeypatch.context() as m:
        m.setattr(threading, "Event", RecordingEvent)  # the scheduler's _wake, made at start
        sup = engine({queue_name: 1})
    sched = sup.schedulers[queue_name]
    assert isinstance(sched._wake, RecordingEvent)
    sched._wake.owner = sched
    ids = gd.insert_all([gd.Spec(Queries, queue=queue_name) for _ in range(5)])
    wait_until(lambda: all_terminal(ids), timeout=60, what="the backlog done")
    wait_settled(sched)
    # (running, buffer) at each wake from a step thread: the takes that empty the buffer
    # wake it with the slot held (1, 0); the returns of a slot with (0, 0).
    assert wakes.count((0, 0)) == len(ids), wakes


# --- 2. a step leaving a transaction open, then more steps on the same thread ----------


class Leak(gd.Machine):
    """Leaves a transaction open the way state["leak"] says; every step records the
    application_name of its connection (the step thread's options)."""

    name = "tests.steploop.Leak"
    SEEN: dict = {}

    @gd.step
    def start(self, ctx):
        with connection.cursor() as cur:
            cur.execute("SELECT current_setting('application_name')")
            self.SEEN[ctx.id] = cur.fetchone()[0]
        how = ctx.state.get("leak")
        if how == "atomic":
            transaction.atomic().__enter__()
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
        elif how == "begin":
            with connection.cursor() as cur:
                cur.execute("BEGIN")
        elif how == "autocommit":
            transaction.set_autocommit(False)
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
        elif how == "error-then-handle-leaks":
            raise RuntimeError("boom")
        elif how == "inerror":
            with connection.cursor() as cur:
                cur.execute("BEGIN")
                try:
                    cur.execute("SELECT * FROM no_such_table_step_loop")
                except Exception:
                    pass
        return gd.Done({"app": self.SEEN[ctx.id]})

    def handle(self, error, ctx):
        if ctx.state.get("leak") == "error-then-handle-leaks":
            transaction.atomic().__enter__()
            with connection.cursor() as cur:
                cur.execute("SELECT 1")
        return gd.Stop(type(error).__name__)


@pytest.mark.parametrize("threads", [1, 3])
def test_every_step_after_a_leak_runs_on_a_rebound_connection(engine, queue_name, monkeypatch, threads):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", None)
    Leak.SEEN.clear()
    kinds = ["atomic", "begin", "autocommit", "error-then-handle-leaks", "inerror"]
    specs = []
    for i in range(60):
        leak = kinds[i % len(kinds)] if i % 2 == 0 else None
        specs.append(gd.Spec(Leak, state={"leak": leak}, queue=queue_name))
    ids = gd.insert_all(specs)
    sup = engine({queue_name: threads})
    wait_until(lambda: all_terminal(ids), timeout=60, what="every instance terminal")
    clean = [i for i, s in zip(ids, specs) if s.kwargs["state"]["leak"] is None]
    assert set(statuses(clean).values()) == {"done"}
    wrong = {i: Leak.SEEN[i] for i in Leak.SEEN if not Leak.SEEN[i].startswith("gen_durable step")}
    assert not wrong, f"steps ran on a connection without the step thread's options: {wrong}"
    wait_settled(sup.schedulers[queue_name])


# --- 3. step timeouts racing with step completion ---------------------------------


class Edge(gd.Machine):
    """Sleeps about its own 50 ms budget: some finish, some are abandoned."""

    name = "tests.steploop.Edge"
    RAN: dict = {}
    lock = threading.Lock()

    @gd.step(timeout=0.05)
    def start(self, ctx):
        with self.lock:
            self.RAN[ctx.id] = self.RAN.get(ctx.id, 0) + 1
        time.sleep(ctx.state["sleep"])
        return gd.Done({"by": "step"})

    def handle(self, error, ctx):
        if isinstance(error, gd.StepTimeout):
            return gd.Done({"by": "timeout"})
        return gd.Stop(repr(error))


@pytest.mark.parametrize("threads", [1, 4])
def test_steps_ending_at_their_timeout_get_exactly_one_outcome_and_the_books_balance(
        engine, queue_name, settings, threads):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 2}
    rnd = random.Random(4)
    n = 60 if threads == 1 else 160
    ids = gd.insert_all([gd.Spec(Edge, state={"sleep": rnd.uniform(0.035, 0.065)}, queue=queue_name)
                         for _ in range(n)])
    sup = engine({queue_name: threads})
    sched = sup.schedulers[queue_name]
    wait_until(lambda: all_terminal(ids), timeout=90, what="every instance terminal")
    rows = list(Instance.objects.filter(id__in=ids).values_list("status", "result"))
    assert {s for s, _ in rows} == {"done"}, [r for r in rows if r[0] != "done"][:5]
    by_timeout = sum(1 for _, r in rows if r == {"by": "timeout"})
    wait_settled(sched)
    # Whichever way each step's race with its budget went (wall-clock dependent), every
    # row has one outcome and each abandoned step was handled exactly once.
    assert by_timeout == sched.timed_out
    with sched._lock:
        alive = [t for t in sched._steps if t.is_alive()]
        assert sched._threads == len(alive) <= threads
    # More work still runs at full concurrency after the storm.
    more = gd.insert_all([gd.Spec(Quick, queue=queue_name) for _ in range(20)])
    wait_until(lambda: all_terminal(more), timeout=30, what="later work done")
    wait_settled(sched)


# --- 4. mixed sync / async / inline with prefetch and cancels -------------------------


class SyncInline(gd.Machine):
    name = "tests.steploop.SyncInline"
    inline_execution = True

    @gd.step
    def start(self, ctx):
        n = ctx.state.get("n", 0) + 1
        if n >= 4:
            return gd.Done({"n": n})
        return gd.Next("start", state={"n": n})


class AsyncInline(gd.Machine):
    name = "tests.steploop.AsyncInline"
    inline_execution = True

    @gd.step
    async def start(self, ctx):
        n = ctx.state.get("n", 0) + 1
        if n >= 3:
            return gd.Done({"n": n})
        if n == 1:
            return gd.Next("sync_step", state={"n": n})
        return gd.Next("start", state={"n": n})

    @gd.step
    def sync_step(self, ctx):
        return gd.Next("start", state={"n": ctx.state["n"]})


@pytest.mark.parametrize("threads,prefetch", [(1, 0), (1, 5), (6, 0), (6, 10)])
def test_mixed_sync_async_inline_with_cancels_leaves_the_books_at_zero(engine, queue_name, settings,
                                                                       threads, prefetch):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": prefetch}
    specs = []
    for i in range(150):
        cls = (Quick, SyncInline, AsyncInline)[i % 3]
        specs.append(gd.Spec(cls, queue=queue_name))
    ids = gd.insert_all(specs)
    sup = engine({queue_name: threads})
    sched = sup.schedulers[queue_name]
    cancelled = []
    for id_ in ids[60::7]:
        try:
            gd.cancel(id_, "stress test")
            cancelled.append(id_)
        except Exception:
            pass
    wait_until(lambda: all_terminal(ids), timeout=90, what="every instance terminal")
    rows = dict(Instance.objects.filter(id__in=ids).values_list("id", "status"))
    bad = {i: s for i, s in rows.items() if s != "done" and i not in cancelled}
    assert not bad
    wait_settled(sched)


# --- 5. inline continuations: the inputs of the continued step -------------------------


class InlineInputs(gd.Machine):
    """a signals itself and schedules nothing; b (inline) must see the signal; b then
    schedules a child; joined -> check (inline) must see the child."""

    name = "tests.steploop.InlineInputs"
    initial = "a"
    inline_execution = True
    SEEN: dict = {}

    @gd.step
    def a(self, ctx):
        gd.signal(ctx.id, "mid", {"k": ctx.id})
        return gd.Next("b")

    @gd.step
    def b(self, ctx):
        self.SEEN.setdefault(ctx.id, {})["b"] = [s.name for s in ctx.all]
        return gd.ScheduleChildren("joined", [gd.Child(Quick, queue=ctx.queue)])

    @gd.step
    def joined(self, ctx):
        return gd.Next("check")

    @gd.step
    def check(self, ctx):
        self.SEEN.setdefault(ctx.id, {})["check"] = [c.status for c in ctx.children]
        return gd.Done()


def test_inline_continued_steps_see_signals_and_children_loaded_by_the_flush(engine, queue_name):
    InlineInputs.SEEN.clear()
    ids = gd.insert_all([gd.Spec(InlineInputs, queue=queue_name) for _ in range(30)])
    engine({queue_name: 4})
    wait_until(lambda: all_terminal(ids), timeout=60, what="every instance terminal")
    assert set(statuses(ids).values()) == {"done"}
    for id_ in ids:
        assert InlineInputs.SEEN[id_]["b"] == ["mid"], (id_, InlineInputs.SEEN[id_])
        assert InlineInputs.SEEN[id_]["check"] == ["done"], (id_, InlineInputs.SEEN[id_])


# --- 6. shutdown while step threads hold an owed slot; telemetry toggled meanwhile ------


class Slowish(gd.Machine):
    name = "tests.steploop.Slowish"
    inline_execution = True

    @gd.step
    def start(self, ctx):
        with connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(0.002)")
        n = ctx.state.get("n", 0) + 1
        if n >= 3:
            return gd.Done()
        return gd.Next("start", state={"n": n})


@pytest.mark.parametrize("threads", [1, 8])
def test_stop_mid_stream_with_telemetry_toggling_leaves_nothing_held(engine, queue_name, settings, threads):
    from gen_durable import telemetry

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 4}
    ids = gd.insert_all([gd.Spec(Slowish, queue=queue_name) for _ in range(400)])
    sup = engine({queue_name: threads})
    sched = sup.schedulers[queue_name]
    stop_toggle = threading.Event()
    errors = []

    def handler(event, measurements, metadata):
        if event == "step.stop" and "duration" not in measurements:
            errors.append(measurements)

    def toggle():
        while not stop_toggle.is_set():
            telemetry.attach("", handler)
            time.sleep(0.001)
            telemetry.detach(handler)
            time.sleep(0.001)

    t = threading.Thread(target=toggle, daemon=True)
    t.start()
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() >= 40, timeout=30,
               what="some work done")
    sup.stop()
    stop_toggle.set()
    t.join()
    assert not errors
    for th in list(sched._steps):
        th.join(5)
    assert not any(th.is_alive() for th in sched._steps)
    assert (sched.running, len(sched.buffer), len(sched.in_flight)) == (0, 0, 0)
    # Nothing stays executing: released, handed back or committed.
    wait_until(lambda: not Instance.objects.filter(id__in=ids, status="executing").exists(), timeout=10,
               what="no row left executing")
    # A fresh worker finishes the rest.
    engine({queue_name: threads})
    wait_until(lambda: all_terminal(ids), timeout=60, what="the rest done")
    assert set(statuses(ids).values()) == {"done"}
