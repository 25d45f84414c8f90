"""K=1 under concurrent claimers (docs/design.md#concurrency-keys, docs/design.md#reliability-bars).

The hammer runs the production pick from two OS processes × 8 threads on one queue of
rows sharing a few concurrency keys; every claimer logs, while it holds a row, the
database-clock interval it held it and how many rows of that key were executing.
"""

import os
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker import claims, executor
from gen_durable.worker.flusher import flush
from tests.conftest import wait_until
from tests.durable_app.durable import Plain
from tests.factories import InstanceFactory

ROOT = Path(__file__).resolve().parents[2]
PROCESSES, THREADS, KEYS, ROWS_PER_KEY = 2, 8, 4, 40

LOG_DDL = """CREATE TABLE IF NOT EXISTS gd_test_k1_log (
    n bigserial PRIMARY KEY, key text NOT NULL, id bigint NOT NULL, worker text NOT NULL,
    t0 timestamptz NOT NULL, t1 timestamptz, seen int NOT NULL)"""

# Run in a child process: python -c BOOT <queue> <tag> <rendezvous dir>
BOOT = f"""
import os, sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / "example_project")!r}]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
import django
django.setup()
from tests.races.test_engine_races import claimer_process
sys.exit(claimer_process(*sys.argv[1:]))
"""


# --- the child process ---------------------------------------------------------------

def _claimer(queue, worker, errors):
    """Claim rows of `queue` until none is left; log each hold; complete it with Done."""
    try:
        while True:
            jobs = claims.pick(queue, 2, worker, 30)
            if not jobs:
                with connection.cursor() as cur:
                    cur.execute("SELECT EXISTS (SELECT 1 FROM gen_durable WHERE queue = %s "
                                "AND status IN ('runnable', 'executing'))", [queue])
                    if not cur.fetchone()[0]:
                        return
                continue
            for job in jobs:
                with connection.cursor() as cur:
                    cur.execute(
                        "INSERT INTO gd_test_k1_log (key, id, worker, t0, seen) "
                        "SELECT %(key)s, %(id)s, %(worker)s, clock_timestamp(), count(*) FROM gen_durable "
                        "WHERE concurrency_key = %(key)s AND status = 'executing' RETURNING n",
                        {"key": job.concurrency_key, "id": job.id, "worker": worker})
                    (n,) = cur.fetchone()
                time.sleep(0.002)  # widen the hold (workload, not synchronisation)
                with connection.cursor() as cur:
                    cur.execute("UPDATE gd_test_k1_log SET t1 = clock_timestamp() WHERE n = %s", [n])
                entry = executor.to_entry(gd.Done({}), Plain, job, consumed=(), presented=())
                result = flush([entry])
                if result.stale:
                    raise AssertionError(f"outcome of {job.id} went stale")
    except BaseException:
        errors.append(traceback.format_exc())
    finally:
        connection.close()


