"""Fault-injection fixtures: `rundurable` subprocesses, a Postgres cluster of the test's
own, a PgBouncer in transaction mode, and a loopback TCP proxy that can black-hole
the connections it carries.

Everything listens on 127.0.0.1 on a free port (a multi-host test's cluster also on
its namespaces' bridge: tests/faults/cluster.py) and is stopped at teardown. The
machine's shared Postgres is never restarted nor reconfigured: a test needing server
settings of its own (max_connections, idle_session_timeout) starts its own cluster.
"""

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.faults.cluster import PG_BIN, OwnCluster, as_postgres, free_port, give_to_postgres

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "tests" / "manage.py")]


from tests.helpers import log_lines, tally  # noqa: E402,F401  (the fault tests import them from here)


# --- worker subprocesses -------------------------------------------------------------------

@pytest.fixture
def rundurable(tmp_path):
    """start(*args, db=None, prefix=(), **GEN_DURABLE keys) → a `rundurable` child (killed at teardown).

    `db` is merged over the test database's settings (HOST, PORT, NAME, USER, OPTIONS),
    `other_db` over the "other" alias's:
    the worker then reaches it through a proxy, a pooler or another cluster. Its log
    (verbosity 1) is in `proc.log_path`. `prefix` goes before the command (`ip netns exec
    NAME`: the worker runs on another "host", tests/faults/cluster.py `Hosts`).
    """
    procs = []

    def start(*args, db=None, other_db=None, prefix=(), **gen_durable):
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
                   GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
        env.pop("GEN_DURABLE_TEST_DB_OVERRIDE", None)
        env.pop("GEN_DURABLE_TEST_OTHER_DB_OVERRIDE", None)
        if db:
            env["GEN_DURABLE_TEST_DB_OVERRIDE"] = json.dumps(db)
        if other_db:  # the "other" alias's settings (tests/settings.py), as `db` for "default"
            env["GEN_DURABLE_TEST_OTHER_DB_OVERRIDE"] = json.dumps(other_db)
        if gen_durable:
            env["GEN_DURABLE_TEST_SETTINGS"] = json.dumps(gen_durable)
        path = tmp_path / f"worker-{len(procs)}.log"
        out = open(path, "w")
        proc = subprocess.Popen([*prefix, *MANAGE, "rundurable", *args], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True)
        out.close()
        proc.log_path = path
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def manage(*args, db=None, other_db=None, timeout=120):
    """Run a management command against `db` (merged over the test settings; `other_db`
    over the "other" alias's); return stdout."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
    if db:
        env["GEN_DURABLE_TEST_DB_OVERRIDE"] = json.dumps(db)
    if other_db:
        env["GEN_DURABLE_TEST_OTHER_DB_OVERRIDE"] = json.dumps(other_db)
    done = subprocess.run(MANAGE + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


# --- a cluster of the test's own -------------------------------------------------------------

@pytest.fixture
def own_cluster():
    """An OwnCluster (initdb'd, not started), destroyed at teardown."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no Postgres binaries in {PG_BIN}")
    cluster = OwnCluster()
    yield cluster
    cluster.destroy()


@pytest.fixture
def pg_cluster():
    """start(**postgresql.conf settings) → a running OwnCluster, destroyed at teardown."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no Postgres binaries in {PG_BIN}")
    started = []

    def start(**settings):
        cluster = OwnCluster(synchronous_commit="off", **settings)
        started.append(cluster)
        return cluster.start()

    yield start
    for cluster in started:
        cluster.destroy()


# --- PgBouncer --------------------------------------------------------------------------------

class Bouncer:
    def __init__(self, root, port, proc):
        self.root, self.port, self.proc = root, port, proc

    def connect(self, dbname, **kw):
        return psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}",
                               autocommit=True, prepare_threshold=None, **kw)


@pytest.fixture
def pgbouncer():
    """start(pool_size=1) → a PgBouncer in transaction mode in front of the shared server."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not os.path.exists(binary):
        pytest.skip("needs the Debian package pgbouncer (scripts/test installs it when run as root with apt)")
    started = []

    def start(pool_size=1):
        params = connection.get_connection_params()
        root = Path(tempfile.mkdtemp(prefix="gd-bouncer-"))
        os.chmod(root, 0o755)
        port = free_port()
        (root / "users.txt").write_text('"postgres" ""\n')
        (root / "pgbouncer.ini").write_text(f"""[databases]
* = host={params.get('host', '127.0.0.1')} port={params.get('port', 5432)}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {root}/users.txt
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
max_client_conn = 200
server_check_delay = 0
ignore_startup_parameters = extra_float_digits
logfile = {root}/pgbouncer.log
pidfile = {root}/pgbouncer.pid
""")
        # Reaching a server through its socket directory (the embedded Postgres of
        # scripts/test) takes its owner's rights: run as that user then.
        host = params.get("host", "127.0.0.1")
        user = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "postgres"
        give_to_postgres(root, user)
        proc = subprocess.Popen(as_postgres([binary, str(root / "pgbouncer.ini")], user),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bouncer = Bouncer(root, port, proc)
        started.append(bouncer)
        deadline = time.monotonic() + 15
        while True:
            try:
                with bouncer.connect(connection.settings_dict["NAME"]) as c:
                    c.execute("SELECT 1")
                return bouncer
            except psycopg.OperationalError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log = (root / "pgbouncer.log")
                    raise AssertionError("pgbouncer did not start: " + (log.read_text()[-2000:] if log.exists() else ""))
                time.sleep(0.1)

    yield start
    for bouncer in started:
        bouncer.proc.terminate()
        try:
            bouncer.proc.wait(10)
        except subprocess.TimeoutExpired:
            bouncer.proc.kill()
            bouncer.proc.wait()
        shutil.rmtree(bouncer.root, ignore_errors=True)


# --- a loopback proxy that can black-hole what it carries ------------------------------------

def _connect(target):
    """A socket to the database at (host, port); a host that is a directory is a Unix socket's
    (the embedded Postgres of scripts/test listens on one only)."""
    host, port = target
    if host.startswith("/"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(f"{host}/.s.PGSQL.{port}")
        return s
    return socket.create_connection(target)


class BlackholeProxy:
    """Forwards 127.0.0.1:port to the database. `blackhole()` makes every connection open
    at that moment swallow traffic both ways — sockets stay open, nothing flows, no error
    (a dead NAT entry, a failed-over host) — while new connections work normally;
    `blackhole(new=True)` swallows the new ones too (accepted, never answered: the whole
    network path is down)."""

    def __init__(self, target):
        self.target = target
        self.port = free_port()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._pairs = []  # [client, upstream, {"dead": bool}]
        self._stop = False
        self._swallow_new = False
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if self._swallow_new:
                threading.Thread(target=self._drain, args=(client,), daemon=True).start()
                with self._lock:
                    self._pairs.append((client, client, {"dead": True}))
                continue
            try:
                upstream = _connect(self.target)
            except OSError:
                client.close()
                continue
            state = {"dead": False}
            with self._lock:
                self._pairs.append((client, upstream, state))
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b, state), daemon=True).start()

    @staticmethod
    def _pump(src, dst, state):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not state["dead"]:
                    dst.sendall(data)
        except OSError:
            pass
        if not state["dead"]:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @staticmethod
    def _drain(sock):
        try:
            while sock.recv(65536):
                pass
        except OSError:
            pass

    def blackhole(self, new=False) -> int:
        """Black-hole every open connection (and with `new`, every later one); return how
        many were open."""
        self._swallow_new = self._swallow_new or new
        with self._lock:
            live = [p for p in self._pairs if not p[2]["dead"]]
            for _, _, state in live:
                state["dead"] = True
        return len(live)

    def close(self):
        self._stop = True
        self._server.close()
        with self._lock:
            for client, upstream, _ in self._pairs:
                for s in (client, upstream):
                    try:  # shutdown first: a pump blocked in recv() keeps a merely closed socket open
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    try:
                        s.close()
                    except OSError:
                        pass


@pytest.fixture
def blackhole_proxy():
    params = connection.get_connection_params()
    proxy = BlackholeProxy((params.get("host", "127.0.0.1"), int(params.get("port", 5432))))
    yield proxy
    proxy.close()
