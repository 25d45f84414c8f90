"""A step that raises: one log record per failed attempt on `gen_durable.worker`, the
last traceback on the row (bounded) and on the admin page, one last_error format
(docs/observability.md#failed-attempts)."""

import logging

import pytest
from django.urls import reverse

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.outcomes import MAX_REASON_LENGTH, MAX_TRACEBACK_LENGTH
from gen_durable.testing import DrainLimitExceeded, assert_failed, drain
from tests.conftest import wait_until
from tests.durable_app.durable import HandleRaises, SendsMail

pytestmark = pytest.mark.django_db


def _attempt_records(caplog, id_):
    return [r for r in caplog.records if r.name == "gen_durable.worker" and getattr(r, "gd_id", None) == id_]


def test_every_failed_attempt_is_logged_with_its_traceback_warning_then_error(queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="gen_durable.worker")
    id_ = gd.insert(SendsMail, queue=queue_name)
    drain(queue=queue_name)
    records = _attempt_records(caplog, id_)
    assert [(r.levelno, r.gd_attempt, r.gd_final) for r in records] == [
        (logging.WARNING, 0, False), (logging.ERROR, 1, True)]
    for r in records:
        assert (r.gd_machine, r.gd_step, r.gd_queue) == ("tests.SendsMail", "perform", queue_name)
        assert "RuntimeError: smtp down" in r.getMessage()
        assert r.exc_info and isinstance(r.exc_info[1], RuntimeError)
    # when it retries: SendsMail's backoff is 0 s
    assert records[0].getMessage().endswith("will retry in 0.0 s") and "failed" in records[1].getMessage()
    assert 'raise RuntimeError("smtp down"' in caplog.text  # the formatted traceback is in the log
    # ...from the step's own frame, as on the row: the worker's frames above it say nothing
    assert "gen_durable/worker/executor.py" not in caplog.text
    assert caplog.text.count("Traceback (most recent call last):") == 2


def test_last_error_has_one_format_while_retrying_and_when_failed(queue_name):
    id_ = gd.insert(SendsMail, queue=queue_name)
    with pytest.raises(DrainLimitExceeded):
        drain(queue=queue_name, max_steps=1)
    retrying = Instance.objects.get(id=id_)
    assert (retrying.status, retrying.last_error) == ("runnable", "RuntimeError: smtp down")
    drain(queue=queue_name)
    failed = assert_failed(id_, "smtp down")
    assert failed["last_error"] == "RuntimeError: smtp down"  # no longer repr(): RuntimeError('smtp down')


def test_the_row_keeps_the_last_traceback_with_file_and_line(queue_name):
    id_ = gd.insert(SendsMail, queue=queue_name, state={"depth": 2})
    drain(queue=queue_name)
    tb = Instance.objects.get(id=id_).last_traceback
    assert tb.startswith("Traceback (most recent call last):")
    assert "tests/durable_app/durable.py\", line " in tb and "in _nested" in tb
    assert tb.endswith("RuntimeError: smtp down\n")
    # It starts at the step, not in the worker that called it.
    assert tb.splitlines()[1].startswith('  File "') and "tests/durable_app/durable.py" in tb.splitlines()[1]
    assert "gen_durable/worker" not in tb
    # Code reads it without the ORM: the Snapshot of get() and await_result() carries it.
    assert gd.get(id_).last_traceback == tb
    assert gd.await_result(id_, timeout=1).snapshot.last_traceback == tb


def test_a_deep_traceback_is_cut_to_the_cap_keeping_head_and_innermost_frames(queue_name):
    id_ = gd.insert(SendsMail, queue=queue_name, state={"depth": 3, "pad": 2000})  # 16 KB message
    drain(queue=queue_name)
    row = Instance.objects.get(id=id_)
    assert len(row.last_traceback) == MAX_TRACEBACK_LENGTH
    assert row.last_traceback.startswith("Traceback (most recent call last):\n… ")
    assert "characters cut" in row.last_traceback
    assert row.last_traceback.endswith(" details\n")
    assert len(row.last_error) == MAX_REASON_LENGTH and row.last_error.startswith("RuntimeError: smtp down")


def test_a_failing_handle_stores_and_logs_its_own_traceback(queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="gen_durable.worker")
    id_ = gd.insert(HandleRaises, queue=queue_name)
    drain(queue=queue_name)
    row = assert_failed(id_, "handle() failed: RuntimeError: handle boom (while handling ValueError: step boom)")
    assert 'raise RuntimeError("handle boom")' in Instance.objects.get(id=id_).last_traceback
    [record] = _attempt_records(caplog, id_)
    assert record.levelno == logging.ERROR and row["status"] == "failed"


def test_the_traceback_rides_the_flush_update_and_cancel_clears_it(queue_name):
    id_ = gd.insert(SendsMail, queue=queue_name)
    with pytest.raises(DrainLimitExceeded):
        drain(queue=queue_name, max_steps=1)
    assert "smtp down" in Instance.objects.get(id=id_).last_traceback
    gd.cancel(id_, reason="operator gave up")
    row = Instance.objects.get(id=id_)
    assert (row.last_error, row.last_traceback) == ("operator gave up", None)


def test_the_admin_detail_page_shows_the_traceback(admin_client, queue_name):
    id_ = gd.insert(SendsMail, queue=queue_name, state={"depth": 1})
    drain(queue=queue_name)
    page = admin_client.get(reverse("admin:gen_durable_instance_change", args=[id_])).content.decode()
    assert "RuntimeError: smtp down" in page
    assert "gd-traceback" in page and "durable.py&quot;, line " in page and "in _nested" in page


@pytest.mark.django_db(transaction=True)
def test_the_worker_logs_a_failed_attempt(engine, queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="gen_durable.worker")
    id_ = gd.insert(SendsMail, queue=queue_name)
    engine({queue_name: 2})
    wait_until(lambda: Instance.objects.get(id=id_).status == "failed", what="failed")
    wait_until(lambda: len(_attempt_records(caplog, id_)) == 2, what="two records")
    assert [r.levelname for r in _attempt_records(caplog, id_)] == ["WARNING", "ERROR"]
    assert ", in perform\n" in Instance.objects.get(id=id_).last_traceback
