"""Connections the server closes, steps that lose theirs, and locks that do not go away
(docs/reliability.md, "Connections"). In-process workers on the shared server; every
killed session belongs to this test's own database.

The Recorder machine logs each run's start and end to a file, so "the body ran once"
is counted exactly.
"""

import time

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.durable import Recorder
from tests.durable_app.fault_machines import DbJob, DbMachine
from tests.faults.conftest import log_lines, tally
from tests.faults.test_supervision import alive
from tests.helpers import role_name, sessions
from tests.races.test_faults import other_session, statuses


def terminate(where="", params=()):
    """pg_terminate_backend every client session of this database but ours (and `where`)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend' " + where, list(params))
        return cur.fetchone()[0]


def run_once_each(ids, log, queue, timeout):
    wait_until(lambda: statuses(queue) == {"done": len(ids)}, timeout=timeout, what=f"{len(ids)} done")
    assert tally(log, "start") == {i: 1 for i in ids}, "every body ran exactly once"
    assert set(Instance.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {0}, "nothing was reaped"


def test_connections_the_server_closed_while_idle_lose_no_outcome(committed, engine, queue_name, tmp_path):
    """idle_session_timeout, a NAT or a failover closes every idle connection of the worker.

    The next flush must not drop its outcomes (to be re-run by the reaper after the
    lease): it is retried on a new connection at once."""
    log = tmp_path / "steps.log"
    engine({queue_name: 2})
    warm = gd.insert(Recorder, state={"log": str(log)}, queue=queue_name)  # every role connects
    wait_until(lambda: statuses(queue_name) == {"done": 1}, what="the first instance done")
    time.sleep(0.3)  # and goes idle
    assert terminate() >= 3
    ids = gd.insert_all([gd.Spec(Recorder, state={"log": str(log)}, queue=queue_name) for _ in range(5)])
    # Each body ran once and no row was reaped (a reaped row's attempt is 1): the flush
    # that met the closed connection was retried at once, not left to the lease.
    run_once_each([warm] + ids, log, queue_name, timeout=30)


@pytest.mark.parametrize("role", ["flusher", "feeder", "heartbeat", "reaper", "gc", "listener"])
def test_each_roles_connection_terminated_in_turn(committed, engine, queue_name, tmp_path, role):
    log = tmp_path / "steps.log"
    sup = engine({queue_name: 2})
    name = role_name(sup, role, queue_name)
    # Terminated while it is idle: a claim or a flush whose COMMIT is cut off is in doubt
    # (the lease settles it, re-running the step). A first instance, done, has every role
    # connected and idle.
    warm = gd.insert(Recorder, state={"log": str(log)}, queue=queue_name)
    wait_until(lambda: statuses(queue_name) == {"done": 1}, what="the first instance done")
    # One long step keeps a row held, so the heartbeat has work to do; it is claimed and
    # running before we strike, and its outcome is flushed well after.
    first = gd.insert(Recorder, state={"log": str(log), "sleep": 1.5}, queue=queue_name)
    wait_until(lambda: tally(log, "start").get(first) == 1 and sessions(name) == 1, what=f"the {role} connected")
    assert terminate("AND application_name = %s", [name]) == 1
    ids = [warm, first] + gd.insert_all([gd.Spec(Recorder, state={"log": str(log)}, queue=queue_name)
                                         for _ in range(3)])
    run_once_each(ids, log, queue_name, timeout=30)
    wait_until(lambda: sessions(name) == 1, what=f"the {role} to reconnect")
    assert sup.flusher._thread.is_alive() and all(s._thread.is_alive() for s in sup.schedulers.values())


@pytest.mark.parametrize("machine", [DbJob, DbMachine])
def test_a_step_that_loses_its_connection_is_retried_not_handled(committed, engine, queue_name, tmp_path, machine):
    """The step's own session is terminated under it: retried with back-off, not handed to
    handle() (the machine's default handle() stops on any exception; the job's retries
    with its own backoff)."""
    log = tmp_path / "steps.log"
    engine({queue_name: 1})
    id_ = gd.insert(machine, state={"log": str(log), "mode": "lose"}, queue=queue_name)
    wait_until(lambda: statuses(queue_name) == {"done": 1}, timeout=30, what="the instance done")
    r = Instance.objects.get(id=id_)
    assert (r.attempt, r.result) == (1, {"attempt": 1})
    assert [(a, w) for _, a, w, _ in log_lines(log)] == [(0, "start"), (1, "start"), (1, "end")]


def test_a_data_error_in_a_step_still_goes_to_handle(committed, engine, queue_name, tmp_path):
    log = tmp_path / "steps.log"
    engine({queue_name: 1})
    id_ = gd.insert(DbMachine, state={"log": str(log), "mode": "data"}, queue=queue_name)
    wait_until(lambda: statuses(queue_name) == {"failed": 1}, timeout=30, what="the instance failed")
    r = Instance.objects.get(id=id_)
    assert r.attempt == 0 and "division by zero" in r.last_error


def test_a_flush_blocked_by_another_sessions_lock_commits_the_rest(committed, engine, settings, queue_name, tmp_path):
    """Another session holds one instance's row FOR UPDATE in an open transaction.

    The flush gives up on it after LOCK_TIMEOUT, commits the other outcomes at once, and
    commits the blocked one once the lock is gone — nothing waits forever, nothing runs twice."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "LOCK_TIMEOUT": 0.3, "LEASE_TTL": 6, "HEARTBEAT_INTERVAL": 0.5}
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()
    engine({queue_name: 4})
    blocked = gd.insert(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 30}, queue=queue_name)
    wait_until(lambda: tally(log, "start") == {blocked: 1}, what="the blocked instance's step running")
    with other_session() as other:
        other.execute("SELECT id FROM gen_durable WHERE id = %s FOR UPDATE", [blocked])
        hold.unlink()  # its step ends; its flush waits on our lock
        wait_until(lambda: tally(log, "end") == {blocked: 1}, what="the step to end")
        others = gd.insert_all([gd.Spec(Recorder, state={"log": str(log)}, queue=queue_name) for _ in range(4)])
        wait_until(lambda: statuses(queue_name) == {"done": 4, "executing": 1}, timeout=20,
                   what="the other outcomes committed while the lock is held")
    run_once_each([blocked] + others, log, queue_name, timeout=20)


