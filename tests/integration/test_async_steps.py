"""`async def` steps, handle() and job perform run on the worker process's event loop
(gen_durable/worker/aio.py; docs/guide.md "Async steps")."""

import json
import os
import signal
import subprocess
import threading
import time

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import drain
from gen_durable.worker import executor
from tests.conftest import wait_until
from tests.durable_app.async_machines import (
    AsyncAppName,
    AsyncInlineChain,
    AsyncJob,
    AsyncKinds,
    AsyncSelfCancel,
    AsyncSleeper,
    AsyncSlow,
    AsyncSlowJob,
    AsyncStubborn,
    AsyncSyncBlock,
    AsyncSyncBlockSyncHandle,
    AsyncTicker,
    Mixed,
    async_fn_job,
)
from tests.durable_app.durable import SlowCounter
from tests.integration.test_inline import SpyLimiter, use_limiter


def lines(path):
    return path.read_text().split("\n")[:-1] if path.exists() else []


def statuses(ids):
    return list(Instance.objects.filter(id__in=ids).values_list("status", flat=True))


def connections_to_this_database():
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cur.fetchone()[0]


def watch(done, every=0.05):
    """Sample (threads, database connections) until `done()`; return the peaks."""
    peak_threads = peak_conns = 0
    while not done():
        peak_threads = max(peak_threads, threading.active_count())
        peak_conns = max(peak_conns, connections_to_this_database())
        time.sleep(every)
    return peak_threads, peak_conns


def test_a_thousand_awaiting_steps_need_neither_a_thread_nor_a_connection_each(engine, queue_name):
    n = 1000
    ids = gd.insert_all([gd.Spec(AsyncSleeper, state={"sleep": 1}, queue=queue_name) for _ in range(n)])
    before = threading.active_count()
    # Connections of earlier tests' workers may still be closing: count this worker's on top.
    before_conns = connections_to_this_database()
    started = time.monotonic()
    engine({queue_name: n})
    threads, conns = watch(lambda: Instance.objects.filter(id__in=ids, status="done").count() == n)
    conns -= before_conns
    elapsed = time.monotonic() - started
    # The worker adds its roles (scheduler, flusher, heartbeat, listener, reaper, GC)
    # and one event loop: no thread and no connection per awaiting step.
    assert threads - before <= 10, f"{threads - before} threads for {n} concurrent async steps"
    assert conns <= 10, f"{conns} database connections for {n} concurrent async steps"
    print(f"\n{n} async steps of 1 s at concurrency {n}: {elapsed:.2f}s, {threads} threads, {conns} connections")


def test_async_steps_reach_the_database_on_a_connection_with_the_workers_options(engine, queue_name):
    """The shared sync thread's connection is bound like a step thread's (keepalives,
    application_name): docs/reliability.md, "Connections"."""
    id_ = gd.insert(AsyncAppName, queue=queue_name)
    engine({queue_name: 2})
    wait_until(lambda: Instance.objects.get(id=id_).status == "done", what="the async step done")
    assert Instance.objects.get(id=id_).result["application_name"].startswith("gen_durable async steps")


def test_control_sync_steps_take_a_thread_each(engine, queue_name):
    """The measurement above sees threads: 30 concurrent sync sleeps start 30 step threads."""
    ids = gd.insert_all([gd.Spec(SlowCounter, state={"sleep": 0.5, "target": 1}, queue=queue_name)
                         for _ in range(30)])
    before = threading.active_count()
    engine({queue_name: 30})
    threads, _ = watch(lambda: all(s == "done" for s in statuses(ids)))
    assert threads - before >= 30


@pytest.mark.parametrize("kind, expected", [
    ("next", {"via": "next", "awaited": [], "children": []}),
    ("retry", {"attempt": 1}),
    ("schedule", {"via": "schedule", "awaited": [], "children": ["done", "done"]}),
    ("done", {"via": "done"}),
    ("raise", {"handled": "ValueError('async boom')"}),
    ("orm", {"count": 1, "status": "executing"}),
])
def test_every_outcome_kind_from_an_async_step(engine, queue_name, kind, expected):
    id_ = gd.insert(AsyncKinds, queue=queue_name, state={"kind": kind})
    engine({queue_name: 4})
    wait_until(lambda: statuses([id_]) == ["done"], what=f"{kind} done")
    assert Instance.objects.get(id=id_).result == expected


