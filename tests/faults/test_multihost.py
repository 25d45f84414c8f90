"""Several hosts, one database (docs/scaling.md): `rundurable` on three "hosts" —
network namespaces of this machine, each reaching a cluster of the test's own over a
bridge from its own address (tests/faults/cluster.py `Hosts`, `OwnCluster`) — drains a
few thousand jobs. Nothing is lost, every instance runs exactly once, no two runs of one
instance overlap in time, and every host does some of the work.

The proof of "never twice at once" is a side table the step writes (gd_test_steplog:
one row per run, stamped with the server's clock when it starts and ends, and the
client address it came from); OVERLAPS finds two runs of one instance whose windows
intersect. The negative control shows it does find injected overlaps.

Skipped (with the reason) where network namespaces cannot be made: not root, no
CAP_SYS_ADMIN, or no iproute2 (.ci/run installs the Debian package).
"""

import signal
import subprocess

import pytest
from django.db import connection

from tests.conftest import wait_until
from tests.faults.cluster import PG_BIN, Hosts, OwnCluster, namespaces_unavailable
from tests.faults.conftest import manage

pytestmark = pytest.mark.slow

DBNAME = "gd_multihost"
HOSTS = 3
JOBS = 3000

STEPLOG = """CREATE {temp} TABLE gd_test_steplog (
    run bigserial PRIMARY KEY, id bigint NOT NULL, host inet, pid int NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz)"""

# Two runs of one instance whose [start, end] windows intersect; a run with no end yet
# (still running, or its worker died) is open-ended.
OVERLAPS = """
SELECT a.id, a.run, b.run FROM gd_test_steplog a JOIN gd_test_steplog b ON b.id = a.id AND b.run > a.run
WHERE tstzrange(a.started_at, coalesce(a.ended_at, 'infinity'), '[]')
   && tstzrange(b.started_at, coalesce(b.ended_at, 'infinity'), '[]')
ORDER BY 1, 2, 3"""


def namespaced_cluster(n_hosts: int, max_connections: int):
    """Yield (Hosts, OwnCluster): `n_hosts` namespaces and a cluster listening on their
    bridge; both removed at teardown, also when the test fails."""
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"no network namespaces on this machine: {reason}")
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no Postgres binaries in {PG_BIN}")
    hosts = Hosts(n_hosts).create()
    cluster = None
    try:
        cluster = OwnCluster(listen=[hosts.server], trust=[str(hosts.subnet)],
                             max_connections=max_connections).start()
        yield hosts, cluster
    finally:
        if cluster is not None:
            cluster.destroy()
        hosts.destroy()
    assert hosts.leftovers() == []


@pytest.fixture
def multihost():
    """(Hosts, OwnCluster): three namespaces and a cluster on their bridge."""
    yield from namespaced_cluster(HOSTS, 100)


def feeders_by_host(cluster):
    with cluster.connect(DBNAME) as c:
        return {str(r[0]) for r in c.execute(
            "SELECT DISTINCT client_addr FROM pg_stat_activity WHERE application_name LIKE 'gen_durable feeder%%'")}


def test_three_hosts_drain_every_job_once_and_never_run_an_instance_twice_at_once(multihost, rundurable):
    hosts, cluster = multihost
    with cluster.connect() as c:
        c.execute(f"CREATE DATABASE {DBNAME}")
    manage("migrate", "-v", "0", db=cluster.db_override(DBNAME))
    with cluster.connect(DBNAME) as c:
        c.execute(STEPLOG.format(temp=""))
    # A long lease: no run is reaped for slowness on a busy machine, so exactly once is
    # what the claims alone must give.
    procs = [rundurable("--queue", "default=8", "--verbosity", "1", prefix=hosts.exec_prefix(i),
                        db=cluster.db_override(DBNAME, host=hosts.server), LEASE_TTL=30, HEARTBEAT_INTERVAL=5)
             for i in range(HOSTS)]
    wait_until(lambda: feeders_by_host(cluster) == set(hosts.addresses) or any(p.poll() is not None for p in procs),
               timeout=90, what="a worker up on every host")
    assert all(p.poll() is None for p in procs), [p.log_path.read_text()[-2000:] for p in procs]

    with cluster.connect(DBNAME) as c:
        c.execute("INSERT INTO gen_durable (fsm, step, state, queue) "
                  "SELECT 'tests.HostLogged', 'start', '{\"sleep\": 0.002}', 'default' FROM generate_series(1, %s)",
                  [JOBS])

        def done():
            return c.execute("SELECT count(*) FROM gen_durable WHERE status = 'done'").fetchone()[0] == JOBS

        wait_until(done, timeout=120, interval=0.2, what=f"{JOBS} jobs done")
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(30) == 0, p.log_path.read_text()[-3000:]

        assert dict(c.execute("SELECT status::text, count(*) FROM gen_durable GROUP BY 1").fetchall()) == {"done": JOBS}
        runs = dict(c.execute("SELECT g.id, count(l.run) FROM gen_durable g LEFT JOIN gd_test_steplog l USING (id) "
                              "GROUP BY g.id").fetchall())
        assert len(runs) == JOBS and set(runs.values()) == {1}, {i: n for i, n in runs.items() if n != 1}
        assert c.execute("SELECT count(*) FROM gd_test_steplog WHERE ended_at IS NULL").fetchone()[0] == 0
        assert c.execute(OVERLAPS).fetchall() == []
        per_host = dict((str(h), n) for h, n in c.execute(
            "SELECT host, count(*) FROM gd_test_steplog GROUP BY host").fetchall())
    # Every run came over a namespace's network, and every host took part.
    assert set(per_host) == set(hosts.addresses), per_host
    assert all(n > 0 for n in per_host.values()), per_host
    assert sum(per_host.values()) == JOBS