def _blocked_flush(queue, alone):
    """Flush a Done for a row another session holds FOR UPDATE (so the statement waits),
    on a thread of its own, and terminate that thread's session while it waits. Returns
    the exception the flush raised and whether the outcome committed."""
    import threading

    from django.db import connections

    from gen_durable.outcomes import Done
    from gen_durable.worker import claims, executor
    from gen_durable.worker.flusher import flush

    gd.insert(Recorder, state={}, queue=queue)
    (job,) = claims.pick(queue, 1, "doubt-worker", 60)
    entry = executor.to_entry(Done({}), Recorder, job, consumed=(), presented=())
    raised = []

    def run():
        try:
            with connection.cursor() as cur:  # this thread's connection, used just now
                cur.execute("SELECT set_config('application_name', 'doubt-flusher', false)")
            flush([entry], alone=alone)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            raised.append(exc)
        finally:
            connections.close_all()

    with other_session() as other:
        other.execute("SELECT id FROM gen_durable WHERE id = %s FOR UPDATE", [job.id])
        thread = threading.Thread(target=run)
        thread.start()
        wait_until(lambda: _waiting_on_a_lock("doubt-flusher"), what="the flush waiting on the row lock")
        assert terminate("AND application_name = 'doubt-flusher'") == 1
        thread.join(10)
    return (raised[0] if raised else None), Instance.objects.get(id=job.id).status


def _waiting_on_a_lock(application_name):
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                    "AND wait_event_type = 'Lock'", [application_name])
        return cur.fetchone()[0] == 1


def test_a_connection_lost_during_a_lone_flush_statement_leaves_it_in_doubt(committed, queue_name):
    """Run alone (no BEGIN), the flush statement is its own commit: lost mid-way, it may
    have committed, so it is reported in doubt (not replayed; the lease settles it)."""
    from gen_durable.worker.flusher import CommitInDoubt

    exc, status = _blocked_flush(queue_name, alone=True)
    assert isinstance(exc, CommitInDoubt), repr(exc)
    assert status == "executing"


