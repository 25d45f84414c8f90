"""Per-step timeouts: a step past its timeout is abandoned and handled as gd.StepTimeout.

Each test blocks a step on an Event the test releases at the end (never a sleep past the
timeout plus a margin), then checks the instance moved on without it and the late
outcome, once the thread finally returns, changed nothing.
"""

import time
import uuid

import pytest
from django.core.checks import run_checks
from django.test import override_settings

import gen_durable as gd
from gen_durable.exceptions import InvalidInput
from gen_durable.models import Instance
from gen_durable.worker.executor import past_deadline, step_timeout
from gen_durable.worker.scheduler import Run, Scheduler
from tests.conftest import wait_until
from tests.durable_app.time_machines import Counter, Hangs, HangsDefault, gate, hang_job, hang_job_slow

WAIT = 15.0


def row(id_):
    return Instance.objects.get(id=id_)


@pytest.fixture
def gates():
    names = []

    def make():
        names.append(f"g{uuid.uuid4().hex[:8]}")
        return names[-1]

    yield make
    for name in names:
        gate(name).set()  # release every hung step thread


def test_step_past_its_timeout_goes_to_handle_and_the_late_outcome_is_dropped(engine, queue_name, gates):
    g = gates()
    sup = engine({queue_name: 1})
    sched = sup.schedulers[queue_name]
    id_ = gd.insert(Hangs, queue=queue_name, state={"gate": g})
    wait_until(lambda: row(id_).status == "done", timeout=WAIT, what="StepTimeout handled")
    assert row(id_).result == {"timed_out": True, "step": "start", "timeout": 0.5}
    assert (sched.stuck, sched.timed_out) == (1, 1)
    # Concurrency 1 and its thread is stuck: a replacement thread keeps the queue going.
    other = gd.insert(Counter, queue=queue_name, state={"target": 2})
    wait_until(lambda: row(other).status == "done", timeout=WAIT, what="the queue still runs")
    gate(g).set()  # the abandoned step returns Done({"late": True}) now: dropped
    wait_until(lambda: sched.stuck == 0, timeout=WAIT, what="the stuck thread returned")
    assert row(id_).result["timed_out"] is True
    assert sched.running == 0 and len([t for t in sched._steps if t.is_alive()]) == 1


def test_job_timeout_is_retried_by_backoff_and_a_late_attempt_changes_nothing(engine, queue_name, gates):
    g = gates()
    sup = engine({queue_name: 2})
    id_ = gd.insert(hang_job, queue=queue_name, args={"gate": g, "hang": [0]})
    wait_until(lambda: row(id_).status == "done", timeout=WAIT, what="attempt 1 done")
    assert row(id_).result == {"attempt": 1}
    gate(g).set()  # attempt 0 returns {"attempt": 0} late, on the same worker: dropped
    wait_until(lambda: sup.schedulers[queue_name].stuck == 0, timeout=WAIT, what="stuck thread returned")
    r = row(id_)
    assert (r.status, r.result, r.attempt) == ("done", {"attempt": 1}, 1)


def test_a_late_outcome_is_dropped_while_the_same_worker_runs_the_next_attempt(engine, queue_name, gates):
    """The row is executing again, claimed by the same worker id, when the abandoned
    attempt returns: the database guard would let its outcome commit; the scheduler
    drops it (the abandoned run never submits)."""
    a, b = gates(), gates()
    sup = engine({queue_name: 1})
    id_ = gd.insert(hang_job_slow, queue=queue_name, args={"gates": [a, b], "hang": [0, 1]})
    wait_until(lambda: (row(id_).status, row(id_).attempt) == ("executing", 1), timeout=WAIT,
               what="attempt 1 running")
    gate(a).set()  # attempt 0 returns {"attempt": 0} now
    wait_until(lambda: sup.schedulers[queue_name].stuck == 0, timeout=WAIT, what="attempt 0 returned")
    time.sleep(0.2)  # a submitted outcome would commit within a flush (~ms)
    r = row(id_)
    assert (r.status, r.attempt, r.result) == ("executing", 1, None)
    gate(b).set()
    wait_until(lambda: row(id_).status == "done", timeout=WAIT, what="attempt 1 done")
    assert row(id_).result == {"attempt": 1}


def test_a_job_that_always_times_out_fails_after_max_attempts(engine, queue_name, gates, events):
    g = gates()
    engine({queue_name: 1})
    id_ = gd.insert(hang_job, queue=queue_name, args={"gate": g, "hang": [0, 1, 2]})
    wait_until(lambda: row(id_).status == "failed", timeout=WAIT, what="failed after 3 attempts")
    r = row(id_)
    assert r.attempt == 2 and "StepTimeout" in r.last_error and "0.5s" in r.last_error
    assert len([e for e, _, _ in events if e == "step.timeout"]) == 3


def test_max_step_seconds_bounds_a_step_without_its_own_timeout(engine, queue_name, gates):
    g = gates()
    with override_settings(GEN_DURABLE={"EXTRA_QUEUES": ["q*"], "MAX_STEP_SECONDS": 0.5, "LEASE_TTL": 3, "HEARTBEAT_INTERVAL": 0.5,
                                         "POLL_INTERVAL": 0.05, "MAX_POLL_INTERVAL": 0.2}):
        engine({queue_name: 1})
        id_ = gd.insert(HangsDefault, queue=queue_name, state={"gate": g})
        wait_until(lambda: row(id_).status == "failed", timeout=WAIT, what="default timeout")
    assert "StepTimeout" in row(id_).last_error


def test_heartbeat_stops_renewing_a_step_past_its_timeout():
    class Job:
        id, claim = 7, 1

    sched = Scheduler("q", 1, worker_id="w", prefix="p", flusher=None, limiter=None,
                      settings=__import__("gen_durable.conf", fromlist=["x"]).get_settings())
    run = Run(Job())
    run.started, run.timeout, run.active = time.monotonic(), 30.0, True
    sched._runs["t"] = run
    sched.in_flight[7] = run.job
    assert sched.held_ids() == [7]
    run.started -= 31  # now past its deadline (the watchdog has not abandoned it yet)
    assert sched.held_ids() == []
    assert sched.next_step_deadline(time.monotonic()) == 0.0


def test_timeout_budget_rules():
    assert step_timeout(Hangs, "start") == 0.5
    assert step_timeout(hang_job, "perform") == 0.5
    assert step_timeout(HangsDefault, "start") == 3600
    assert step_timeout(None, "anything") == 3600
    assert past_deadline(0.0, 1.0, 1.0) and not past_deadline(0.0, 1.0, 0.99) and not past_deadline(0.0, None, 1e9)
    for bad in (0, -1, True, "5", float("nan")):
        with pytest.raises(InvalidInput, match="timeout"):
            gd.step(timeout=bad)
        with pytest.raises(InvalidInput, match="timeout"):
            gd.job(timeout=bad)(lambda args: None)


@pytest.mark.parametrize("value", [0, -5, "60", True])
def test_check_rejects_a_bad_max_step_seconds(value):
    with override_settings(GEN_DURABLE={"MAX_STEP_SECONDS": value}):
        ids = [e.id for e in run_checks()]
    assert "gen_durable.E020" in ids


def test_check_accepts_none_max_step_seconds():
    with override_settings(GEN_DURABLE={"MAX_STEP_SECONDS": None}):
        assert "gen_durable.E020" not in [e.id for e in run_checks()]
