"""Reaper and GC sweeps (docs/design.md#leases, docs/design.md#gc)."""

import threading
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection

import gen_durable as gd
from gen_durable import db as gd_db
from gen_durable.models import Instance
from gen_durable.worker import claims, maintenance
from tests.conftest import wait_until
from tests.factories import InstanceFactory, TerminalFactory

RETENTION = 3600.0


@contextmanager
def other_session():
    """A second connection with an open transaction (to hold row locks)."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params) as conn:
        yield conn
        conn.rollback()


@contextmanager
def lock_timeout(seconds):
    """Turn a statement that would wait on a lock into an error instead of a hang."""
    with connection.cursor() as cur:
        cur.execute(f"SET lock_timeout = '{int(seconds * 1000)}ms'")
    try:
        yield
    finally:
        with connection.cursor() as cur:
            cur.execute("RESET lock_timeout")


def age(ids, interval="2 days"):
    with connection.cursor() as cur:
        cur.execute(f"UPDATE gen_durable SET updated_at = now() - interval '{interval}' WHERE id = ANY(%s)",
                    [list(ids)])


# --- reaper --------------------------------------------------------------------------

@pytest.mark.django_db
def test_reaper_returns_expired_leases_and_leaves_fresh_ones(queue_name, events):
    expired = InstanceFactory(queue=queue_name, concurrency_key="k")
    claims.pick(queue_name, 1, "dead-worker", -1)  # lease already expired
    fresh = InstanceFactory(queue=queue_name)
    claims.pick(queue_name, 1, "live-worker", 60)
    Instance.objects.filter(id=expired.id).update(concurrency_shard=0)
    before = Instance.objects.get(id=fresh.id)

    assert maintenance.reap() == [expired.id]

    r = Instance.objects.get(id=expired.id)
    assert (r.status, r.attempt, r.locked_by, r.lease_expires_at, r.concurrency_shard) == \
        ("runnable", 1, None, None, None)
    f = Instance.objects.get(id=fresh.id)
    assert (f.status, f.attempt, f.locked_by, f.lease_expires_at) == \
        ("executing", 0, "live-worker", before.lease_expires_at)
    assert [(m, md) for e, m, md in events if e == "reaper.reaped"] == [({"count": 1}, {})]
    assert maintenance.reap() == []


@pytest.mark.django_db
def test_reaped_row_is_claimable_again(queue_name):
    row = InstanceFactory(queue=queue_name)
    claims.pick(queue_name, 1, "dead-worker", -1)
    maintenance.reap()
    (job,) = claims.pick(queue_name, 1, "next-worker", 60)
    assert (job.id, job.attempt) == (row.id, 1)


def test_reaper_skips_a_locked_row_instead_of_waiting(committed, queue_name):
    locked, free = InstanceFactory(queue=queue_name), InstanceFactory(queue=queue_name)
    claims.pick(queue_name, 2, "dead-worker", -1)
    with other_session() as other:
        other.execute("SELECT id FROM gen_durable WHERE id = %s FOR NO KEY UPDATE", [locked.id])
        with lock_timeout(5):  # a waiting reaper would fail here rather than hang
            assert maintenance.reap() == [free.id]
        assert Instance.objects.get(id=locked.id).status == "executing"
    with lock_timeout(5):
        assert maintenance.reap() == [locked.id]


# --- GC ------------------------------------------------------------------------------

def test_gc_deletes_aged_terminal_rows_and_spares_the_rest(committed, queue_name):
    old_done = TerminalFactory(queue=queue_name)
    old_failed = TerminalFactory(queue=queue_name, status="failed", result=None, last_error="x")
    fresh_done = TerminalFactory(queue=queue_name)
    old_runnable = InstanceFactory(queue=queue_name)
    age([old_done.id, old_failed.id, old_runnable.id])
    assert maintenance.gc(RETENTION, 100) == 2
    assert sorted(Instance.objects.values_list("id", flat=True)) == sorted([fresh_done.id, old_runnable.id])


def test_gc_spares_terminal_children_of_a_live_parent(committed, queue_name):
    parent = InstanceFactory(queue=queue_name, status="awaiting_children", children_pending=1)
    child = TerminalFactory(queue=queue_name, parent=parent)
    age([parent.id, child.id])
    assert maintenance.gc(RETENTION, 100) == 0
    Instance.objects.filter(id=parent.id).update(status="done")
    age([parent.id])
    assert maintenance.gc(RETENTION, 100) == 2
    assert not Instance.objects.exists()


def test_gc_deletes_by_batch_and_sweeps_again_after_a_full_one(committed, queue_name, monkeypatch):
    ids = [TerminalFactory(queue=queue_name).id for _ in range(3)]
    age(ids)
    deletes = []
    real_execute = gd_db.execute

    def spy(sql, params=None, using=None):  # records each DELETE's row count
        n = real_execute(sql, params, using)
        deletes.append(n)
        return n

    monkeypatch.setattr(gd_db, "execute", spy)
    assert maintenance.gc(RETENTION, 2) == 3
    assert deletes == [2, 1]
    assert not Instance.objects.exists()


def test_gc_and_reaper_run_in_two_threads_at_once(committed, queue_name):
    terminal = [TerminalFactory(queue=queue_name).id for _ in range(300)]
    age(terminal)
    for _ in range(50):
        InstanceFactory(queue=queue_name)
    expired = [j.id for j in claims.pick(queue_name, 50, "dead-worker", -1)]
    assert len(expired) == 50
    barrier = threading.Barrier(2)
    results, errors = [], []

    def sweep():
        try:
            barrier.wait()
            deleted = maintenance.gc(RETENTION, 25)
            reaped = maintenance.reap()
            results.append((deleted, reaped))
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(d for d, _ in results) == 300
    reaped = [i for _, r in results for i in r]
    assert sorted(reaped) == sorted(expired)  # each expired lease reaped exactly once
    assert set(Instance.objects.values_list("status", flat=True)) == {"runnable"}
    assert set(Instance.objects.values_list("attempt", flat=True)) == {1}


# --- a step whose worker dies ----------------------------------------------------------

def test_reaped_row_records_that_its_worker_died_in_the_step(committed, queue_name):
    row = InstanceFactory(fsm="tests.noop", queue=queue_name, step="perform")
    claims.pick(queue_name, 1, "dead-worker", -1)
    assert maintenance.reap() == [row.id]
    r = Instance.objects.get(id=row.id)
    assert (r.status, r.attempt) == ("runnable", 1)
    assert r.last_error == "the worker died or lost its lease during step perform (attempt 0)"


def test_a_job_whose_worker_keeps_dying_fails_at_max_attempts_without_another_run(
        committed, engine, queue_name, tmp_path):
    """A job that kills its own process is reaped again and again; each reap counts an
    attempt, and the claim at attempt == max_attempts fails the row instead of running
    the body (which would take the worker down once more). On main it ran forever."""
    from tests.durable_app.supervision_machines import DiesInStep

    log = tmp_path / "runs.log"
    rid = gd.insert(DiesInStep, args={"log": str(log)}, queue=queue_name)
    for _ in range(DiesInStep.max_attempts):  # each: claimed, then the worker died in it
        assert [j.id for j in claims.pick(queue_name, 1, "dead-worker", -1)] == [rid]
        assert maintenance.reap() == [rid]
    engine({queue_name: 1}, reaper=False, gc=False)
    wait_until(lambda: Instance.objects.get(id=rid).status == "failed", timeout=20, what="the row failed")
    r = Instance.objects.get(id=rid)
    assert r.attempt == DiesInStep.max_attempts
    assert "reached max_attempts (3)" in r.last_error and "the worker died" in r.last_error
    assert not log.exists()  # the body did not run a fourth time


def test_a_job_below_max_attempts_is_run_again_after_its_worker_died(committed, engine, queue_name, tmp_path):
    from tests.durable_app.supervision_machines import DiesInStep

    log = tmp_path / "runs.log"
    rid = gd.insert(DiesInStep, args={"log": str(log)}, queue=queue_name)
    for _ in range(DiesInStep.max_attempts - 1):
        claims.pick(queue_name, 1, "dead-worker", -1)
        maintenance.reap()
    engine({queue_name: 1}, reaper=False, gc=False)
    wait_until(lambda: Instance.objects.get(id=rid).status == "done", timeout=20, what="the row done")
    assert Instance.objects.get(id=rid).result == {"attempt": DiesInStep.max_attempts - 1}


def test_machine_max_attempts_must_be_a_positive_int_or_none():
    from gen_durable.exceptions import InvalidInput

    with pytest.raises(InvalidInput, match="max_attempts must be an int >= 1 or None"):
        type("BadLimit", (gd.Machine,), {"name": "tests.BadLimit", "max_attempts": 0, "__module__": __name__,
                                         "start": gd.step(lambda self, ctx: gd.Done())})
