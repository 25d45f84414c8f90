"""Connection exhaustion and a heartbeat that cannot reach the database
(docs/reliability.md, "Connections").

The exhaustion test starts a Postgres cluster of its own with max_connections = 20 (the
machine's shared server is never filled); the worker and the "web load" connect as an
ordinary role, so the superuser-reserved slots stay free for the test's own checks.
"""

import logging
import time

import psycopg
import pytest
from django.db import OperationalError

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker import supervisor as supervisor_module
from tests.conftest import wait_until
from tests.durable_app.durable import Recorder
from tests.faults.conftest import log_lines, manage, tally
from tests.races.test_faults import statuses


def insert_jobs(conn, n, log, queue):
    """Raw inserts of DbMachine rows (the worker polls; no NOTIFY needed). Their default
    handle() stops on any exception: only a retry of the refused connection saves them."""
    rows = conn.execute(
        "INSERT INTO gen_durable (fsm, step, state, queue) "
        "SELECT 'tests.faults.DbMachine', 'start', jsonb_build_object('log', %s::text, 'mode', 'query', 'sleep', 0.2), %s "
        "FROM generate_series(1, %s) RETURNING id", [str(log), queue, n]).fetchall()
    return [r[0] for r in rows]


def counts(conn, queue):
    return dict(conn.execute("SELECT status::text, count(*) FROM gen_durable WHERE queue = %s GROUP BY 1",
                             [queue]).fetchall())


@pytest.mark.slow
def test_exhausted_connections_fail_no_step_and_the_worker_recovers_by_itself(pg_cluster, rundurable, tmp_path):
    cluster = pg_cluster(max_connections=20, superuser_reserved_connections=3)
    with cluster.connect() as admin:
        admin.execute("CREATE ROLE app LOGIN")
        admin.execute("CREATE DATABASE gd OWNER app")
    db = {"HOST": "127.0.0.1", "PORT": cluster.port, "NAME": "gd", "USER": "app", "OPTIONS": {}}
    manage("migrate", "--no-input", "-v", "0", db=db)
    log, queue = tmp_path / "steps.log", "exhausted"
    proc = rundurable("--queue", f"{queue}=4", "--no-gc", db=db, LEASE_TTL=6, HEARTBEAT_INTERVAL=1)
    admin = cluster.connect(dbname="gd")  # superuser: a reserved slot, whatever the load
    load = []
    try:
        warm = insert_jobs(admin, 1, log, queue)
        wait_until(lambda: counts(admin, queue) == {"done": 1}, timeout=60, what="the first job done")
        # The web load takes every remaining ordinary slot and holds it.
        while len(load) < 40:
            try:
                load.append(psycopg.connect(cluster.dsn("app", "gd"), autocommit=True))
            except psycopg.OperationalError as exc:
                assert "too many clients" in str(exc) or "remaining connection slots" in str(exc), exc
                break
        assert load, "the worker left slots free"
        ids = insert_jobs(admin, 12, log, queue)
        # Steps that need a new connection are refused: retried with back-off, never failed,
        # while the roles keep their own connections and commit those retries.
        wait_until(lambda: admin.execute("SELECT count(*) FROM gen_durable WHERE id = ANY(%s) AND attempt > 0",
                                         [ids]).fetchone()[0] > 0, timeout=30, what="refused steps retried")
        time.sleep(2)
        failed = admin.execute("SELECT last_error FROM gen_durable WHERE status = 'failed' LIMIT 3").fetchall()
        assert counts(admin, queue).get("failed", 0) == 0, failed
    finally:
        for c in load:
            c.close()
    wait_until(lambda: counts(admin, queue) == {"done": 13}, timeout=60, what="every job done after the load")
    assert proc.poll() is None
    assert tally(log, "end") == {i: 1 for i in warm + ids}, "each body completed once"
    lease_lost = admin.execute("SELECT count(*) FROM gen_durable WHERE last_error LIKE '%%lease%%'").fetchone()[0]
    assert lease_lost == 0, "the heartbeat kept every lease"
    out = proc.log_path.read_text()
    assert "lost its database connection" in out, out[-3000:]
    admin.close()


def test_a_heartbeat_failing_for_a_lease_stops_new_steps_and_says_so(
        committed, engine, settings, monkeypatch, queue_name, tmp_path, caplog):
    """The heartbeat cannot reach the database for longer than a lease: the rows this
    worker holds may have been reaped and claimed elsewhere, so it starts nothing new
    (and logs why) until a heartbeat succeeds again; then it carries on by itself."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "LEASE_TTL": 1.5, "HEARTBEAT_INTERVAL": 0.25, "REAPER": False}
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()
    real, broken = supervisor_module.Supervisor._heartbeat, {"on": False}

    def heartbeat(self):  # the database is unreachable for the heartbeat's connection only
        if broken["on"]:
            raise OperationalError("connection to server failed: Connection refused")
        return real(self)

    monkeypatch.setattr(supervisor_module.Supervisor, "_heartbeat", heartbeat)
    caplog.set_level(logging.WARNING, logger="gen_durable")
    engine({queue_name: 2})
    first = gd.insert(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 30}, queue=queue_name)
    wait_until(lambda: tally(log, "start") == {first: 1}, what="the first step running")
    broken["on"] = True
    wait_until(lambda: "the heartbeat has failed for a whole lease" in caplog.text, timeout=10,
               what="the worker to say it stops new steps")
    rest = gd.insert_all([gd.Spec(Recorder, state={"log": str(log)}, queue=queue_name) for _ in range(3)])
    hold.unlink()  # the running step ends and commits; a step thread is free
    wait_until(lambda: statuses(queue_name) == {"done": 1, "runnable": 3}, what="the first step committed")
    time.sleep(0.5)
    assert statuses(queue_name) == {"done": 1, "runnable": 3}, "nothing new was claimed"
    assert list(tally(log, "start")) == [first], "no new step started"
    broken["on"] = False
    wait_until(lambda: statuses(queue_name) == {"done": 4}, timeout=20, what="steps to resume")
    assert tally(log, "start") == {i: 1 for i in [first] + rest}
    assert "steps resume" in caplog.text
    assert set(Instance.objects.filter(id__in=[first] + rest).values_list("attempt", flat=True)) == {0}
