"""Django's Tasks framework on gen_durable (gen_durable.tasks.GenDurableBackend).

The framework's public contract, as Django's own backend tests exercise it: enqueue,
defer, priority order, get_result, context, async tasks, errors, unknown queues,
non-JSON arguments, transactions — run through `gen_durable.testing.drain()` in the
test's transaction, and against a real `rundurable` subprocess (get_result across
processes). Runs on Django 6.x (`django.tasks`) and Django 5.2 (the backport).
"""

import datetime as dt
import os
import re
import subprocess
from pathlib import Path

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from gen_durable import testing
from gen_durable.models import Instance
from gen_durable.tasks import (
    AsyncTaskMachine,
    GenDurableBackend,
    InvalidTask,
    InvalidTaskBackend,
    TaskResultDoesNotExist,
    TaskResultMismatch,
    TaskResultStatus,
    enqueue_all,
    machine_for,
    task,
    task_backends,
)
from tests.durable_app import tasks as t
from tests.helpers import ConnectionThread
from tests.integration.test_rundurable import MANAGE, ROOT, child_env

pytestmark = pytest.mark.django_db


def test_the_backend_supports_every_feature():
    backend = task_backends["default"]
    assert isinstance(backend, GenDurableBackend)
    assert (backend.supports_defer, backend.supports_async_task, backend.supports_get_result,
            backend.supports_priority) == (True, True, True, True)
    assert t.add.get_backend() is backend


def test_enqueue_returns_a_ready_result_of_one_statement():
    with CaptureQueriesContext(connection) as q:
        result = t.add.enqueue(1, 2)
    assert len(q) == 1
    assert result.status == TaskResultStatus.READY
    assert result.id.isdigit() and result.task == t.add and result.backend == "default"
    assert (result.args, result.kwargs) == ([1, 2], {})
    assert result.enqueued_at is not None and result.started_at is None and result.finished_at is None
    assert (result.worker_ids, result.errors, result.attempts) == ([], [], 0)
    assert not result.is_finished
    with pytest.raises(ValueError, match="not finished"):
        result.return_value
    row = Instance.objects.get(id=int(result.id))
    assert (row.fsm, row.step, row.status, row.queue, row.state) == (
        "tests.durable_app.tasks.add", "run", "runnable", "default", {"args": [1, 2], "kwargs": {}})
    assert row.inserted_at == result.enqueued_at


def test_a_drained_task_is_successful_with_a_complete_result():
    result = t.echo.enqueue(1, "two", key=[3])
    testing.drain()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.is_finished
    # Django's JSON round trip: the tuple comes back a list.
    assert result.return_value == {"args": [1, "two"], "kwargs": {"key": [3]}, "tuple": [1, 2]}
    assert result.errors == [] and result.attempts == 1 and len(result.worker_ids) == 1
    assert result.worker_ids[0].startswith("drain:")
    assert result.enqueued_at <= result.started_at == result.last_attempted_at <= result.finished_at
    again = t.echo.get_result(result.id)
    assert (again.status, again.return_value, again.worker_ids) == (result.status, result.return_value,
                                                                    result.worker_ids)