def test_await_stop_and_a_bad_value_from_async_steps(engine, queue_name):
    waiting = gd.insert(AsyncKinds, queue=queue_name, state={"kind": "await"})
    stopped = gd.insert(AsyncKinds, queue=queue_name, state={"kind": "stop"})
    bad = gd.insert(AsyncKinds, queue=queue_name, state={"kind": "nonsense"})
    engine({queue_name: 4})
    wait_until(lambda: statuses([waiting]) == ["awaiting_signal"], what="parked")
    gd.signal(waiting, "go", {"p": 1})
    wait_until(lambda: statuses([waiting, stopped, bad]).count("done") == 2, what="woken and handled")
    assert Instance.objects.get(id=waiting).result == {"via": "await", "awaited": [{"p": 1}], "children": []}
    row = Instance.objects.get(id=stopped)
    assert (row.status, row.last_error) == ("failed", "stopped from async")
    handled = Instance.objects.get(id=bad).result["handled"]
    assert "InvalidOutcome" in handled and "(returned by AsyncKinds.start, defined at " in handled


def test_async_jobs(engine, queue_name):
    ok = gd.insert(AsyncJob, args={"x": 21}, queue=queue_name)
    failing = gd.insert(AsyncJob, args={"fail": True}, queue=queue_name)
    fn = gd.insert(async_fn_job, args={"x": 7}, queue=queue_name)
    engine({queue_name: 4})
    wait_until(lambda: sorted(statuses([ok, failing, fn])) == ["done", "done", "failed"], what="settled")
    assert Instance.objects.get(id=ok).result == {"doubled": 42}
    assert Instance.objects.get(id=fn).result == {"got": 7}
    row = Instance.objects.get(id=failing)
    assert row.attempt == 1 and "async job failed" in row.last_error


@pytest.mark.parametrize("inline", [False, True])
def test_sync_and_async_steps_share_a_queue(engine, queue_name, tmp_path, inline):
    log = tmp_path / "log"
    ids = gd.insert_all([gd.Spec(Mixed, queue=queue_name, state={"log": str(log), "inline": inline})
                         for _ in range(20)])
    engine({queue_name: 4})
    wait_until(lambda: all(s == "done" for s in statuses(ids)), what="all done")
    threads = {line.split()[1]: set() for line in lines(log)}
    for line in lines(log):
        _, step, _, thread, _ = line.split()
        threads[step].add(thread)
    assert threads["middle"] == {"gd-async-loop"}
    assert not (threads["start"] & {"gd-async-loop"}), "sync steps never run on the loop"


def test_cancelling_a_running_async_step_drops_its_outcome(engine, queue_name, tmp_path, events):
    log = tmp_path / "log"
    id_ = gd.insert(AsyncSleeper, queue=queue_name, state={"sleep": 0.5, "log": str(log)})
    engine({queue_name: 4})
    wait_until(lambda: lines(log), what="step started")
    gd.cancel(id_, "cancelled while awaiting")
    wait_until(lambda: any(e == "outcome.stale" and m["id"] == id_ for e, _, m in events), what="stale outcome")
    row = Instance.objects.get(id=id_)
    assert (row.status, row.last_error, row.result) == ("failed", "cancelled while awaiting", None)
    assert len(lines(log)) == 2, "the step ran to its end; its outcome was dropped"


def test_stop_drains_async_steps_and_cancels_those_past_the_drain_timeout(engine, queue_name, tmp_path):
    log = tmp_path / "log"
    quick = gd.insert(AsyncSleeper, queue=queue_name, state={"sleep": 0.5, "log": str(log)})
    slow = gd.insert(AsyncSleeper, queue=queue_name, state={"sleep": 60, "log": str(log)})
    sup = engine({queue_name: 4})
    wait_until(lambda: len(lines(log)) == 2, what="both started")
    sup.stop()  # what SIGTERM runs; DRAIN_TIMEOUT is 2 s in the test settings
    assert statuses([quick]) == ["done"], "an in-flight step within the drain timeout commits"
    row = Instance.objects.get(id=slow)
    assert row.status == "executing" and row.result is None, "a cancelled step commits nothing; its lease recovers it"
    assert not any(":end" in line and line.startswith(f"{slow} ") for line in lines(log))


