"""SIGTERM while every connection is black-holed (docs/reliability.md "Shutdown"): the
process exits within DRAIN_TIMEOUT + SHUTDOWN_GRACE whatever the network does."""

import signal
import subprocess
import threading

import psycopg
import pytest
from django.db import connection

import gen_durable as gd
from gen_durable import db, sql
from gen_durable.models import Worker
from gen_durable.worker.supervisor import SHUTDOWN_GRACE
from tests.conftest import wait_until
from tests.durable_app.supervision_machines import Sleeper
from tests.faults.test_network_and_pooler import direct_db
from tests.faults.test_shutdown import lines

DRAIN = 1


@pytest.mark.slow
def test_sigterm_exits_in_bounded_time_when_every_connection_is_black_holed(
        committed, rundurable, blackhole_proxy, queue_name, tmp_path):
    """Defaults (STATEMENT_TIMEOUT 30 s) but DRAIN_TIMEOUT 1 s; a 60 s step running. On
    main the process hung in the registry's unregister on the main thread's unwatched
    connection (OS keepalive: two hours): not exited 90-100 s after SIGTERM."""
    log = tmp_path / "runs.log"
    gd.insert(Sleeper, args={"log": str(log), "sleep": 60, "once": True}, queue=queue_name)
    proc = rundurable("--queue", f"{queue_name}=2", db=direct_db(HOST="127.0.0.1", PORT=blackhole_proxy.port),
                      LEASE_TTL=30, HEARTBEAT_INTERVAL=3, DRAIN_TIMEOUT=DRAIN)
    wait_until(lambda: len(lines(log, "start")) == 1, timeout=60, what="the step running")
    wait_until(lambda: Worker.objects.filter(pid=proc.pid).exists(), timeout=10, what="the worker registered")
    assert blackhole_proxy.blackhole(new=True) >= 4  # main, feeder, flusher, heartbeat at least
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(DRAIN + SHUTDOWN_GRACE + 5)  # the acceptance bound: DRAIN_TIMEOUT + 15 s
    except subprocess.TimeoutExpired:
        raise AssertionError("not exited: " + proc.log_path.read_text()[-3000:]) from None
    out = proc.log_path.read_text()
    assert code == 1, out[-3000:]  # the shutdown could not finish its statements
    assert "shutdown not finished within DRAIN_TIMEOUT + 10s" in out, out[-3000:]
    # The registry row it could not remove is harmless: not live once its heartbeat
    # stops, pruned by the next worker that registers after 10 x LEASE_TTL.
    [left] = Worker.objects.filter(pid=proc.pid).values_list("id", flat=True)
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable_workers SET last_seen = now() - interval '301 seconds' WHERE id = %s", [left])
    next_id = f"next-{queue_name}"
    try:
        db.fetchone(sql.WORKER_REGISTER, {"id": next_id, "host": "h", "pid": 1, "queues": [queue_name], "stale": 300})
        assert not Worker.objects.filter(id=left).exists()
    finally:
        Worker.objects.filter(id=next_id).delete()
    blackhole_proxy.close()  # the server's ends of the swallowed connections go
    # This worker's sessions only (its roles are named "gen_durable <role> <pid>-<token>"):
    # other tests' workers may still be leaving the shared server.
    wait_until(lambda: not sessions(f"gen_durable % {proc.pid}-%"), timeout=30, what="the worker's sessions gone")


def sessions(application_name):
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE %s", [application_name])
        return cur.fetchone()[0]


@pytest.mark.slow
def test_negative_control_the_black_hole_answers_nothing(blackhole_proxy, transactional_db):
    """Without the bounds a statement on such a connection waits for good: an open
    connection's SELECT gets no answer, a new connection no greeting."""
    params = connection.get_connection_params()
    conn = psycopg.connect(host="127.0.0.1", port=blackhole_proxy.port, dbname=params["dbname"],
                           user=params.get("user", "postgres"), autocommit=True, application_name="gd-blackhole-control")
    conn.execute("SELECT 1")
    blackhole_proxy.blackhole(new=True)
    answered = threading.Event()

    def query():
        try:
            conn.execute("SELECT 1")
            answered.set()
        except psycopg.Error:
            pass

    t = threading.Thread(target=query, daemon=True)
    t.start()
    t.join(3)
    assert t.is_alive() and not answered.is_set()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(host="127.0.0.1", port=blackhole_proxy.port, dbname=params["dbname"],
                        user=params.get("user", "postgres"), connect_timeout=2)
    blackhole_proxy.close()  # frees the thread's socket
    wait_until(lambda: not sessions("gd-blackhole-control"), timeout=10, what="the control's session gone")
