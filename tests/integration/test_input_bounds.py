"""Every input that lands in an indexed text column, or is otherwise unbounded, is
bounded and rejected with InvalidInput naming it — at insert, insert_all, signal and
cancel, and in outcomes, where a bad value fails that one instance through handle()
and never the batch or the queue (docs/design.md#isolation)."""

import datetime as dt

import pytest

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.outcomes import MAX_NAME_LENGTH, MAX_REASON_LENGTH
from gen_durable.testing import assert_done, assert_failed, drain
from tests.durable_app.durable import Plain

pytestmark = pytest.mark.django_db

LONG = "x" * 10_000
EDGE = "y" * MAX_NAME_LENGTH


class Waits(gd.Machine):
    name = "tests.bounds.Waits"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="start")


@pytest.mark.parametrize("kwargs, field", [
    ({"concurrency_key": LONG}, "concurrency_key"),
    ({"concurrency_key": ("tenant", LONG)}, "concurrency_key"),
    ({"correlation_key": LONG}, "correlation_key"),
    ({"rate_limit": ("api", LONG)}, "rate_limit"),
    ({"queue": LONG}, "queue"),
    ({"weight": float("inf")}, "weight"),
    ({"weight": 10**400}, "weight"),
    ({"weight": float("nan")}, "weight"),
])
def test_insert_rejects_unbounded_keys_names_and_weights_naming_the_field(kwargs, field):
    with pytest.raises(gd.InvalidInput, match=field):
        gd.insert(Plain, **kwargs)
    with pytest.raises(gd.InvalidInput, match=field):
        gd.insert_all([gd.Spec(Plain), gd.Spec(Plain, **kwargs)])
    assert not Instance.objects.exists()  # nothing of the batch was written


def test_names_and_keys_at_the_limit_are_accepted_and_stored(settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {EDGE: {"allowed": 1, "period": 1}}}  # insert checks it
    id_ = gd.insert(Plain, queue=EDGE, correlation_key=EDGE, concurrency_key=EDGE, rate_limit=EDGE)
    row = Instance.objects.get(id=id_)
    assert row.queue == row.correlation_key == row.concurrency_key == EDGE


def test_signal_and_cancel_reject_unbounded_names_keys_and_reasons():
    id_ = gd.insert(Waits)
    with pytest.raises(gd.InvalidInput, match="signal name"):
        gd.signal(id_, LONG)
    with pytest.raises(gd.InvalidInput, match="dedup_key"):
        gd.signal(id_, "go", dedup_key=LONG)
    with pytest.raises(gd.InvalidInput, match="correlation key"):
        gd.signal(LONG, "go")
    with pytest.raises(gd.InvalidInput, match="cancel reason"):
        gd.cancel(id_, "r" * (10 * 1024 * 1024))
    gd.cancel(id_, "r" * MAX_REASON_LENGTH)
    assert Instance.objects.get(id=id_).last_error == "r" * MAX_REASON_LENGTH


@pytest.mark.parametrize("make, field", [
    (lambda: gd.Next("start", concurrency_key=LONG), "concurrency_key"),
    (lambda: gd.Next("start", rate_limit=("api", LONG)), "rate_limit"),
    (lambda: gd.Next("start", weight=float("inf")), "Next weight"),
    (lambda: gd.Await(LONG, next="start"), "Await signal name"),
    (lambda: gd.Await(["ok", LONG], next="start"), "Await signal name"),
    (lambda: gd.Stop("s" * (MAX_REASON_LENGTH + 1)), "Stop reason"),
    (lambda: gd.Error("e" * (MAX_REASON_LENGTH + 1)), "Error reason"),
    (lambda: gd.Cancel("c" * (MAX_REASON_LENGTH + 1)), "Cancel reason"),
])
def test_outcomes_reject_unbounded_values_naming_the_field(make, field):
    with pytest.raises(gd.InvalidInput, match=field):
        make()


class PoisonsItsQueue(gd.Machine):
    """Before keys were bounded, its Next stored a key the pick's arbiter index refuses."""

    name = "tests.bounds.PoisonsItsQueue"

    @gd.step
    def start(self, ctx):
        return gd.Next("second", concurrency_key=ctx.state["key"])

    @gd.step
    def second(self, ctx):
        return gd.Done()


def test_a_bad_key_in_an_outcome_fails_that_instance_and_its_queue_keeps_running(queue_name):
    import random
    import string

    key = "".join(random.Random(1).choices(string.ascii_letters, k=10_000))  # no TOAST rescue
    bad = gd.insert(PoisonsItsQueue, state={"key": key}, queue=queue_name)
    good = gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(20)])
    drain(queue_name)
    row = assert_failed(bad, "concurrency_key")
    assert "limit is 255" in row["last_error"]
    for id_ in good:
        assert_done(id_)


def test_deeply_nested_state_is_a_serialization_error_naming_the_state():
    deep = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(gd.SerializationError, match="state of .*nested too deeply"):
        gd.insert(Plain, state={"d": deep})


@pytest.mark.parametrize("when", [
    dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),      # year 0 in UTC
    dt.datetime(9999, 12, 31, 23, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5))),  # year 10000
])
def test_datetimes_postgres_stores_but_python_cannot_read_back_are_rejected_at_insert(when):
    with pytest.raises(gd.InvalidInput, match="eligible_at"):
        gd.insert(Plain, eligible_at=when)
    with pytest.raises(gd.InvalidInput, match="schedule_at"):
        gd.insert_all([gd.Spec(Plain, schedule_at=when)])
    assert not Instance.objects.exists()


def test_the_earliest_and_latest_readable_instants_are_accepted():
    utc = dt.timezone.utc
    for when in (dt.datetime(1, 1, 1, tzinfo=utc), dt.datetime(9999, 12, 31, tzinfo=utc)):
        id_ = gd.insert(Plain, eligible_at=when)
        assert gd.get(id_).eligible_at == when


@pytest.mark.django_db
def test_an_unencodable_job_input_is_called_args_as_insert_named_it(queue_name):
    from tests.durable_app.durable import SendsMail

    with pytest.raises(gd.SerializationError, match=r"^args of tests\.SendsMail is not JSON-serialisable at \['to'\]"):
        gd.insert(SendsMail, args={"to": object()}, queue=queue_name)
    with pytest.raises(gd.SerializationError, match=r"^item 0 of insert_all: args of tests\.SendsMail"):
        gd.insert_all([gd.Spec(SendsMail, args={"to": object()}, queue=queue_name)])