def test_a_cancelled_async_step_is_settled_before_the_shutdown_hands_back_running_steps(
        engine, queue_name, tmp_path):
    # stop() cancels the async steps past the drain, then the supervisor hands back what
    # still runs. The cancellation is carried out on the loop: stop() waits (bounded) for
    # the cancelled steps to leave, so one whose cleanup takes a moment is not mistaken
    # for a running step and handed back; as documented, its lease recovers it.
    from tests.durable_app.async_machines import AsyncSlowCancel

    log = tmp_path / "log"
    slow = gd.insert(AsyncSlowCancel, queue=queue_name, state={"sleep": 60, "cleanup": 0.3, "log": str(log)})
    sup = engine({queue_name: 2})
    wait_until(lambda: len(lines(log)) == 1, what="started")
    sup.stop()
    row = Instance.objects.get(id=slow)
    assert (row.status, row.attempt, row.result) == ("executing", 0, None)


def test_async_inline_chain_and_its_orphan(engine, queue_name, tmp_path, events):
    log, held = tmp_path / "log", tmp_path / "hold"
    chained = gd.insert(AsyncInlineChain, queue=queue_name, state={"log": str(log)})
    sup = engine({queue_name: 4})
    wait_until(lambda: statuses([chained]) == ["done"], what="chain done")
    assert [(m["from"], m["to"]) for e, _, m in events if e == "inline.continue" and m["id"] == chained] == \
        [("a", "b"), ("b", "c")]

    held.touch()
    spy = SpyLimiter()
    use_limiter(sup, spy)
    orphan = gd.insert(AsyncInlineChain, queue=queue_name, state={"log": str(log), "hold": str(held)})
    wait_until(lambda: any(line.startswith(f"{orphan} a") for line in lines(log)), what="a running")
    gd.cancel(orphan, "cancelled mid-step")
    held.unlink()
    wait_until(lambda: any(e == "outcome.stale" and m["id"] == orphan for e, _, m in events), what="stale")
    sup.stop()
    assert [line.split()[1] for line in lines(log) if line.startswith(f"{orphan} ")] == ["a"]
    assert spy.calls == []


def test_an_async_step_past_its_timeout_is_cancelled_and_handled_as_step_timeout(engine, queue_name, events):
    slow = gd.insert(AsyncSlow, queue=queue_name, state={"sleep": 5})
    quick = gd.insert(AsyncSlow, queue=queue_name, state={"sleep": 0})
    own = gd.insert(AsyncSlow, queue=queue_name, state={"own_timeout": True})
    job = gd.insert(AsyncSlowJob, queue=queue_name)
    engine({queue_name: 4})
    wait_until(lambda: statuses([slow, quick, own, job]) == ["done"] * 4, what="all done")
    assert Instance.objects.get(id=slow).result == {"error": "StepTimeout", "timeout": 0.3}
    assert Instance.objects.get(id=quick).result == {"finished": True}
    # A TimeoutError the step raises itself is its own error, not the engine's timeout.
    assert Instance.objects.get(id=own).result == {"error": "TimeoutError", "timeout": None}
    row = Instance.objects.get(id=job)
    assert row.result == {"attempt": 1} and "StepTimeout" in row.last_error  # retried like any error
    assert "(cancelled after 0." in row.last_error  # it ended on its cancellation: not abandoned
    timed_out = {m["id"] for e, _, m in events if e == "step.timeout"}
    assert timed_out == {slow, job}


def test_an_async_step_that_swallows_its_cancellation_is_abandoned_into_handle(engine, queue_name, caplog):
    """It catches CancelledError and runs on: ASYNC_CANCEL_GRACE (1 s) after its timeout it
    is left to the loop and the instance goes to handle() with StepTimeout, well before
    the step ends (it would have held the row `executing`, heartbeated, for as long as it
    ran); its late Done is dropped. Control: `quick`, in the same process, is unaffected."""
    stubborn = gd.insert(AsyncStubborn, queue=queue_name, state={"for": 6})
    engine({queue_name: 4})
    wait_until(lambda: statuses([stubborn]) == ["done"], timeout=4, what="handled well before the step ends")
    handled = Instance.objects.get(id=stubborn).result
    assert handled["error"] == "StepTimeout" and "(abandoned after 1." in handled["message"]
    assert any("ignored its cancellation at its timeout of 0.3s: abandoned" in r.getMessage()
               and "abandoned async step(s) in this process" in r.getMessage() for r in caplog.records)
    assert executor.abandoned_async_steps() >= 1  # counted while it runs on (a 6 s step)
    quick = gd.insert(AsyncSlow, queue=queue_name, state={"sleep": 0})
    wait_until(lambda: statuses([quick]) == ["done"], what="the loop runs other steps meanwhile")
    wait_until(lambda: any(f"abandoned async step tests.AsyncStubborn#{stubborn} start ended after" in r.getMessage()
                           for r in caplog.records), timeout=10, what="the abandoned step's end logged")
    assert Instance.objects.get(id=stubborn).result == handled, "its late Done was dropped"