def test_the_overlap_detector_finds_overlapping_runs_and_only_those(db):
    """Negative control for OVERLAPS: injected overlapping runs are found; a re-run after
    the first ended is not; a run with no end overlaps every later run of its instance."""
    with connection.cursor() as cur:
        cur.execute(STEPLOG.format(temp="TEMP"))
        cur.execute("""INSERT INTO gd_test_steplog (id, host, pid, started_at, ended_at) VALUES
            (1, '10.0.0.10', 1, '2026-01-01 00:00:00.000Z', '2026-01-01 00:00:00.010Z'),
            (1, '10.0.0.11', 2, '2026-01-01 00:00:00.005Z', '2026-01-01 00:00:00.015Z'),
            (2, '10.0.0.10', 1, '2026-01-01 00:00:00.000Z', '2026-01-01 00:00:00.001Z'),
            (2, '10.0.0.11', 2, '2026-01-01 00:00:00.002Z', '2026-01-01 00:00:00.003Z'),
            (3, '10.0.0.10', 1, '2026-01-01 00:00:00.000Z', NULL),
            (3, '10.0.0.11', 2, '2026-01-01 00:00:05.000Z', '2026-01-01 00:00:05.001Z'),
            (4, '10.0.0.12', 3, '2026-01-01 00:00:00.000Z', '2026-01-01 00:00:00.001Z')""")
        cur.execute(OVERLAPS)
        assert [r[0] for r in cur.fetchall()] == [1, 3]
        cur.execute("DROP TABLE gd_test_steplog")


def test_hosts_leave_nothing_behind_even_when_creating_them_fails():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(f"no network namespaces on this machine: {reason}")
    hosts = Hosts(2).create()
    assert len(set(hosts.addresses)) == 2 and hosts.leftovers() != []
    hosts.destroy()
    assert hosts.leftovers() == []

    broken = Hosts(2)
    subprocess.run(["ip", "netns", "add", broken.names[1]], check=True)  # the second host's name is taken
    with pytest.raises(subprocess.CalledProcessError):
        broken.create()
    assert broken.leftovers() == []  # the bridge, host 0 and the squatter are gone


# --- two hosts, two databases ------------------------------------------------------------------

DBS = {"default": "gd_multihost_a", "other": "gd_multihost_b"}
DBLOG = """CREATE TABLE gd_test_dblog (
    run bigserial PRIMARY KEY, db text NOT NULL, id bigint NOT NULL, host inet, pid int NOT NULL,
    started_at timestamptz NOT NULL, ended_at timestamptz)"""
DB_OVERLAPS = OVERLAPS.replace("gd_test_steplog", "gd_test_dblog").replace("b.id = a.id", "b.db = a.db AND b.id = a.id")
DB_JOBS = 1500


@pytest.fixture
def two_host_cluster():
    """(Hosts, OwnCluster): two namespaces and a cluster on their bridge."""
    yield from namespaced_cluster(2, 150)


