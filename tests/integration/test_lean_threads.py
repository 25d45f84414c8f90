"""Lean step threads (worker/scheduler.py, QUICK_STEP): on a queue of quick steps one
thread takes the buffered rows and the others stay parked — but a step that turns out
to wait (I/O, a lock) does not hold the rows behind it: a parked thread takes them once
it has run LEAN_ESCAPE s (docs/performance.md, "The defaults"). Counted, not timed."""

import threading

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until


class Mixed(gd.Machine):
    """Quick steps, and one (state["block"]) that waits until the test lets it go."""

    name = "tests.lean.Mixed"
    RELEASE = threading.Event()
    THREADS: dict = {}

    @gd.step
    def start(self, ctx):
        self.THREADS[ctx.id] = threading.current_thread().name
        if ctx.state.get("block"):
            self.RELEASE.wait(60)
        return gd.Done()


def done(ids):
    return Instance.objects.filter(id__in=ids, status="done").count()


def test_rows_behind_a_step_that_blocks_run_on_a_parked_thread(engine, queue_name, monkeypatch):
    """Lean from the start (held there: the measured windows would leave it as soon as
    the blocked step spans one): the first row blocks its thread until every quick row
    behind it is done. Without the escape the quick rows wait for it — forever here."""
    from gen_durable.worker.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "_set_lean", lambda self, ended, quick: None)
    Mixed.RELEASE.clear()
    Mixed.THREADS.clear()
    blocker = gd.insert(Mixed, state={"block": True}, queue=queue_name)
    sup = engine({queue_name: 4})
    sched = sup.schedulers[queue_name]
    with sched._lock:
        sched.lean = True
    wait_until(lambda: blocker in Mixed.THREADS, timeout=30, what="the blocking step started")
    quick = gd.insert_all([gd.Spec(Mixed, queue=queue_name) for _ in range(50)])
    try:
        wait_until(lambda: done(quick) == len(quick), timeout=30, what="the quick rows done beside the blocked one")
        assert Instance.objects.get(id=blocker).status == "executing"
        assert Mixed.THREADS[blocker] not in {Mixed.THREADS[i] for i in quick}
    finally:
        Mixed.RELEASE.set()
    wait_until(lambda: done([blocker]) == 1, timeout=30, what="the blocked row done")
