"""Faults: kill -9, SIGTERM, start-up reclaim, dropped connections, long steps
(docs/design.md#leases, docs/design.md#worker, docs/design.md#reliability-bars).

Workers run either as a `rundurable` child process (tests/manage.py, pointed at the
test database) or in-process through the `engine` fixture. The `Recorder` machine
logs every step start and end to a file, which outlives a killed process; its first
run of an instance sleeps (the window to kill it in), re-runs do not.
"""

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker.supervisor import worker_prefix
from tests.conftest import wait_until
from tests.durable_app.durable import Recorder, SlowCounter
from tests.factories import InstanceFactory

ROOT = Path(__file__).resolve().parents[2]
RUNDURABLE = [sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable",
              "--verbosity", "0"]


@pytest.fixture
def worker_process():
    """Start `rundurable` children; any still running at teardown is killed."""
    procs = []

    def start(*args, **gen_durable):
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
                   GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
        if gen_durable:
            env["GEN_DURABLE_TEST_SETTINGS"] = json.dumps(gen_durable)
        proc = subprocess.Popen(RUNDURABLE + list(args), cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextmanager
def other_session():
    """A second connection; its transaction commits when the block exits."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as conn:
        yield conn


from tests.helpers import log_lines, tally  # noqa: E402,F401


def statuses(queue):
    return Counter(Instance.objects.filter(queue=queue).values_list("status", flat=True))


@pytest.mark.slow
def test_kill_9_mid_step_reruns_the_step_and_every_instance_ends_once(
        committed, engine, worker_process, queue_name, tmp_path):
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()  # first runs sleep while it exists
    ids = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 60},
                                 queue=queue_name) for _ in range(8)])
    proc = worker_process("--queue", f"{queue_name}=4", "--no-gc")
    wait_until(lambda: len(tally(log, "start")) == 4, timeout=60, what="four steps in flight")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    killed = set(tally(log, "start"))
    executing = Instance.objects.filter(queue=queue_name, status="executing")
    assert set(executing.values_list("id", flat=True)) == killed
    assert all(r.locked_by.startswith(worker_prefix(queue_name)) for r in executing)
    hold.unlink()

    engine({queue_name: 4})  # a new worker: start-up reclaim or the reaper returns the rows
    wait_until(lambda: statuses(queue_name) == {"done": 8}, timeout=30, what="all eight done")
    starts, ends = tally(log, "start"), tally(log, "end")
    assert ends == {i: 1 for i in ids}, "every step completed exactly once"
    assert starts == {i: 2 if i in killed else 1 for i in ids}, "the killed steps re-ran"


@pytest.mark.slow
def test_sigterm_mid_burst_exits_3_and_loses_nothing(committed, engine, worker_process, queue_name, tmp_path):
    """A burst stopped before its queues are done exits 3 (not 0: a script must not take it
    for "all done") and names what it left; nothing is lost — the rows left run later."""
    log = tmp_path / "steps.log"
    ids = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "sleep": 0.5}, queue=queue_name)
                         for _ in range(12)])
    proc = worker_process("--burst", "--queue", f"{queue_name}=2", PREFETCH=4)
    wait_until(lambda: len(tally(log, "start")) >= 2, timeout=60, what="steps in flight")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err[-3000:]
    assert f"leaving queue {queue_name}" in err, err[-3000:]

    # In-flight steps finished within DRAIN_TIMEOUT; buffered claims went back unbumped.
    assert statuses(queue_name)["executing"] == 0
    started = set(tally(log, "start"))
    assert set(tally(log, "end")) == started
    assert set(Instance.objects.filter(id__in=started).values_list("status", flat=True)) == {"done"}
    rest = Instance.objects.filter(queue=queue_name).exclude(id__in=started)
    assert rest.exists(), "the burst was interrupted before the end"
    assert {(r.status, r.attempt, r.locked_by) for r in rest} == {("runnable", 0, None)}

    engine({queue_name: 4})
    wait_until(lambda: statuses(queue_name) == {"done": 12}, timeout=30, what="all twelve done")
    assert tally(log, "end") == {i: 1 for i in ids}
    assert set(Instance.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {0}


def test_shutdown_releases_buffered_rows_even_when_one_is_locked_for_a_moment(
        committed, engine, settings, monkeypatch, queue_name, tmp_path):
    """release.sql passes over rows locked at that instant (SKIP LOCKED) — at shutdown,
    typically the worker's own heartbeat. The first release runs while another session
    holds the buffered rows; the shutdown must release them on a later attempt."""
    from gen_durable.worker import scheduler as scheduler_module

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 3}
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()
    ids = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 60},
                                 queue=queue_name) for _ in range(4)])
    sup = engine({queue_name: 1})
    wait_until(lambda: statuses(queue_name)["executing"] == 4 and len(tally(log, "start")) == 1,
               what="one step running and three rows buffered")
    (running,) = tally(log, "start")
    buffered = sorted(set(ids) - {running})
    real_release, calls = scheduler_module.release, []

    def release_while_locked(batch, worker, using=None, **kw):
        calls.append(sorted(j.id for j in batch))
        if len(calls) > 1:
            return real_release(batch, worker, using, **kw)
        hold.unlink()  # picking has stopped: the running step may finish during the drain
        with other_session() as other:
            other.execute("SELECT id FROM gen_durable WHERE id = ANY(%s) FOR NO KEY UPDATE", [[j.id for j in batch]])
            return real_release(batch, worker, using, **kw)  # skips them all; the lock goes at commit

    monkeypatch.setattr(scheduler_module, "release", release_while_locked)
    assert sup.stop() == {queue_name: {"released": 3, "in_flight": 0}}
    assert calls[0] == buffered
    assert {(r.status, r.attempt, r.locked_by) for r in Instance.objects.filter(id__in=buffered)} == \
        {("runnable", 0, None)}
    assert Instance.objects.get(id=running).status == "done"


def test_start_up_reclaims_a_dead_predecessors_decayed_claims_only(committed, engine, queue_name, events):
    prefix = worker_prefix(queue_name)
    dead = InstanceFactory(fsm="tests.Plain", queue=queue_name, status="executing", locked_by=prefix + "dead-1")
    live = InstanceFactory(fsm="tests.Plain", queue=queue_name, status="executing", locked_by=prefix + "live-1")
    # margin = LEASE_TTL - 2 × HEARTBEAT = 2 s. The dead claim's lease is below it but not
    # yet expired, so only the start-up reclaim (not the reaper) can free it this early.
    with connection.cursor() as cur:  # the database's clock (docs/design.md#one-clock)
        cur.execute("UPDATE gen_durable SET lease_expires_at = now() + interval '1.5 seconds' WHERE id = %s",
                    [dead.id])
        cur.execute("UPDATE gen_durable SET lease_expires_at = now() + interval '60 seconds' WHERE id = %s",
                    [live.id])
    live_lease = Instance.objects.get(id=live.id).lease_expires_at

    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.get(id=dead.id).status == "done", what="the reclaimed row done")
    # Reclaimed, not reaped (the predecessor died holding it, so the attempt counts, as
    # with the reaper — docs/reliability.md); last_error tells the two apart.
    r = Instance.objects.get(id=dead.id)
    assert r.attempt == 1 and "reclaimed at start-up" in r.last_error
    reclaimed = [(m, md) for e, m, md in events if e == "scheduler.reclaimed"]
    assert reclaimed == [({"count": 1}, {"queue": queue_name})]
    r = Instance.objects.get(id=live.id)
    assert (r.status, r.locked_by, r.lease_expires_at) == ("executing", prefix + "live-1", live_lease)


@pytest.mark.slow
def test_worker_survives_terminated_connections_and_finishes_everything(committed, engine, queue_name):
    ids = gd.insert_all([gd.Spec(SlowCounter, state={"target": 5, "sleep": 0.02}, queue=queue_name)
                         for _ in range(40)])
    sup = engine({queue_name: 4})
    killed, done_at_kill = 0, []
    for threshold in (10, 20, 30):
        wait_until(lambda: statuses(queue_name)["done"] >= threshold, timeout=60, what=f"{threshold} done")
        with connection.cursor() as cur:
            cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND backend_type = 'client backend'")
            killed += cur.fetchone()[0]
        done_at_kill.append(statuses(queue_name)["done"])
    assert killed > 0 and max(done_at_kill) < 40, "connections were killed mid-run"
    wait_until(lambda: statuses(queue_name) == {"done": 40}, timeout=60, what="all forty done")
    assert {r.result["count"] for r in Instance.objects.filter(id__in=ids)} == {5}
    assert sup.flusher._thread.is_alive()
    assert all(s._thread.is_alive() for s in sup.schedulers.values())
    if sup.listener is not None:
        wait_until(lambda: sup.listener.connects >= 2, what="the listener to reconnect")


@pytest.mark.slow
def test_heartbeated_step_outliving_its_lease_runs_once(committed, engine, settings, queue_name, tmp_path):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "LEASE_TTL": 1, "HEARTBEAT_INTERVAL": 0.2}
    log = tmp_path / "steps.log"
    id_ = gd.insert(Recorder, state={"log": str(log), "sleep": 2.5}, queue=queue_name)  # 2.5 × the lease
    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.get(id=id_).status == "done", timeout=30, what="the long step done")
    assert [(a, w) for i, a, w, _ in log_lines(log)] == [(0, "start"), (0, "end")]
    r = Instance.objects.get(id=id_)
    assert (r.attempt, r.result) == (0, {"attempt": 0})