def test_handle_of_an_abandoned_async_step_sees_the_committed_state(engine, queue_name):
    """The abandoned step goes on writing ctx.state while handle() runs; handle() (and what
    it commits) gets the state as committed at the claim. Control: handle() shared the
    step's dict, and the late writes were committed."""
    ticker = gd.insert(AsyncTicker, queue=queue_name, state={"n": 1})
    engine({queue_name: 2})
    wait_until(lambda: statuses([ticker]) == ["done"], timeout=10, what="handled and moved on")
    assert Instance.objects.get(id=ticker).result == {"state": {"n": 1}}


def test_an_async_steps_own_cancelled_error_goes_to_handle(engine, queue_name, caplog):
    """Not a timeout, not a shutdown: the step is handled once (it was re-run every lease,
    logged as "cancelled at shutdown")."""
    own = gd.insert(AsyncSelfCancel, queue=queue_name)
    engine({queue_name: 2})
    wait_until(lambda: statuses([own]) == ["done"], what="handled")
    assert Instance.objects.get(id=own).result == {
        "handled": "StepCancelled", "message": "the async step was cancelled by its own code (asyncio.CancelledError)"}
    assert not any("cancelled at shutdown" in r.getMessage() for r in caplog.records)


def test_an_async_handle_that_swallows_its_cancellation_fails_the_instance(engine, queue_name):
    """handle(StepTimeout) swallows its own cancellation too: it is abandoned in turn and
    the instance fails, saying why (a sync handle() abandoned past the timeout does the same)."""
    both = gd.insert(AsyncStubborn, queue=queue_name, state={"for": 6, "handle_for": 6})
    engine({queue_name: 2})
    wait_until(lambda: statuses([both]) == ["failed"], timeout=5, what="failed well before either ends")
    assert Instance.objects.get(id=both).last_error.startswith(
        "handle() failed: TimeoutError: handle() did not return within the step timeout of 0.3s "
        "(while handling StepTimeout: step 'start' ran past its timeout of 0.3s (abandoned after 1.")


def test_an_async_step_that_blocks_the_loop_past_its_timeout_is_logged(engine, queue_name, caplog):
    """It never awaits, so nothing can cancel it: its outcome stands, and the overrun that
    held every other async step of the process is said."""
    blocker = gd.insert(AsyncStubborn, queue=queue_name, state={"for": 1, "block": True})
    engine({queue_name: 2})
    wait_until(lambda: statuses([blocker]) == ["done"], what="done")
    assert Instance.objects.get(id=blocker).result == {"finished": True}
    assert any("without giving the event loop a turn, past its timeout of 0.3s" in r.getMessage()
               for r in caplog.records)


def test_a_step_holding_the_shared_sync_thread_does_not_hold_other_async_steps(engine, settings, queue_name):
    """A step's sync_to_async call that does not return holds Django's shared sync thread,
    past the step's timeout too. The engine's own statements for async steps (a buffered
    row's re-check) run on a thread of their own (aio.engine_call), so buffered async
    rows that need no sync call still start and finish meanwhile. Control: on the shared
    thread (sync_to_async) they waited, re-check pending, until the call returned."""
    from tests.durable_app.async_machines import HOLD_SYNC_THREAD

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 50}
    HOLD_SYNC_THREAD.clear()
    try:
        blocker = gd.insert(AsyncSyncBlock, queue=queue_name)
        engine({queue_name: 4})
        wait_until(lambda: statuses([blocker]) == ["done"], what="the blocker timed out and handled")
        assert Instance.objects.get(id=blocker).result == {"error": "StepTimeout"}
        ids = gd.insert_all([gd.Spec(AsyncSleeper, state={"sleep": 0.2}, queue=queue_name) for _ in range(40)])
        wait_until(lambda: statuses(ids) == ["done"] * 40, timeout=30,
                   what="buffered async rows re-checked and run while the shared thread is held")
        assert not HOLD_SYNC_THREAD.is_set()
    finally:
        HOLD_SYNC_THREAD.set()


