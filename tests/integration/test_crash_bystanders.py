"""A process that dies under several running steps (a segfault in one of them): the
start-up reclaim (sql/reclaim.sql) charges an attempt only to the row it can blame — the
dead worker's only row, or a row a worker already died under at this step (running at
the crash before too) — and tells each bystander why its attempt was not counted."""

import datetime as dt

import pytest
from django.utils import timezone

from gen_durable.models import Instance
from gen_durable.worker import claims
from tests.factories import ExecutingFactory

pytestmark = pytest.mark.django_db


def dead(worker, queue, n=1, **kw):
    return [ExecutingFactory(locked_by=worker, queue=queue, step="perform", fsm="tests.crash.Job", **kw).id
            for _ in range(n)]


def reclaim(queue):
    return claims.reclaim(queue, "host-9:", 3600.0)


def rows(ids):
    return {r.id: r for r in Instance.objects.filter(id__in=ids)}


def test_bystanders_are_not_charged_and_the_row_at_two_crashes_is(queue_name):
    w1 = f"host-9:{queue_name}:111-a"
    culprit, *bystanders = dead(w1, queue_name, 3)
    assert sorted(reclaim(queue_name)) == sorted([culprit, *bystanders])
    got = rows([culprit, *bystanders])
    assert {r.attempt for r in got.values()} == {0}  # one crash, three suspects: nobody charged
    assert all("attempt 0 not counted: 2 other step(s) ran beside it" in r.last_error for r in got.values())
    # The culprit runs again, beside a new row, and the process dies again.
    w2 = f"host-9:{queue_name}:222-b"
    Instance.objects.filter(id=culprit).update(status="executing", locked_by=w2,
                                               lease_expires_at=timezone.now() + dt.timedelta(seconds=60))
    [other] = dead(w2, queue_name)
    assert sorted(reclaim(queue_name)) == sorted([culprit, other])
    got = rows([culprit, other])
    assert (got[culprit].attempt, got[other].attempt) == (1, 0)
    assert "it was running at the crash before too, beside 1 other step(s) now" in got[culprit].last_error
    assert "not counted" in got[other].last_error


def test_negative_control_a_lone_row_is_charged_at_its_first_crash(queue_name):
    """The dead worker's only row: it crashed the process (or the host was killed), as before."""
    [alone] = dead(f"host-9:{queue_name}:333-c", queue_name)
    reclaim(queue_name)
    row = Instance.objects.get(id=alone)
    assert row.attempt == 1 and row.last_error == \
        "the worker died during step perform (attempt 0); reclaimed at start-up"