def test_two_hosts_serve_two_databases_each_row_once_and_in_its_own_database(two_host_cluster, rundurable):
    """`rundurable --database default --database other` on two hosts, each alias its own
    database: every job of each database runs exactly once, never twice at once, and
    every row stays in the database it was inserted in; both hosts work on both."""
    hosts, cluster = two_host_cluster
    with cluster.connect() as c:
        for name in DBS.values():
            c.execute(f"CREATE DATABASE {name}")
    default, other = (cluster.db_override(DBS["default"]), cluster.db_override(DBS["other"]))
    manage("migrate", "-v", "0", db=default, other_db=other)
    manage("migrate", "--database", "other", "-v", "0", db=default, other_db=other)
    with cluster.connect(DBS["default"]) as c:
        c.execute(DBLOG)
    procs = [rundurable("--database", "default", "--database", "other", "--queue", "default=6", "--verbosity", "1",
                        prefix=hosts.exec_prefix(i), db=cluster.db_override(DBS["default"], host=hosts.server),
                        other_db=cluster.db_override(DBS["other"], host=hosts.server),
                        LEASE_TTL=30, HEARTBEAT_INTERVAL=5)
             for i in range(2)]

    def feeders():
        found = set()
        for alias, name in DBS.items():
            with cluster.connect(name) as c:
                found |= {(alias, str(r[0])) for r in c.execute(
                    "SELECT DISTINCT client_addr FROM pg_stat_activity "
                    "WHERE application_name LIKE 'gen_durable feeder%%' AND datname = current_database()")}
        return found

    wanted = {(alias, addr) for alias in DBS for addr in hosts.addresses}
    wait_until(lambda: feeders() == wanted or any(p.poll() is not None for p in procs), timeout=90,
               what="a worker on every host for each database")
    assert all(p.poll() is None for p in procs), [p.log_path.read_text()[-2000:] for p in procs]
    for alias, name in DBS.items():
        with cluster.connect(name) as c:
            c.execute("INSERT INTO gen_durable (fsm, step, state, queue) SELECT 'tests.DbLogged', 'start', "
                      "jsonb_build_object('sleep', 0.002, 'db', %s::text), 'default' FROM generate_series(1, %s)",
                      [alias, DB_JOBS])

    def all_done():
        for name in DBS.values():
            with cluster.connect(name) as c:
                if c.execute("SELECT count(*) FROM gen_durable WHERE status = 'done'").fetchone()[0] != DB_JOBS:
                    return False
        return True

    wait_until(all_done, timeout=150, interval=0.3, what=f"{DB_JOBS} jobs done in each database")
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        assert p.wait(30) == 0, p.log_path.read_text()[-3000:]

    ids = {}
    for alias, name in DBS.items():
        with cluster.connect(name) as c:
            # Every row is where it was inserted: all done, all labelled with this database.
            assert c.execute("SELECT status::text, state->>'db', count(*) FROM gen_durable GROUP BY 1, 2").fetchall() \
                == [("done", alias, DB_JOBS)]
            ids[alias] = {r[0] for r in c.execute("SELECT id FROM gen_durable").fetchall()}
    with cluster.connect(DBS["default"]) as c:
        runs = c.execute("SELECT db, id, count(*) FROM gd_test_dblog GROUP BY 1, 2").fetchall()
        assert {(db, id_) for db, id_, _ in runs} == {(a, i) for a in DBS for i in ids[a]}
        assert {n for _, _, n in runs} == {1}, [r for r in runs if r[2] != 1][:10]
        assert c.execute("SELECT count(*) FROM gd_test_dblog WHERE ended_at IS NULL").fetchone()[0] == 0
        assert c.execute(DB_OVERLAPS).fetchall() == []
        per = {(db, str(h)): n for db, h, n in c.execute(
            "SELECT db, host, count(*) FROM gd_test_dblog GROUP BY 1, 2").fetchall()}
    assert set(per) == wanted, per  # both hosts ran jobs of both databases


def test_the_two_database_overlap_detector_tells_databases_apart(db):
    """Negative control for DB_OVERLAPS: equal ids in two databases running at once are
    not an overlap; two runs of one id in one database are."""
    with connection.cursor() as cur:
        cur.execute(DBLOG.replace("CREATE TABLE", "CREATE TEMP TABLE"))
        cur.execute("""INSERT INTO gd_test_dblog (db, id, host, pid, started_at, ended_at) VALUES
            ('default', 1, '10.0.0.10', 1, '2026-01-01 00:00:00.000Z', '2026-01-01 00:00:00.010Z'),
            ('other',   1, '10.0.0.11', 2, '2026-01-01 00:00:00.005Z', '2026-01-01 00:00:00.015Z'),
            ('other',   2, '10.0.0.10', 1, '2026-01-01 00:00:00.000Z', '2026-01-01 00:00:00.010Z'),
            ('other',   2, '10.0.0.11', 2, '2026-01-01 00:00:00.005Z', '2026-01-01 00:00:00.015Z')""")
        cur.execute(DB_OVERLAPS)
        assert [r[0] for r in cur.fetchall()] == [2]
        cur.execute("DROP TABLE gd_test_dblog")