def test_control_lost_inside_a_transaction_before_commit_is_a_plain_retryable_error(committed, queue_name):
    """The same loss with BEGIN first is before COMMIT: nothing committed, and the
    error is the connection's own (the Flusher retries it on a new connection)."""
    from gen_durable import db
    from gen_durable.worker.flusher import CommitInDoubt

    exc, status = _blocked_flush(queue_name, alone=False)
    assert exc is not None and not isinstance(exc, CommitInDoubt) and db.is_transient_error(exc), repr(exc)
    assert status == "executing"


def test_a_connection_the_server_closed_is_not_untouched(committed):
    """`connections.untouched`: the flusher's check before a lone statement. A session
    the server terminated has sent its error message and closed: one check (no round
    trip) tells, the first time it is asked after the server is done with it."""
    from gen_durable.worker import connections as engine_connections

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    assert engine_connections.untouched() and engine_connections.untouched()
    with other_session() as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
    # The server's process for the session is gone (or a zombie): its socket is closed,
    # its error message and end of stream are on ours (loopback, the same host).
    wait_until(lambda: not alive(pid), what="the server process of the session to exit")
    assert not engine_connections.untouched()
    connection.close()


def test_untouched_holds_for_a_socket_above_fd_setsize(transactional_db):
    """A process with many files open (high concurrency, many connections) gets socket
    descriptors of 1024 and up, which select() refuses: the check must not depend on it
    (with select() every flush there took BEGIN/COMMIT — found by a review)."""
    import os
    import resource

    from gen_durable.worker import connections as engine_connections

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        if hard != resource.RLIM_INFINITY and hard < 1200:
            pytest.skip(f"this process may open {hard} files at most")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200 if hard == resource.RLIM_INFINITY else min(hard, 4096), hard))
    connection.close()  # first: the new socket takes the lowest free descriptor
    spare = [os.dup(0) for _ in range(1100)]
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
        assert connection.connection.fileno() >= 1024
        assert engine_connections.untouched(), "an open, quiet connection reported as closed"
    finally:
        connection.close()
        for f in spare:
            os.close(f)


@pytest.mark.parametrize("locked", ["its own row", "its parent's row"])
def test_an_outcome_a_lock_holds_back_makes_no_later_flush_wait(committed, settings, queue_name, caplog, locked):
    """Once an outcome is held back by another session's lock (on its row, or on its
    parent's, which a child's end counts off), its retries do not put the next batches
    behind LOCK_TIMEOUT again: while the lock lasts, every other outcome commits at once
    and exactly one flush ever waited. Control: without the probe of the deferred rows
    and their parents (`Flusher._still_locked_out`, `_locked`) each retry (every 0.5 s)
    waited LOCK_TIMEOUT with whatever batch it joined."""
    from gen_durable.outcomes import Done
    from gen_durable.worker import claims, executor
    from gen_durable.worker.flusher import Flusher

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "LOCK_TIMEOUT": 1}
    ids = gd.insert_all([gd.Spec(Recorder, state={}, queue=queue_name) for _ in range(8)])
    target = ids[0]
    if locked == "its parent's row":
        target = gd.insert(Recorder, state={}, queue=queue_name + "-parents")
        Instance.objects.filter(id=target).update(status="awaiting_children", children_pending=1)
        Instance.objects.filter(id=ids[0]).update(parent_id=target)
    jobs = {j.id: j for j in claims.pick(queue_name, 8, "lock-worker", 60)}
    entry = {i: executor.to_entry(Done({}), Recorder, jobs[i], consumed=(), presented=()) for i in ids}
    flusher = Flusher(max_delay=0).start()
    try:
        with caplog.at_level("WARNING", logger="gen_durable.flusher"), other_session() as other:
            other.execute("SELECT id FROM gen_durable WHERE id = %s FOR UPDATE", [target])
            assert flusher.commit(entry[ids[1]]) == "committed"  # the connection is warm
            blocked = flusher.submit(entry[ids[0]], wait=True)
            for i in ids[2:]:  # one outcome every 0.4 s for ~3 s while the lock is held
                time.sleep(0.4)
                assert flusher.commit(entry[i], timeout=5) == "committed"
            assert not blocked.done()
        assert blocked.result(timeout=5) == "committed"  # the lock is gone: it commits
    finally:
        flusher.stop(10)
    waited = [r for r in caplog.records if "waited LOCK_TIMEOUT" in r.getMessage()]
    assert len(waited) == 1, [r.getMessage() for r in waited]
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
