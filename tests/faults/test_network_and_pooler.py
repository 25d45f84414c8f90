"""Connections cut, closed, refused or pooled, as an operator meets them (docs/reliability.md).

Each test runs `rundurable` as a subprocess against this test's database — directly,
through a loopback proxy that black-holes traffic, or through a real PgBouncer in
transaction mode — and counts every step run in the Recorder's log file.
"""

import os
import signal
import subprocess
import time

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.durable import Recorder
from tests.faults.conftest import MANAGE, ROOT, tally
from tests.races.test_faults import statuses

FAST = {"STATEMENT_TIMEOUT": 2, "LOCK_TIMEOUT": 1}


def direct_db(**extra):
    """The test database's settings for a subprocess, prepared statements off (a pooler's
    worker must not use them; the others do not need them here). Connection options of the
    test database (an embedded server's socket directory) are kept; extra OPTIONS merge in."""
    options = {k: v for k, v in connection.settings_dict["OPTIONS"].items()
               if k not in ("server_side_binding", "prepare_threshold")}
    options.update(extra.pop("OPTIONS", {}))
    return {"OPTIONS": options, **extra}


def recorded(queue, log, n, **state):
    return gd.insert_all([gd.Spec(Recorder, state={"log": str(log), **state}, queue=queue) for _ in range(n)])


def test_a_worker_that_cannot_fit_max_connections_is_refused_naming_the_numbers(transactional_db, queue_name):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
    proc = subprocess.Popen(MANAGE + ["rundurable", "--queue", f"{queue_name}=40", "--processes", "3"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # it started after all: stop it and its children
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int")
        usable = cur.fetchone()[0]
    assert proc.returncode != 0
    # 3 × (40 step threads + async steps + 1 feeder + flusher + heartbeat + timer + reaper
    # + listener + main) + GC
    assert "needs up to 148 database connections" in stderr, stderr[-2000:]
    assert f"the server allows {usable}" in stderr


@pytest.mark.slow
def test_idle_session_timeout_closes_every_idle_connection_and_nothing_is_lost(
        committed, rundurable, queue_name, tmp_path):
    """The server closes each of the worker's connections after 1 s idle (its own startup
    option, so no other session of the shared server is touched)."""
    log = tmp_path / "steps.log"
    db = direct_db(OPTIONS={"options": "-c idle_session_timeout=1000"})
    proc = rundurable("--queue", f"{queue_name}=2", "--no-reaper", "--no-gc", db=db, LEASE_TTL=30,
                      HEARTBEAT_INTERVAL=5, NOTIFY="none")
    warm = recorded(queue_name, log, 1)
    wait_until(lambda: statuses(queue_name) == {"done": 1}, timeout=60, what="the first instance done")
    time.sleep(2.5)  # every connection of the worker has been idle past the timeout
    ids = recorded(queue_name, log, 5)
    # No reaper runs (--no-reaper): an outcome a closed connection lost would leave its row
    # executing for good, so every row done, each body once, attempt 0 is the proof.
    wait_until(lambda: statuses(queue_name) == {"done": 6}, timeout=20, what="all done")
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    assert tally(log, "start") == {i: 1 for i in warm + ids}
    assert set(Instance.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {0}


@pytest.mark.slow
def test_black_holed_connections_are_noticed_replaced_and_logged(committed, rundurable, blackhole_proxy,
                                                                 queue_name, tmp_path):
    """Every connection of the worker goes silent (sockets open, nothing flows); new
    connections work. Within STATEMENT_TIMEOUT + 2 s each engine connection in use is cut,
    logged and replaced, and the new jobs finish."""
    log = tmp_path / "steps.log"
    db = direct_db(HOST="127.0.0.1", PORT=blackhole_proxy.port)
    proc = rundurable("--queue", f"{queue_name}=2", db=db, LEASE_TTL=20, HEARTBEAT_INTERVAL=1, **FAST)
    warm = recorded(queue_name, log, 1)
    wait_until(lambda: statuses(queue_name) == {"done": 1}, timeout=60, what="the first instance done")
    assert blackhole_proxy.blackhole() >= 3
    ids = recorded(queue_name, log, 10)
    wait_until(lambda: statuses(queue_name) == {"done": 11}, timeout=30, what="the ten new jobs done")
    assert proc.poll() is None
    assert tally(log, "start") == {i: 1 for i in warm + ids}
    out = proc.log_path.read_text()
    assert "no answer from the database for 4.0s" in out, out[-3000:]


@pytest.mark.slow
def test_behind_pgbouncer_in_transaction_mode_nothing_leaks_and_nothing_fails(
        committed, rundurable, pgbouncer, queue_name, tmp_path):
    """POOLER = "transaction": one server connection carries every client's transactions.

    No engine setting may outlive its transaction (the claim's synchronous_commit = off,
    the timeouts), the worker polls instead of LISTEN, and a server connection killed
    under the pooler makes the worker retry, never fail a step."""
    bouncer = pgbouncer(pool_size=1)
    log = tmp_path / "steps.log"
    db = direct_db(HOST="127.0.0.1", PORT=bouncer.port)
    proc = rundurable("--queue", f"{queue_name}=3", db=db, POOLER="transaction", **FAST)
    ids = recorded(queue_name, log, 5, sleep=0.05)
    # Struck once the first five are done and nothing executes: a strike during a flush's
    # COMMIT would leave that flush in doubt, settled only when its lease lapses (a
    # re-run, by design), which is not what this test is about.
    wait_until(lambda: statuses(queue_name) == {"done": 5}, timeout=60, what="five done")
    with connection.cursor() as cur:  # the pooler's one server connection, between steps
        cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    ids += recorded(queue_name, log, 15, sleep=0.05)
    try:
        wait_until(lambda: statuses(queue_name) == {"done": 20}, timeout=60, what="all twenty done")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; worker log: {proc.log_path.read_text()[-3000:]}") from None
    assert proc.poll() is None, proc.log_path.read_text()[-3000:]
    assert tally(log, "end") == {i: 1 for i in ids}
    with connection.cursor() as cur:  # (this process's own await_result listener aside)
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND query ILIKE 'LISTEN%%' AND application_name NOT LIKE 'gen_durable listener gen_durable_result%%'")
        assert cur.fetchone()[0] == 0, "no LISTEN through a transaction pooler"
    with bouncer.connect(connection.settings_dict["NAME"]) as c:  # the same server connection
        shown = {name: c.execute(f"SHOW {name}").fetchone()[0]
                 for name in ("synchronous_commit", "lock_timeout", "statement_timeout")}
    assert shown == {"synchronous_commit": "on", "lock_timeout": "0", "statement_timeout": "0"}
