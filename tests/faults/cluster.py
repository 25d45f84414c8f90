"""A Postgres cluster of the test's own (initdb + pg_ctl from GEN_DURABLE_PG_BIN, default
/usr/lib/postgresql/15/bin) on a free loopback port, for tests that stop or restart the
server — never the machine's shared one. initdb and pg_ctl refuse to run as root: they
run as `postgres` then."""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

PG_BIN = Path(os.environ.get("GEN_DURABLE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(cmd):
    return ["runuser", "-u", "postgres", "--"] + cmd if os.geteuid() == 0 else cmd


class OwnCluster:
    def __init__(self):
        self.root = Path(tempfile.mkdtemp(prefix="gd-own-cluster-"))
        os.chmod(self.root, 0o755)
        self.data, self.port = self.root / "data", free_port()
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                                     "--auth=trust", "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
        with open(self.data / "postgresql.conf", "a") as f:
            f.write(f"port = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{self.root}'\n"
                    "fsync = off\nfull_page_writes = off\nautovacuum = off\nshared_buffers = '16MB'\n"
                    "max_connections = 60\n")
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for base, dirs, files in os.walk(self.root):
                for name in [base] + [os.path.join(base, f) for f in files]:
                    os.chown(name, pw.pw_uid, pw.pw_gid)

    def pg_ctl(self, *args):
        return subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l",
                                            str(self.root / "server.log"), "-w", "-t", "60", *args]),
                              capture_output=True, text=True)

    def start(self):
        done = self.pg_ctl("start")
        assert done.returncode == 0, done.stderr + done.stdout
        return self

    def stop(self, mode="fast"):
        self.pg_ctl("-m", mode, "stop")

    def restart(self, mode="fast"):
        done = self.pg_ctl("-m", mode, "restart")
        assert done.returncode == 0, done.stderr + done.stdout

    def connect(self, dbname="postgres"):
        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, autocommit=True)

    def db_override(self, dbname):
        """GEN_DURABLE_TEST_DB_OVERRIDE for a worker subprocess (tests/settings.py)."""
        return {"HOST": "127.0.0.1", "PORT": str(self.port), "NAME": dbname, "USER": "postgres", "PASSWORD": ""}

    def destroy(self):
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def own_cluster():
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no Postgres binaries in {PG_BIN}")
    cluster = OwnCluster()
    yield cluster
    cluster.destroy()
