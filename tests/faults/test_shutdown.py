"""Shutdown (docs/reliability.md "Shutdown"): what SIGTERM cuts off after DRAIN_TIMEOUT
is handed back at once, not left leased until the reaper."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.supervision_machines import Sleeper

ROOT = Path(__file__).resolve().parents[2]


def lines(log, what=None):
    if not log.exists():
        return []
    out = [line.split() for line in log.read_text().splitlines()]
    return [f for f in out if len(f) == 6 and (what is None or f[3] == what)]


def start_worker(queue, tmp_path, name, **gen_durable):
    from tests.integration.test_rundurable import child_env

    out = open(tmp_path / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable", "--queue",
                             f"{queue}=2", "--verbosity", "1"], cwd=ROOT, env=child_env(**gen_durable),
                            stdout=out, stderr=subprocess.STDOUT, text=True)
    out.close()
    return proc


def test_sigterm_hands_back_steps_still_running_after_the_drain(committed, queue_name, tmp_path):
    """30 s steps sized down: 20 s steps, DRAIN_TIMEOUT 1 s, a 60 s lease. On main the
    cut-off rows kept their lease (executing, locked by the dead worker) for a minute."""
    log = tmp_path / "runs.log"
    ids = [gd.insert(Sleeper, args={"log": str(log), "sleep": 20, "once": True}, queue=queue_name)
           for _ in range(2)]
    conf = dict(LEASE_TTL=60, HEARTBEAT_INTERVAL=20, DRAIN_TIMEOUT=1, REAPER={"INTERVAL": 60})
    first = start_worker(queue_name, tmp_path, "first", **conf)
    try:
        wait_until(lambda: len(lines(log, "start")) == 2, timeout=60, what="both steps running")
        first.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0
    finally:
        if first.poll() is None:
            first.kill()
    rows = Instance.objects.filter(id__in=ids)
    assert {(r.status, r.attempt, r.locked_by) for r in rows} == {("runnable", 1, None)}
    assert all("the worker shut down during step perform (attempt 0)" in r.last_error for r in rows)
    text = (tmp_path / "first.log").read_text()
    # The drain is logged as it begins, with the signal that asked for it.
    assert "stopping (received SIGTERM): no new claims; its buffered rows are released and its running " \
           "steps get up to 1s (DRAIN_TIMEOUT) to finish" in text, text[-3000:]
    # What the queue released and waits for, counted once it stopped taking rows.
    assert f"queue {queue_name}: 0 buffered rows released; waiting up to 1s for 2 steps in flight" in text
    assert "2 steps still running after DRAIN_TIMEOUT" in text
    second = start_worker(queue_name, tmp_path, "second", **conf)
    try:
        wait_until(lambda: set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"},
                   timeout=60, what="the second worker finished both")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(60)
    # Taken at once by a plain claim, not reaped (a reap would have counted attempt 2).
    assert set(Instance.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {1}
    assert sorted(int(f[0]) for f in lines(log, "end")) == sorted(ids)


def test_debug_query_logs_are_reset_after_each_step_and_flush(committed, engine, settings, queue_name, caplog):
    """DEBUG=True: Django appends every query to its connection's log until reset (it
    resets per request). On main the worker's logs only grew: 55 -> 486 MB after 4,000
    jobs with 50 kB results."""
    from gen_durable import telemetry
    from tests.durable_app.supervision_machines import Queries

    settings.DEBUG = True
    seen = {"step.stop": [], "flush.stop": []}

    def handler(event, measurements, metadata):  # runs in the emitting thread
        seen[event].append(len(connection.queries_log))

    telemetry.attach("step.stop", handler)
    telemetry.attach("flush.stop", handler)
    try:
        ids = [gd.insert(Queries, args={"queries": 3}, queue=queue_name) for _ in range(40)]
        with caplog.at_level("WARNING", logger="gen_durable.worker"):
            engine({queue_name: 2}, reaper=False, gc=False)
        wait_until(lambda: not Instance.objects.filter(id__in=ids).exclude(status="done").exists(),
                   timeout=60, what="every job done")
    finally:
        telemetry.detach(handler)
    assert any("DEBUG is on" in r.getMessage() for r in caplog.records)
    assert len(seen["step.stop"]) >= 40 and seen["flush.stop"]
    assert max(seen["step.stop"]) <= 3  # this step's own queries only
    assert max(seen["flush.stop"]) <= 5  # this flush's statements only