def test_a_sync_handle_behind_the_held_shared_sync_thread_fails_the_instance_at_the_timeout(engine, queue_name):
    """The step timed out in a sync_to_async call that still holds Django's shared sync
    thread; the machine's sync handle() runs on that thread too. It is bounded by the step
    timeout as an async handle() is: the instance fails, saying why. Control: awaited
    unbounded, the row stayed `executing`, heartbeated, until the call returned."""
    from tests.durable_app.async_machines import HOLD_SYNC_THREAD

    HOLD_SYNC_THREAD.clear()
    try:
        stuck = gd.insert(AsyncSyncBlockSyncHandle, queue=queue_name)
        engine({queue_name: 2})
        wait_until(lambda: statuses([stuck]) == ["failed"], timeout=5, what="failed at handle()'s budget")
        assert not HOLD_SYNC_THREAD.is_set()
        assert Instance.objects.get(id=stuck).last_error.startswith(
            "handle() failed: TimeoutError: handle() did not return within the step timeout of 0.5s (it never "
            "started: a sync handle() of an async machine runs on Django's shared sync thread")
    finally:
        HOLD_SYNC_THREAD.set()


def test_a_sync_handle_has_the_step_timeout_as_its_budget_and_is_told_apart_from_one_that_never_ran(
        engine, queue_name):
    """Within the budget it stands; past it the instance fails as a sync machine's does,
    without blaming the shared sync thread (it was free: handle() ran)."""
    from tests.durable_app.async_machines import AsyncRaisesSyncHandle

    quick = gd.insert(AsyncRaisesSyncHandle, queue=queue_name, state={"handle_sleep": 0.05})
    slow = gd.insert(AsyncRaisesSyncHandle, queue=queue_name, state={"handle_sleep": 1.0})
    engine({queue_name: 2})
    wait_until(lambda: sorted(statuses([quick, slow])) == ["done", "failed"], timeout=10, what="both ended")
    assert Instance.objects.get(id=quick).result == {"handled": "RuntimeError"}
    error = Instance.objects.get(id=slow).last_error
    assert error.startswith("handle() failed: TimeoutError: handle() did not return within the step timeout of 0.3s "
                            "(while handling RuntimeError: boom)")


def test_drain_runs_async_steps_in_the_calling_thread(db):
    id_ = gd.insert(AsyncKinds, state={"kind": "next"})
    tally = drain()
    assert tally["next"] == 1 and tally["done"] == 1
    assert Instance.objects.get(id=id_).result["via"] == "next"


@pytest.mark.django_db(transaction=True)
def test_drain_leaves_no_connection_of_async_steps_open(queue_name):
    """An async step's database work goes through asgiref's shared sync thread; drain()
    closes that connection, or pytest could not drop the test database at the end."""
    id_ = gd.insert(AsyncAppName, queue=queue_name)
    drain(queue_name)
    assert Instance.objects.get(id=id_).result["application_name"].startswith("gen_durable async steps")

    def async_step_sessions():
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND application_name LIKE 'gen_durable async steps%%'")
            return cur.fetchone()[0]

    # A closed session leaves pg_stat_activity when its backend has exited, a moment after
    # the client closed it (longer on a busy machine); one left open never does.
    wait_until(lambda: async_step_sessions() == 0, timeout=10, what="no async-step session left")


@pytest.mark.slow
def test_sigterm_drains_in_flight_async_steps_and_exits_0(committed, queue_name, tmp_path):
    from tests.races.test_faults import ROOT, RUNDURABLE

    log = tmp_path / "log"
    ids = gd.insert_all([gd.Spec(AsyncSleeper, state={"sleep": 0.5, "log": str(log)}, queue=queue_name)
                         for _ in range(40)])
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"],
               GEN_DURABLE_TEST_SETTINGS=json.dumps({"PREFETCH": 10}))
    proc = subprocess.Popen(RUNDURABLE + ["--queue", f"{queue_name}=10", "--no-gc"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(lines(log)) >= 10, timeout=60, what="async steps in flight")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert statuses(ids).count("executing") == 0
    started = {line.split()[0] for line in lines(log) if ":start" in line}
    ended = {line.split()[0] for line in lines(log) if ":end" in line}
    assert started == ended, "every started async step finished within the drain"
    assert set(statuses([int(i) for i in started])) == {"done"}


@pytest.fixture(autouse=True)
def _close_the_shared_sync_thread_connection():
    """drain() and async steps reach the database through Django's shared sync thread."""
    yield
    from gen_durable.worker import aio

    aio.close_sync_thread_connections()
