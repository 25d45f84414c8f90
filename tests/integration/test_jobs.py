"""Jobs through gen_durable.testing.drain (docs/guide.md, docs/design.md#backoff)."""

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.machine import MAX_BACKOFF
from gen_durable.models import Instance
from gen_durable.testing import DrainLimitExceeded, assert_done, assert_failed, drain
from tests.durable_app.durable import AlwaysRaises, Cancels, Flaky, GiveUp, KeepsFailing, double

pytestmark = pytest.mark.django_db


def test_job_returning_a_value_is_done_with_it_stored(queue_name):
    id_ = gd.insert(double, args={"n": 21}, queue=queue_name)
    tally = drain(queue=queue_name)
    assert (tally["steps"], tally["done"]) == (1, 1)
    row = assert_done(id_, {"doubled": 42})
    assert row["attempt"] == 0


def test_job_returning_error_is_retried_until_max_attempts_then_failed(queue_name):
    id_ = gd.insert(GiveUp, queue=queue_name)
    tally = drain(queue=queue_name)
    assert (tally["retry"], tally["stop"]) == (GiveUp.max_attempts - 1, 1)
    row = assert_failed(id_, "always")
    assert row["attempt"] == GiveUp.max_attempts - 1


def test_job_returning_cancel_fails_at_once(queue_name):
    id_ = gd.insert(Cancels, queue=queue_name)
    tally = drain(queue=queue_name)
    assert (tally["steps"], tally["stop"], tally["retry"]) == (1, 1, 0)
    row = assert_failed(id_, "nope")
    assert row["attempt"] == 0


def test_job_raising_is_retried_and_can_then_succeed(queue_name):
    id_ = gd.insert(Flaky, queue=queue_name)
    tally = drain(queue=queue_name)
    assert (tally["retry"], tally["done"]) == (2, 1)
    assert_done(id_, {"ok_at": 2})


def test_job_raising_every_time_fails_after_max_attempts_with_the_error(queue_name):
    id_ = gd.insert(AlwaysRaises, queue=queue_name)
    assert drain(queue=queue_name)["retry"] == AlwaysRaises.max_attempts - 1
    row = assert_failed(id_, "kaput")
    assert row["attempt"] == AlwaysRaises.max_attempts - 1


def test_retry_records_the_error_while_the_job_keeps_going(queue_name):
    id_ = gd.insert(Flaky, queue=queue_name)
    with pytest.raises(DrainLimitExceeded):
        drain(queue=queue_name, max_steps=1)
    row = Instance.objects.get(id=id_)
    assert (row.status, row.attempt) == ("runnable", 1)
    assert "flaky at attempt 0" in row.last_error


def test_default_backoff_at_a_huge_attempt_is_capped_and_jittered(queue_name):
    id_ = gd.insert(KeepsFailing, queue=queue_name)
    Instance.objects.filter(id=id_).update(attempt=2000)  # 2**2000 seconds would overflow
    tally = drain(queue=queue_name, with_scheduled=False)  # runs the one due step, not its retry
    assert (tally["steps"], tally["retry"]) == (1, 1)
    with connection.cursor() as cur:
        # The test's transaction has one now(): the flush's now() + delay minus it is the delay.
        cur.execute("SELECT status::text, attempt, extract(epoch FROM eligible_at - now())::float8 "
                    "FROM gen_durable WHERE id = %s", [id_])
        status, attempt, delay = cur.fetchone()
    assert (status, attempt) == ("runnable", 2001)
    assert 0.75 * MAX_BACKOFF <= delay <= MAX_BACKOFF == 300


def test_default_backoff_doubles_from_one_second():
    job = KeepsFailing()
    assert [job.backoff(a) for a in (0, 1, 3, 8, 9, 20, 2000)] == [1, 2, 8, 256, 300, 300, 300]
