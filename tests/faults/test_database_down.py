"""The database going away (docs/reliability.md "Database down"), on a cluster the test
starts itself: a worker started while it is down waits and starts when it comes up."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "tests" / "manage.py")]
DBNAME = "gd_faults"


def env_for(cluster, **gen_durable):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_OVERRIDE=json.dumps(cluster.db_override(DBNAME)))
    env.pop("GEN_DURABLE_TEST_DB_NAME", None)
    if gen_durable:
        env["GEN_DURABLE_TEST_SETTINGS"] = json.dumps(gen_durable)
    return env


def prepare(cluster):
    """Create and migrate the cluster's database."""
    with cluster.connect() as c:
        c.execute(f"CREATE DATABASE {DBNAME}")
    done = subprocess.run(MANAGE + ["migrate", "-v", "0"], cwd=ROOT, env=env_for(cluster),
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]


def insert_jobs(cluster, queue, n, args):
    with cluster.connect(DBNAME) as c:
        return [c.execute("INSERT INTO gen_durable (fsm, step, state, queue) VALUES (%s, 'perform', %s, %s) "
                          "RETURNING id", ["tests.faults.Sleeper", json.dumps(args), queue]).fetchone()[0]
                for _ in range(n)]


def statuses(cluster, ids):
    with cluster.connect(DBNAME) as c:
        return dict(c.execute("SELECT id, status::text FROM gen_durable WHERE id = ANY(%s)", [ids]).fetchall())


@pytest.mark.slow
def test_a_worker_started_while_the_database_is_down_waits_and_starts_when_it_comes_up(own_cluster, tmp_path):
    """On main rundurable exited 1 with an 85-line traceback."""
    own_cluster.start()
    prepare(own_cluster)
    own_cluster.stop()
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--queue", "boot=1", "--verbosity", "1"], cwd=ROOT,
                                env=env_for(own_cluster), stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: log.read_text().count("unavailable (attempt") >= 3 or proc.poll() is not None,
                   timeout=60, what="three connection attempts")
        assert proc.poll() is None, log.read_text()[-3000:]
        own_cluster.start()
        ids = insert_jobs(own_cluster, "boot", 1, {"log": str(tmp_path / "runs.log"), "sleep": 0})
        wait_until(lambda: statuses(own_cluster, ids) == {ids[0]: "done"}, timeout=90, what="the job done")
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "Traceback" not in text
    attempts = [line for line in text.splitlines() if "unavailable (attempt" in line]
    assert len(attempts) >= 3 and "database 'default' unavailable (attempt 1: " in attempts[0]
    assert "is up after" in text


def insert_three_steps(cluster, queue, n, log):
    with cluster.connect(DBNAME) as c:
        return [c.execute("INSERT INTO gen_durable (fsm, step, state, queue) VALUES (%s, 'start', %s, %s) "
                          "RETURNING id", ["tests.faults.ThreeSteps", json.dumps({"log": str(log), "sleep": 0.05}),
                                           queue]).fetchone()[0]
                for _ in range(n)]


def by_status(cluster, queue):
    with cluster.connect(DBNAME) as c:
        return dict(c.execute("SELECT status::text, count(*) FROM gen_durable WHERE queue = %s GROUP BY 1",
                              [queue]).fetchall())


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgres_restarted_mid_drain_loses_nothing(own_cluster, tmp_path, mode):
    """`pg_ctl restart -m fast` (sessions terminated) and `-m immediate` (a crash and
    recovery) while two worker processes drain a 3-step machine: every instance ends
    done, nothing is left runnable or executing, the host keeps running."""
    from tests.faults import runs as side

    own_cluster.start()
    prepare(own_cluster)
    log, out = tmp_path / "runs.log", tmp_path / "host.log"
    ids = insert_three_steps(own_cluster, "drain", 120, log)
    with open(out, "w") as f:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--processes", "2", "--queue", "drain=4", "--verbosity", "1"],
                                cwd=ROOT, env=env_for(own_cluster), stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: len(side.read(log)) > 60, timeout=60, what="the drain under way")
        own_cluster.restart(mode)
        wait_until(lambda: by_status(own_cluster, "drain").get("done", 0) == len(ids), timeout=120,
                   what=f"every instance done after the {mode} restart")
        assert by_status(own_cluster, "drain") == {"done": len(ids)}
        assert proc.poll() is None, out.read_text()[-3000:]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    by_step = side.runs(log, {})
    assert set(by_step) == {(i, s) for i in ids for s in ("start", "second", "third")}
    # A step may run again only if its outcome was not committed when the server went
    # away (at most once per restart here); never two runs of one step at once.
    assert max(len(v) for v in by_step.values()) <= 2
    for done in by_step.values():
        assert not side.overlaps([(s, e, p) for p, s, e in done if e is not None])


