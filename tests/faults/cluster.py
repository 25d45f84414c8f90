"""Postgres clusters of a test's or benchmark's own, and network namespaces as "hosts".

Plain code, no pytest: the fault tests' fixtures (tests/faults/conftest.py: `own_cluster`,
`pg_cluster`), tests/faults/test_multihost.py and bench/multihost.py share it.

`OwnCluster` is initdb + pg_ctl from GEN_DURABLE_PG_BIN (default
/usr/lib/postgresql/15/bin) in a temporary directory, on a free port — never the
machine's shared server, which must not be restarted nor reconfigured. initdb and pg_ctl
refuse to run as root: they run as `postgres` then.

`Hosts` makes n network namespaces on a bridge of the root namespace, so `rundurable`
processes reach one server over a network of their own, each from its own address —
the closest a single machine gets to several hosts (docs/scaling.md).
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("GEN_DURABLE_PG_BIN", "/usr/lib/postgresql/15/bin"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_postgres(cmd, user="postgres"):
    """initdb, pg_ctl and pgbouncer refuse to run as root: run them as `user` then."""
    return ["runuser", "-u", user, "--"] + cmd if os.geteuid() == 0 else cmd


def give_to_postgres(path, user="postgres"):
    if os.geteuid() == 0:
        pw = pwd.getpwnam(user)
        for base, dirs, files in os.walk(path):
            for name in [base] + [os.path.join(base, f) for f in files]:
                os.chown(name, pw.pw_uid, pw.pw_gid)


class OwnCluster:
    """A fresh cluster (initdb'd here, started by `start()`).

    listen: the addresses it listens on (127.0.0.1 always); trust: extra networks
    ("10.1.2.0/24") given trust authentication in pg_hba.conf; settings: postgresql.conf
    values over DEFAULTS (strings are quoted as given: pass "'16MB'").
    """

    # Fast and small: a test's cluster holds no data worth an fsync.
    DEFAULTS = {"fsync": "off", "full_page_writes": "off", "autovacuum": "off", "shared_buffers": "'16MB'",
                "max_connections": 60}

    def __init__(self, listen=(), trust=(), **settings):
        self.root = Path(tempfile.mkdtemp(prefix="gd-own-cluster-"))
        os.chmod(self.root, 0o755)
        self.data, self.port = self.root / "data", free_port()
        give_to_postgres(self.root)
        subprocess.run(as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                                    "--auth=trust", "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
        addresses = ",".join(["127.0.0.1", *listen])
        conf = {"port": self.port, "listen_addresses": f"'{addresses}'",
                "unix_socket_directories": f"'{self.root}'", **self.DEFAULTS, **settings}
        with open(self.data / "postgresql.conf", "a") as f:
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        with open(self.data / "pg_hba.conf", "a") as f:
            for net in trust:
                f.write(f"host all all {net} trust\n")
        give_to_postgres(self.root)

    def pg_ctl(self, *args):
        return subprocess.run(as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l",
                                           str(self.root / "server.log"), "-w", "-t", "60", *args]),
                              capture_output=True, text=True)

    def start(self):
        done = self.pg_ctl("start")
        assert done.returncode == 0, done.stderr + done.stdout + self.log_tail()
        return self

    def stop(self, mode="fast"):
        self.pg_ctl("-m", mode, "stop")

    def restart(self, mode="fast"):
        done = self.pg_ctl("-m", mode, "restart")
        assert done.returncode == 0, done.stderr + done.stdout

    def log_tail(self, chars=2000) -> str:
        log = self.root / "server.log"
        return log.read_text()[-chars:] if log.exists() else ""

    def dsn(self, user="postgres", dbname="postgres", host="127.0.0.1"):
        return f"host={host} port={self.port} user={user} dbname={dbname}"

    def url(self, dbname="postgres", host="127.0.0.1"):
        return f"postgres://postgres@{host}:{self.port}/{dbname}"

    def connect(self, dbname="postgres", user="postgres", **kw):
        return psycopg.connect(self.dsn(user, dbname), autocommit=True, **kw)

    def db_override(self, dbname, host="127.0.0.1"):
        """GEN_DURABLE_TEST_DB_OVERRIDE for a worker subprocess (tests/settings.py)."""
        return {"HOST": host, "PORT": str(self.port), "NAME": dbname, "USER": "postgres", "PASSWORD": ""}

    def destroy(self):
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


# --- network namespaces as hosts ---------------------------------------------------------------

def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespaces_unavailable() -> str | None:
    """Why this machine cannot make network namespaces (None when it can)."""
    if shutil.which("ip") is None:
        return "needs the Debian package iproute2 (scripts/test installs it when run as root with apt)"
    probe = f"gdprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode:
        return f"`ip netns add` fails here (root and CAP_SYS_ADMIN needed): {done.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    done = subprocess.run(["ip", "link", "add", probe, "type", "bridge"], capture_output=True, text=True)
    if done.returncode:
        return f"`ip link add … type bridge` fails here: {done.stderr.strip()}"
    _ip("link", "del", probe, check=False)
    return None


class Hosts:
    """n network namespaces ("hosts") on one bridge in the root namespace.

    The root namespace has `server` (10.213.S.1/24) on the bridge — a server listening
    there is reachable from every host; host i is namespace `names[i]` with
    `addresses[i]` (10.213.S.(10 + i)) on a veth pair and its loopback up. S is a subnet
    no interface of the machine uses yet. `destroy()` removes everything `create()` made
    (also a partial create); end the processes running in the namespaces first.
    """

    def __init__(self, n: int):
        tag = f"gd{os.getpid() % 10**7}"  # interface names are at most 15 characters
        self.n, self.bridge = n, f"{tag}br"
        self.names = [f"{tag}h{i}" for i in range(n)]
        self._veths = [(f"{tag}v{i}", f"{tag}p{i}") for i in range(n)]
        self.subnet = self.server = None
        self.addresses: list[str] = []

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = _ip("-o", "-4", "addr", "show").stdout
        candidates = list(range(1, 255))
        random.shuffle(candidates)
        for s in candidates:
            if f" 10.213.{s}." not in used:
                return ipaddress.ip_network(f"10.213.{s}.0/24")
        raise RuntimeError("no free 10.213.x.0/24 subnet")

    def create(self) -> "Hosts":
        try:
            self.subnet = self._free_subnet()
            base = self.subnet.network_address
            self.server = str(base + 1)
            self.addresses = [str(base + 10 + i) for i in range(self.n)]
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.server}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for name, (outer, inner), address in zip(self.names, self._veths, self.addresses):
                _ip("netns", "add", name)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", outer, "master", self.bridge)
                _ip("link", "set", outer, "up")
                _ip("link", "set", inner, "netns", name)
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", inner)
                _ip("-n", name, "link", "set", inner, "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def exec_prefix(self, i: int) -> list[str]:
        """The argv prefix that runs a command on host i (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.names[i]]

    def destroy(self):
        for name, (outer, _inner) in zip(self.names, self._veths):
            _ip("netns", "del", name, check=False)  # takes its end of the veth pair with it
            _ip("link", "del", outer, check=False)
        _ip("link", "del", self.bridge, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces or links of this object still present (empty after destroy())."""
        netns = _ip("netns", "list", check=False).stdout.split()
        links = _ip("-o", "link", "show", check=False).stdout
        return ([n for n in self.names if n in netns]
                + [dev for dev in [self.bridge] + [o for o, _ in self._veths] if f" {dev}:" in links
                   or f" {dev}@" in links])