def claimer_process(queue, tag, rendezvous) -> int:
    """Entry point of one child: THREADS claimers; exit status 1 on any error.

    The child reports ready (file `<rendezvous>/<tag>`) and starts claiming once the
    test creates `<rendezvous>/go`, so both processes really overlap.
    """
    errors = []
    Path(rendezvous, tag).touch()
    deadline = time.monotonic() + 60
    while not Path(rendezvous, "go").exists():
        if time.monotonic() > deadline:
            print("no go signal", file=sys.stderr)
            return 1
        time.sleep(0.01)
    threads = [threading.Thread(target=_claimer, args=(queue, f"{tag}-t{i}", errors)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


# --- tests ---------------------------------------------------------------------------

@pytest.fixture
def k1_log(committed):
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS gd_test_k1_log")
        cur.execute(LOG_DDL)
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS gd_test_k1_log")


def test_never_two_executing_rows_per_key_under_two_processes_of_eight_claimers(k1_log, queue_name, tmp_path):
    keys = [f"k1:{queue_name}:{k}" for k in range(KEYS)]
    gd.insert_all([gd.Spec(Plain, queue=queue_name, concurrency_key=k) for k in keys for _ in range(ROWS_PER_KEY)])
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
    procs = [subprocess.Popen([sys.executable, "-c", BOOT, queue_name, f"p{i}", str(tmp_path)], cwd=ROOT,
                              env=env, stderr=subprocess.PIPE, text=True) for i in range(PROCESSES)]
    try:
        wait_until(lambda: all((tmp_path / f"p{i}").exists() for i in range(PROCESSES)), timeout=60,
                   what="both claimer processes ready")
    finally:
        (tmp_path / "go").touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]

    total = KEYS * ROWS_PER_KEY
    assert Instance.objects.filter(queue=queue_name, status="done").count() == total
    with connection.cursor() as cur:
        cur.execute("SELECT count(*), count(DISTINCT id), max(seen), count(t1), "
                    "count(DISTINCT split_part(worker, '-', 1)) FROM gd_test_k1_log")
        holds, distinct_ids, max_seen, closed, processes = cur.fetchone()
        cur.execute("""SELECT a.key, a.id, b.id FROM gd_test_k1_log a JOIN gd_test_k1_log b
                       ON a.key = b.key AND a.n < b.n AND a.t0 < b.t1 AND b.t0 < a.t1""")
        overlaps = cur.fetchall()
    assert (holds, distinct_ids, closed) == (total, total, total)
    assert processes == PROCESSES, "both processes claimed rows"
    assert max_seen == 1, "a claimer saw another executing row of its key"
    assert overlaps == []


@pytest.mark.django_db
def test_unique_arbiter_rejects_a_second_executing_row_of_a_key(queue_name):
    rows = [InstanceFactory(queue=queue_name, concurrency_key="solo") for _ in range(2)]
    (job,) = claims.pick(queue_name, 10, "w", 60)
    other = next(r.id for r in rows if r.id != job.id)
    with pytest.raises(IntegrityError, match="gen_durable_concurrency_active"):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("UPDATE gen_durable SET status = 'executing', locked_by = 'intruder' WHERE id = %s",
                        [other])
    assert Instance.objects.get(id=other).status == "runnable"


@contextmanager
def other_session():
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as conn:
        yield conn


def test_claim_losing_the_arbiter_race_retries_and_emits_contended(committed, queue_name, events):
    """Deterministic arbiter race: another session has flipped row a of key k to executing but
    not committed, so the pick's probe cannot see it and it claims b; its index entry
    waits on a's, and fails once a commits. The retried pick sees a and takes nothing."""
    a = InstanceFactory(queue=queue_name, concurrency_key="race", priority=0)
    b = InstanceFactory(queue=queue_name, concurrency_key="race", priority=1)
    picked, pid, errors = [], [], []

    def picker():
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")
                pid.append(cur.fetchone()[0])
            picked.append(claims.pick(queue_name, 10, "picker", 60))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    with other_session() as holder:
        holder.execute("UPDATE gen_durable SET status = 'executing', locked_by = 'holder', "
                       "lease_expires_at = now() + interval '60 seconds' WHERE id = %s", [a.id])
        t = threading.Thread(target=picker)
        t.start()

        def picker_waits_on_a_lock():
            with connection.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                            [pid[0] if pid else -1])
                return cur.fetchone()[0] == 1

        wait_until(picker_waits_on_a_lock, what="the pick to wait on the arbiter index")
        holder.commit()
    t.join(30)
    assert errors == [] and picked == [[]]
    contended = [(m, md) for e, m, md in events if e == "concurrency.contended"]
    assert contended == [({"count": 1}, {"queue": queue_name})]
    assert Instance.objects.get(id=b.id).status == "runnable"
    assert (Instance.objects.get(id=a.id).status, Instance.objects.get(id=a.id).locked_by) == ("executing", "holder")


def _arbiter_violation():
    return IntegrityError('duplicate key value violates unique constraint "gen_durable_concurrency_active"')


@pytest.mark.django_db
@pytest.mark.parametrize("failures, claimed, retries", [(2, 1, 2), (3, 0, 2)])
def test_contended_claim_is_retried_three_times_in_all(monkeypatch, queue_name, events, failures, claimed, retries):
    InstanceFactory(queue=queue_name)
    real = claims.db.fetchall
    left = [failures]

    def fetchall(sql, params=None, using=None):
        if sql is claims.sql.PICK and left[0]:
            left[0] -= 1
            raise _arbiter_violation()
        return real(sql, params, using)

    monkeypatch.setattr(claims.db, "fetchall", fetchall)
    assert len(claims.pick(queue_name, 10, "w", 60)) == claimed
    assert [e for e, _, _ in events if e == "concurrency.contended"] == ["concurrency.contended"] * retries


@pytest.mark.django_db
def test_other_integrity_errors_of_the_claim_propagate(monkeypatch, queue_name):
    def fetchall(sql, params=None, using=None):
        raise IntegrityError('duplicate key value violates unique constraint "something_else"')

    monkeypatch.setattr(claims.db, "fetchall", fetchall)
    with pytest.raises(IntegrityError, match="something_else"):
        claims.pick(queue_name, 10, "w", 60)