@pytest.mark.slow
def test_an_outage_logs_one_line_per_role_then_one_when_it_succeeds_again(own_cluster, tmp_path):
    """Picks failing every 0.2 s for several seconds do not flood the log: one line at the
    first failure (then one a minute), one when the pick works again. Likewise the
    heartbeat, the reaper and the listener, which retry on their own back-off."""
    own_cluster.start()
    prepare(own_cluster)
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--queue", "calm=1", "--verbosity", "1"], cwd=ROOT,
                                env=env_for(own_cluster, POLL_INTERVAL=0.05, MAX_POLL_INTERVAL=0.2, LEASE_TTL=2,
                                            HEARTBEAT_INTERVAL=0.5, REAPER={"INTERVAL": 0.5}),
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        first = insert_jobs(own_cluster, "calm", 1, {"log": str(tmp_path / "runs.log"), "sleep": 0})
        wait_until(lambda: statuses(own_cluster, first) == {first[0]: "done"} or proc.poll() is not None,
                   timeout=60, what="a job before the outage")
        own_cluster.stop("fast")
        time.sleep(4)  # about 20 failed picks at MAX_POLL_INTERVAL
        own_cluster.start()
        wait_until(lambda: all(f"{role} succeeds again" in log.read_text() for role in (
                   "pick on queue calm", "heartbeat", "reaper", "listener connection")), timeout=60,
                   what="the recovery lines")
        ids = insert_jobs(own_cluster, "calm", 1, {"log": str(tmp_path / "runs.log"), "sleep": 0})
        wait_until(lambda: statuses(own_cluster, ids) == {ids[0]: "done"}, timeout=60, what="a job after the outage")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    failed = [line for line in text.splitlines() if "pick on queue calm failed" in line]
    assert len(failed) == 1 and "(1 in a row)" in failed[0], text[-3000:]
    (again,) = [line for line in text.splitlines() if "pick on queue calm succeeds again" in line]
    assert int(again.rsplit("after ", 1)[1].split()[0]) >= 5, again  # the failures were counted, not logged
    # The outage outlasts the 2 s lease: picks pause, asking nothing, until the heartbeat
    # is back; that pause is no recovery (it was logged as one, mid-outage).
    lines = text.splitlines()
    assert lines.index(again) > next(i for i, x in enumerate(lines) if "the heartbeat succeeds again" in x)
    for role, line in (("heartbeat", "heartbeat failed"), ("reaper", "reaper failed"),
                       ("listener connection", "listener connection lost")):
        failed = [x for x in text.splitlines() if line in x]
        assert len(failed) == 1 and "(1 in a row)" in failed[0], (role, failed)
        (again,) = [x for x in text.splitlines() if f"{role} succeeds again after" in x]
        assert int(again.rsplit("after ", 1)[1].split()[0]) >= 2, again


# --- several databases, one of them down -------------------------------------------------------

def env_for_two(default, other):
    """A worker's environment: alias "default" on cluster `default`, "other" on `other`."""
    env = env_for(default)
    env["GEN_DURABLE_TEST_OTHER_DB_OVERRIDE"] = json.dumps(other.db_override(DBNAME))
    env.pop("GEN_DURABLE_TEST_OTHER_DB_NAME", None)
    return env


@pytest.fixture
def second_cluster(own_cluster):
    """A second OwnCluster (initdb'd, not started), destroyed at teardown."""
    from tests.faults.cluster import OwnCluster

    cluster = OwnCluster()
    yield cluster
    cluster.destroy()


def prepare_two(default, other, *, migrate_other=True):
    """Both clusters' databases created; "default" migrated, "other" too unless told not."""
    default.start()
    prepare(default)
    other.start()
    with other.connect() as c:
        c.execute(f"CREATE DATABASE {DBNAME}")
    if migrate_other:
        done = subprocess.run(MANAGE + ["migrate", "--database", "other", "-v", "0"], cwd=ROOT,
                              env=env_for_two(default, other), capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]
    other.stop()