def test_async_enqueue_get_result_and_async_task_functions():
    from asgiref.sync import async_to_sync

    result = async_to_sync(t.async_add.aenqueue)(2, 3)
    testing.drain()
    fetched = async_to_sync(t.async_add.aget_result)(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL and fetched.return_value == 5
    async_to_sync(result.arefresh)()
    assert result.return_value == 5
    # async def tasks are async steps: they run on the worker's event loop.
    assert issubclass(machine_for(t.async_add), AsyncTaskMachine)
    assert not issubclass(machine_for(t.add), AsyncTaskMachine)
    assert not issubclass(machine_for(t.async_whoami), AsyncTaskMachine)  # context: async_to_sync in a thread
    ctx = t.async_whoami.enqueue("a")
    testing.drain()
    ctx.refresh()
    assert ctx.return_value == {"attempt": 1, "id": ctx.id, "tag": "a"}


def test_context_counts_attempts_from_one_and_sees_the_running_row():
    result = t.whoami.enqueue("x")
    testing.drain()
    result.refresh()
    value = result.return_value
    assert value["attempt"] == 1 and value["id"] == result.id and value["tag"] == "x"
    assert value["status"] == "RUNNING" and value["started"] and value["workers"] == result.worker_ids


def test_an_exception_fails_the_task_with_its_class_path_and_traceback():
    result = t.fail.enqueue("boom")
    counts = testing.drain()
    assert counts["stop"] == 1
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError" and error.exception_class is ValueError
    assert error.traceback.startswith("Traceback (most recent call last)")
    assert "ValueError: boom" in error.traceback and 'raise ValueError(message)' in error.traceback
    assert "gen_durable/worker" not in error.traceback  # it starts at the task, not in the worker
    assert result.attempts == 1 and result.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        result.return_value
    assert Instance.objects.get(id=int(result.id)).last_error == "builtins.ValueError: boom"


def test_a_non_json_return_value_fails_the_task():
    result = t.bad_return.enqueue()
    testing.drain()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.TypeError"


def test_retries_follow_the_backend_options_and_keep_every_error():
    result = t.flaky.enqueue(3)  # fails on attempts 1 and 2 (MAX_ATTEMPTS 3, no backoff)
    counts = testing.drain()
    assert (counts["retry"], counts["done"]) == (2, 1)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 3, "errors": 2}
    assert result.attempts == 3 and [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 1 fails" in result.errors[0].traceback and "attempt 2 fails" in result.errors[1].traceback
    assert result.started_at <= result.last_attempted_at <= result.finished_at

    gone = t.always_fails.enqueue()
    testing.drain()
    gone.refresh()
    assert gone.status == TaskResultStatus.FAILED and gone.attempts == 3
    assert [e.exception_class_path for e in gone.errors] == ["builtins.KeyError"] * 3


def test_live_task_rows_of_an_alias_the_release_lacks_are_warned_about():
    """A deploy that renames a TASKS alias while rows enqueued through it wait: W063 names
    the old alias, with the count and an example id (such a row would fail unrun)."""
    from gen_durable.integrations.tasks import check_task_row_aliases

    queued = [t.flaky.enqueue(3), t.flaky.enqueue(3)]
    t.noop.enqueue()  # through "default", which stays
    assert check_task_row_aliases(databases=["default"]) == []
    renamed = {k: v for k, v in settings.TASKS.items() if k != "retrying"}
    renamed["retry3"] = settings.TASKS["retrying"]
    with override_settings(TASKS=renamed):
        (warning,) = check_task_row_aliases(databases=["default"])
        assert check_task_row_aliases() == []  # only with --database
    assert warning.id == "gen_durable.W063"
    assert warning.msg == (f"2 live task rows in database 'default' were enqueued through TASKS['retrying'] "
                           f"(e.g. id {min(int(r.id) for r in queued)}), which this release has no gen_durable "
                           "backend for: a worker of this release fails them unrun.")


def test_the_default_backend_does_not_retry():
    result = t.fail.enqueue("once")
    assert testing.drain()["retry"] == 0
    result.refresh()
    assert result.attempts == 1


def test_run_after_becomes_eligible_at():
    when = timezone.now() + dt.timedelta(hours=1)
    result = t.add.using(run_after=when).enqueue(1, 1)
    assert testing.drain(with_scheduled=False)["steps"] == 0
    row = Instance.objects.get(id=int(result.id))
    assert row.eligible_at == when
    fetched = t.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY and fetched.task.run_after == when
    testing.drain()  # with_scheduled collapses the wait
    result.refresh()
    assert result.return_value == 2


def test_priority_maps_onto_gen_durable_order():
    for p in (-100, 0, 100, 5, -5):
        t.add.using(priority=p).enqueue(p, 0)
    rows = Instance.objects.filter(fsm="tests.durable_app.tasks.add").order_by("priority", "eligible_at")
    assert [r.state["args"][0] for r in rows] == [100, 5, 0, -5, -100]  # larger Django priority first
    ran = []
    from gen_durable import telemetry

    def on_step(event, measurements, metadata):
        ran.append(metadata["id"])

    telemetry.attach("step.stop", on_step)
    try:
        testing.drain()
    finally:
        telemetry.detach(on_step)
    assert ran == [r.id for r in rows]
    assert [t.add.get_result(str(i)).task.priority for i in ran] == [100, 5, 0, -5, -100]


def test_unknown_queues_and_bad_tasks_are_invalid():
    with pytest.raises(InvalidTask, match=r"queue 'elsewhere' is not one of this backend's QUEUES \(\['default'\]\)\.$"):
        t.add.using(queue_name="elsewhere")
    with pytest.raises(InvalidTask, match=r"queue 'defualt' .*; did you mean 'default'\?$"):
        t.add.using(queue_name="defualt")
    with override_settings(GEN_DURABLE={**settings.GEN_DURABLE, "QUEUES": {"other": 1}}):
        with pytest.raises(InvalidTask, match=r"not in GEN_DURABLE\['QUEUES'\]"):
            t.add.using(priority=3)
        with pytest.raises(InvalidTask, match=r"not in GEN_DURABLE\['QUEUES'\]"):
            t.add.enqueue(1, 2)
    with pytest.raises(InvalidTask, match="priority"):
        t.add.using(priority=101)

    def local():
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task(local)
    assert Instance.objects.count() == 0


def test_a_queue_another_deployment_runs_is_accepted_through_extra_queues():
    """A task may go to a queue this deployment does not run but GEN_DURABLE['EXTRA_QUEUES']
    declares (another fleet's `rundurable --queue remote-eu`), as `gd.insert` accepts it;
    without the entry E061 and InvalidTask name both settings."""
    remote = {"BACKEND": "gen_durable.tasks.GenDurableBackend", "QUEUES": ["remote-eu"]}
    declared = {**settings.GEN_DURABLE, "EXTRA_QUEUES": [*settings.GEN_DURABLE["EXTRA_QUEUES"], "remote-*"]}
    with override_settings(GEN_DURABLE=declared, TASKS={**settings.TASKS, "remote": remote}):
        assert not [e for e in run_checks() if e.id == "gen_durable.E061"]
        result = t.add.using(backend="remote", queue_name="remote-eu").enqueue(1, 2)
        assert Instance.objects.get(id=int(result.id)).queue == "remote-eu"
    with override_settings(TASKS={**settings.TASKS, "remote": remote}):
        found = [e.msg for e in run_checks() if e.id == "gen_durable.E061"]
        assert len(found) == 1 and "['remote-eu']" in found[0] and "EXTRA_QUEUES" in found[0], found
        with pytest.raises(InvalidTask, match=r"is not in GEN_DURABLE\['QUEUES'\].*nor GEN_DURABLE\['EXTRA_QUEUES'\]"):
            t.add.using(backend="remote", queue_name="remote-eu")


def test_non_json_arguments_are_rejected_and_nothing_is_stored():
    with pytest.raises(TypeError):
        t.add.enqueue(object(), 1)
    with pytest.raises(TypeError):
        t.add.enqueue(1, b=dt.datetime.now())
    assert Instance.objects.count() == 0


def test_get_result_of_a_missing_id_or_a_machine_row():
    import gen_durable as gd
    from tests.durable_app.durable import Counter

    backend = task_backends["default"]
    for bad in ("999999999", "abc", "", str(2**64)):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(bad)
    machine_id = gd.insert(Counter, state={"target": 1})
    with pytest.raises(TaskResultDoesNotExist, match="not a task"):
        backend.get_result(str(machine_id))


def test_get_result_of_another_task_is_a_mismatch():
    result = t.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        t.echo.get_result(result.id)


def test_bulk_enqueue_is_one_statement():
    with CaptureQueriesContext(connection) as q:
        results = enqueue_all([(t.add, (i, i), {}) for i in range(50)] + [(t.add.using(priority=7), [1], {"b": 2})])
    assert len(q) == 1 and len(results) == 51
    assert [int(r.id) for r in results] == sorted(int(r.id) for r in results)
    assert results[-1].task.priority == 7 and results[-1].kwargs == {"b": 2}
    testing.drain()
    assert [t.add.get_result(r.id).return_value for r in results] == [2 * i for i in range(50)] + [3]
    with pytest.raises(TypeError):
        enqueue_all([(t.add, (1, 2), {}), (t.add, (object(),), {})])
    with pytest.raises(InvalidTask, match="triples"):
        enqueue_all([(t.add, (1, 2))])
    assert Instance.objects.count() == 51


def test_a_lost_attempt_is_an_error_with_its_worker_and_counts_as_an_attempt():
    from gen_durable import db, sql

    def lose(result):
        Instance.objects.filter(id=int(result.id)).update(
            status="executing", locked_by="dead-worker", lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        assert db.fetchall(sql.REAP, {"limit": 10, "history": True})

    retried = t.flaky.enqueue(1)  # the "retrying" backend: 3 attempts
    lose(retried)
    retried.refresh()
    assert retried.status == TaskResultStatus.READY and retried.worker_ids == ["dead-worker"]
    assert retried.errors[0].exception_class_path == "gen_durable.exceptions.LeaseExpired"
    assert retried.errors[0].exception_class.__name__ == "LeaseExpired"
    testing.drain()
    retried.refresh()
    assert retried.return_value == {"attempt": 2, "errors": 1} and retried.attempts == 2

    once = t.add.enqueue(1, 1)  # the default backend: 1 attempt, and the lost one was it
    lose(once)
    testing.drain()
    once.refresh()
    assert once.status == TaskResultStatus.FAILED and once.worker_ids == ["dead-worker"]
    assert [e.exception_class_path for e in once.errors] == ["gen_durable.exceptions.LeaseExpired"]
    assert "max_attempts (1)" in Instance.objects.get(id=int(once.id)).last_error


def test_a_task_whose_module_was_never_imported_waits_untouched_naming_tasks_py(caplog):
    """Its app missing from INSTALLED_APPS (or a worker of an older release), `shop/tasks.py`
    was never imported: the row is handed back untouched for a worker that knows it
    (docs/guide.md, "Deploying"), and the log line names both places gen_durable imports
    machines from."""
    result = t.add.enqueue(1, 2)
    Instance.objects.filter(id=int(result.id)).update(fsm="shop.tasks.send_email")
    with caplog.at_level("WARNING", "gen_durable"):
        testing.drain()
    row = Instance.objects.get(id=int(result.id))
    assert (row.status, row.attempt, row.last_error) == ("runnable", 0, None)
    assert row.unknown_since is not None
    line = next(r.getMessage() for r in caplog.records if "shop.tasks.send_email v1" in r.getMessage())
    assert "does not know that machine" in line and "handed back untouched" in line


@pytest.mark.parametrize("how, cause", [("shutdown", "WorkerShutdown"), ("reclaim", "LeaseExpired")])
def test_an_attempt_handed_back_at_shutdown_or_reclaimed_at_start_up_is_recorded_and_counts(how, cause):
    """abandon.sql (a step still running after DRAIN_TIMEOUT) and reclaim.sql (a dead
    predecessor's claims) count the attempt like the reaper; the task's attempt_log
    records it too, so TaskResult.attempts agrees with MAX_ATTEMPTS (they recorded
    nothing: a task with 1 attempt ended FAILED with no error of its own)."""
    from gen_durable.worker import claims

    retried = t.flaky.enqueue(2)  # the "retrying" backend: 3 attempts; succeeds at its 2nd
    once = t.add.enqueue(1, 1)  # the default backend: 1 attempt
    ids = [int(retried.id), int(once.id)]
    # Reclaim: each the only row of its dead worker (beside another one's, a row's first
    # crash is not charged: tests/integration/test_crash_bystanders.py).
    workers = {"shutdown": ["host-7-w1", "host-7-w1"], "reclaim": ["host-7-w1", "host-7-w2"]}[how]
    for id_, worker in zip(ids, workers):
        Instance.objects.filter(id=id_).update(status="executing", locked_by=worker,
                                               lease_expires_at=timezone.now() + dt.timedelta(seconds=60))
    if how == "shutdown":
        back = claims.abandon(ids, "host-7-w1", 2.0)
    else:
        back = claims.reclaim("default", "host-7-", 3600.0)
    assert sorted(back) == sorted(ids)
    for result, worker in zip((retried, once), workers):
        result.refresh()
        assert (result.status, result.attempts, result.worker_ids) == (TaskResultStatus.READY, 1, [worker])
        assert [e.exception_class_path for e in result.errors] == [f"gen_durable.exceptions.{cause}"]
        assert result.errors[0].exception_class.__name__ == cause and worker in result.errors[0].traceback
    assert set(Instance.objects.filter(id__in=ids).values_list("attempt", flat=True)) == {1}
    testing.drain()
    retried.refresh()
    assert retried.return_value == {"attempt": 2, "errors": 1} and retried.attempts == 2
    once.refresh()
    assert once.status == TaskResultStatus.FAILED and once.attempts == 1
    assert [e.exception_class_path for e in once.errors] == [f"gen_durable.exceptions.{cause}"]
    assert "max_attempts (1)" in Instance.objects.get(id=int(once.id)).last_error


def test_a_machine_row_handed_back_keeps_no_attempt_log():
    from gen_durable.worker import claims
    from tests.factories import ExecutingFactory

    row = ExecutingFactory(locked_by="host-8-w1")
    assert claims.abandon([row.id], "host-8-w1", 2.0) == [row.id]
    row.refresh_from_db()
    assert (row.status, row.attempt, row.attempt_log) == ("runnable", 1, None)


def test_backend_options_are_validated():
    """Invalid settings do not raise when the backend is built (the framework builds it
    while apps' tasks.py modules import, and in its system check); every use raises."""
    for params, match in [({"OPTIONS": {"MAX_ATTEMPS": 3}}, "unknown keys"),
                          ({"OPTIONS": {"MAX_ATTEMPTS": 0}}, "MAX_ATTEMPTS"),
                          ({"OPTIONS": {"BACKOFF": "no.such.function"}}, "BACKOFF"),
                          ({"OPTIONS": ["MAX_ATTEMPTS"]}, "must be a dict"),
                          ({"BACKEND": "gen_durable.tasks.GenDurableBackend", "QUEUE": ["a"]}, "unknown keys")]:
        backend = GenDurableBackend("x", params)
        assert re.search(match, backend.config_error)
        with pytest.raises(InvalidTaskBackend, match=match):
            backend.enqueue(t.add, [1, 2], {})
        with pytest.raises(InvalidTaskBackend, match=match):
            backend.get_result("1")
    assert not Instance.objects.exists()
    default = GenDurableBackend("x", {})
    assert default.config_error is None
    assert default.max_attempts == 1 and 0.75 <= default.retry_delay(1) <= 1.0
    assert 225 <= default.retry_delay(50) <= 300


def test_a_worker_runs_no_task_of_an_alias_whose_settings_turned_invalid():
    result = t.add.using(backend="retrying").enqueue(1, 2)
    bad = {**settings.TASKS, "retrying": {**settings.TASKS["retrying"], "OPTIONS": {"MAX_ATTEMPT": 3}}}
    with override_settings(TASKS=bad):
        testing.drain()
    row = Instance.objects.get(id=int(result.id))
    assert row.status == "failed" and "unknown keys ['MAX_ATTEMPT']" in row.last_error


@pytest.mark.django_db(transaction=True)
def test_enqueue_joins_the_callers_transaction(committed):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            t.add.enqueue(1, 2)
            raise RuntimeError("roll back")
    assert Instance.objects.count() == 0

    with transaction.atomic():
        result = t.add.enqueue(1, 2)
        seen = ConnectionThread(lambda: Instance.objects.filter(id=int(result.id)).exists())
        seen.start()
        assert seen.join_result() is False  # invisible to others until commit
    assert Instance.objects.filter(id=int(result.id)).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_rundurable_worker_runs_tasks_and_results_read_across_processes(committed, tmp_path):
    log = tmp_path / "order.log"
    later = timezone.now() + dt.timedelta(seconds=1.5)
    deferred = t.record.using(run_after=later).enqueue(str(log), "deferred")
    ordered = [t.record.using(priority=p).enqueue(str(log), f"p{p}") for p in (-10, 50, 0)]
    ctx = t.whoami.enqueue("sub")
    boom = t.fail.enqueue("in a subprocess")
    flaky = t.flaky.enqueue(2)
    aio = t.async_add.enqueue(20, 22)
    aio_ctx = t.async_whoami.enqueue("sub")
    proc = subprocess.run(MANAGE + ["rundurable", "--burst", "--queue", "default=1", "--no-gc", "--verbosity", "0"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = Path(log).read_text().split()
    labels = lines[0::2]
    # One step thread: larger Django priority first. The deferred one runs once due (its
    # place among them depends on how fast the worker started; its start time is checked).
    assert [x for x in labels if x != "deferred"] == ["p50", "p0", "p-10"] and "deferred" in labels
    worker_pid = int(lines[1])
    assert worker_pid != __import__("os").getpid()

    for r in (*ordered, deferred, ctx, boom, flaky, aio):
        r.refresh()
    assert [r.return_value for r in ordered] == ["p-10", "p50", "p0"]
    assert deferred.started_at >= later
    assert all(r.worker_ids and r.worker_ids[0] and not r.worker_ids[0].startswith("drain:")
               for r in (*ordered, ctx, boom, aio))
    assert ctx.return_value["attempt"] == 1 and ctx.return_value["workers"] == ctx.worker_ids
    assert boom.status == TaskResultStatus.FAILED and "in a subprocess" in boom.errors[0].traceback
    assert flaky.return_value == {"attempt": 2, "errors": 1} and flaky.attempts == 2
    assert aio.return_value == 42
    aio_ctx.refresh()
    assert aio_ctx.return_value == {"attempt": 1, "id": aio_ctx.id, "tag": "sub"}


def test_tasks_show_in_the_admin_under_their_function_path(admin_client):
    result = t.add.enqueue(2, 2)
    testing.drain()
    listing = admin_client.get("/admin/gen_durable/instance/", {"machine": "tests.durable_app.tasks.add"})
    body = listing.content.decode()
    assert listing.status_code == 200 and "?machine=tests.durable_app.tasks.add" in body
    assert f"/admin/gen_durable/instance/{result.id}/change/" in body
    detail = admin_client.get(f"/admin/gen_durable/instance/{result.id}/change/").content.decode()
    assert "tests.durable_app.tasks.add" in detail


def test_a_stale_outcome_appends_no_attempt_record():
    """The record rides the guarded flush: an outcome that lost its claim writes nothing."""
    from gen_durable.worker.claims import pick
    from gen_durable.worker.executor import execute
    from gen_durable.worker.flusher import flush

    result = t.add.enqueue(1, 2)
    [job] = pick("default", 10, "w-old", 60.0)
    entry = execute(job)
    assert entry.kind == "done" and entry.detail == "{}"
    # The lease moved to another worker meanwhile (reaped and re-claimed).
    Instance.objects.filter(id=int(result.id)).update(locked_by="w-new")
    outcome = flush([entry])
    assert outcome.stale and not outcome.committed
    row = Instance.objects.get(id=int(result.id))
    assert (row.status, row.attempt_log, row.result) == ("executing", [], None)


def test_system_checks_report_bad_backend_settings():
    assert not [e for e in run_checks() if e.id in ("gen_durable.E060", "gen_durable.E061")]
    base = {"BACKEND": "gen_durable.tasks.GenDurableBackend"}
    with override_settings(TASKS={**settings.TASKS, "extra": {**base, "QUEUES": ["unrun", "default"]}}):
        found = {e.id: e.msg for e in run_checks() if e.id.startswith("gen_durable.E06")}
    assert list(found) == ["gen_durable.E061"] and "'unrun'" in found["gen_durable.E061"]
    # On Django 6.x Django's own check builds every backend; on 5.2 the backport's does
    # with its app installed: neither raises now, and E060 reports the settings.
    for options, match in [({"MAX_ATTEMPTS": "3"}, "MAX_ATTEMPTS"),
                           ({"MAX_ATTEMPT": 3}, r"unknown keys \['MAX_ATTEMPT'\]")]:
        with override_settings(TASKS={**settings.TASKS, "broken": {**base, "OPTIONS": options}}):
            found = [e for e in run_checks() if e.id.startswith("gen_durable.E06")]
        assert [e.id for e in found] == ["gen_durable.E060"] and re.search(match, found[0].msg)


@pytest.mark.parametrize("framework_app", [False, True], ids=["gen_durable-only", "with-django_tasks-app"])
def test_manage_py_check_reports_a_misspelt_option_as_e060_without_a_traceback(tmp_path, framework_app):
    """A new user's TASKS OPTIONS {"MAX_ATTEMPT": 3}: `manage.py check` ended in an
    InvalidTaskBackend traceback (raised while importing an app's tasks.py) instead of E060."""
    from importlib.util import find_spec

    if framework_app and find_spec("django.tasks"):
        pytest.skip("Django 6.x has no framework app: its check is Django's own (the other case)")
    (tmp_path / "bad_task_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n"
        "TASKS = {**TASKS, 'default': {**TASKS['default'], 'OPTIONS': {'MAX_ATTEMPT': 3}}}  # noqa: F405\n"
        + ("INSTALLED_APPS = [*INSTALLED_APPS, 'django_tasks']  # noqa: F405\n" if framework_app else ""))
    env = dict(child_env(), DJANGO_SETTINGS_MODULE="bad_task_settings",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(MANAGE + ["check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert ("(gen_durable.E060) TASKS['default']['OPTIONS'] has unknown keys ['MAX_ATTEMPT']; "
            "valid: ['BACKOFF', 'DATABASE', 'MAX_ATTEMPTS']") in proc.stderr
    assert proc.stderr.count("gen_durable.E060") == 1


def test_a_task_whose_queue_was_removed_is_a_check_error_not_a_traceback():
    """On main every manage.py command died with a 40-line traceback out of apps.ready."""
    import json
    import subprocess

    from tests.integration.test_rundurable import MANAGE, ROOT, child_env

    env = dict(child_env(), GEN_DURABLE_TEST_SETTINGS=json.dumps({"QUEUES": {"other": 1}}))
    done = subprocess.run(MANAGE + ["check"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "(gen_durable.E100) tests.durable_app.tasks could not be imported: Task tests.durable_app.tasks." \
        in done.stderr and "queue 'default' is not in GEN_DURABLE['QUEUES']" in done.stderr, done.stderr[-3000:]
