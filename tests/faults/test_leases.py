"""Leases and heartbeats (docs/reliability.md "Leases"): the heartbeat derived from the
lease keeps a long step's claim; a pair that cannot is refused at start-up."""

import subprocess
import sys
from pathlib import Path

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.supervision_machines import Sleeper

ROOT = Path(__file__).resolve().parents[2]


def test_a_step_longer_than_its_lease_runs_once_with_the_heartbeat_unset(
        committed, engine, settings, queue_name, tmp_path):
    """LEASE_TTL 1 s, HEARTBEAT_INTERVAL unset: renewals every 1/3 s keep a 3 s step's
    claim. With main's fixed 20 s default the reaper took it after 1 s and a second
    worker ran it again beside the first."""
    conf = {k: v for k, v in settings.GEN_DURABLE.items() if k != "HEARTBEAT_INTERVAL"}
    settings.GEN_DURABLE = {**conf, "LEASE_TTL": 1, "REAPER": {"INTERVAL": 0.2}}
    log = tmp_path / "runs.log"
    rid = gd.insert(Sleeper, args={"log": str(log), "sleep": 3}, queue=queue_name)
    engine({queue_name: 1})
    engine({queue_name: 1}, reaper=False, gc=False)  # a second worker that would take a reaped row
    wait_until(lambda: Instance.objects.get(id=rid).status == "done", timeout=30, what="the long step done")
    starts = [line.split() for line in log.read_text().splitlines() if line.split()[3] == "start"]
    assert len(starts) == 1, starts
    assert Instance.objects.get(id=rid).attempt == 0


def test_rundurable_refuses_a_heartbeat_that_cannot_keep_its_lease(committed, tmp_path):
    from tests.integration.test_rundurable import child_env

    done = subprocess.run([sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable", "--burst"],
                          cwd=ROOT, env=child_env(LEASE_TTL=5, HEARTBEAT_INTERVAL=20),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "gen_durable.E030" in done.stderr and "cannot keep a 5s lease alive" in done.stderr


def test_a_renewal_counts_from_when_it_was_sent_not_from_when_it_returned(transactional_db, monkeypatch):
    """The worker stops starting steps once `last_ok` is a lease old (`Supervisor.leases_held`).
    The server extends a lease from its clock when the heartbeat's statement runs, so
    `last_ok` must be the clock reading taken before the successful call, not one taken
    after it returns (a slow renewal gave the worker that much longer than the reaper
    gives its rows). The role's clock is a tick counter here: it orders the readings
    against the call without measuring any time."""
    from django.db import connection

    from gen_durable.worker import maintenance

    class Ticks:
        """time.monotonic() that advances one tick per reading."""

        def __init__(self):
            self.now = 0

        def monotonic(self):
            self.now += 1
            return self.now

    ticks = Ticks()
    monkeypatch.setattr(maintenance, "time", ticks)
    seen = []  # the role's clock as each renewal starts: its last reading so far
    role = None

    def renewal():
        seen.append(ticks.now)
        with connection.cursor() as cur:  # a real round trip
            cur.execute("SELECT 1")
        if len(seen) == 2:
            role._stop.set()  # the loop ends after this call: nothing here waits on a timer

    role = maintenance.Periodic("heartbeat", 0, renewal)
    role.start()._thread.join(30)
    assert not role._thread.is_alive() and len(seen) == 2
    assert role.last_ok == seen[-1]  # the reading before the last call, not one after it