@pytest.mark.slow
@pytest.mark.parametrize("processes", [1, 2])
def test_one_database_down_at_start_up_does_not_hold_up_the_others(own_cluster, second_cluster, tmp_path,
                                                                   processes):
    """`rundurable --database default --database other` with "other" down: the worker of
    "default" starts and runs its rows at once; "other"'s waits in the background and
    serves its rows once it is up. (Before, start-up waited for every database: no row
    of "default" ran while "other" was down.)"""
    prepare_two(own_cluster, second_cluster)
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--database", "default", "--database", "other",
                                          "--processes", str(processes), "--queue", "boot=1", "--verbosity", "1"],
                                cwd=ROOT, env=env_for_two(own_cluster, second_cluster), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
    try:
        first = insert_jobs(own_cluster, "boot", 2, {"log": str(tmp_path / "runs.log"), "sleep": 0})
        wait_until(lambda: statuses(own_cluster, first) == dict.fromkeys(first, "done") or proc.poll() is not None,
                   timeout=90, what="the rows of 'default' done while 'other' is down")
        assert proc.poll() is None, log.read_text()[-3000:]
        assert "database 'other' unavailable (attempt" in log.read_text()
        second_cluster.start()
        later = insert_jobs(second_cluster, "boot", 2, {"log": str(tmp_path / "runs.log"), "sleep": 0})
        wait_until(lambda: statuses(second_cluster, later) == dict.fromkeys(later, "done") or proc.poll() is not None,
                   timeout=120, what="the rows of 'other' done once it is up")
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "starting the workers of 'default'; 'other' is down: its worker starts once it is up" in text
    started = re.findall(r"database 'other' is up after \d+ attempts: starting its worker", text)
    assert len(started) == processes, text[-3000:]  # in each process


@pytest.mark.slow
def test_a_database_that_comes_up_unmigrated_stops_the_worker_with_the_fix(own_cluster, second_cluster, tmp_path):
    """The migration check a database down at start-up missed runs once it is up: without
    gen_durable's tables there, the worker stops, exit code 1, naming the database and
    `migrate` (rather than failing every pick on it for ever)."""
    prepare_two(own_cluster, second_cluster, migrate_other=False)
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--database", "default", "--database", "other",
                                          "--queue", "boot=1", "--verbosity", "1"],
                                cwd=ROOT, env=env_for_two(own_cluster, second_cluster), stdout=out,
                                stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: "database 'other' unavailable (attempt" in log.read_text() or proc.poll() is not None,
                   timeout=60, what="the wait for 'other'")
        assert proc.poll() is None, log.read_text()[-3000:]
        second_cluster.start()
        assert proc.wait(90) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert ("database 'other' cannot be served: gen_durable's migrations are not applied on database 'other'"
            in text), text[-3000:]
    assert "run `python manage.py migrate` first" in text


@pytest.mark.parametrize("max_wait", [2, None], ids=["max-wait", "control-waits-on"])
def test_a_burst_with_max_wait_gives_up_on_a_database_that_never_comes_up(tmp_path, max_wait):
    """Every database down at start-up: `--burst --max-wait` bounds that first wait too
    and exits 3, nothing run (it waited for ever). Control: without --max-wait a burst
    waits for the database, as a worker does."""
    from tests.faults.cluster import free_port

    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", GEN_DURABLE_TEST_DB_OVERRIDE=json.dumps(
        {"HOST": "127.0.0.1", "PORT": str(free_port()), "NAME": DBNAME, "USER": "postgres", "PASSWORD": ""}))
    args = ["rundurable", "--burst", "--queue", "boot=1"] + (["--max-wait", str(max_wait)] if max_wait else [])
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(MANAGE + args, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        if max_wait:
            assert proc.wait(timeout=60) == 3, log.read_text()[-3000:]
            text = log.read_text()
            assert "burst mode: database 'default' is still down after --max-wait 2 s; nothing was run" in text
            assert "Traceback" not in text and text.count("unavailable (attempt") >= 2
        else:
            wait_until(lambda: log.read_text().count("unavailable (attempt") >= 4, timeout=60,
                       what="four connection attempts")  # 0.5 + 1 + 2 s of back-off: past the 2 s above
            assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
