"""gen_durable.testing: drain, fire_timeouts and the assertions (docs/guide.md)."""

import re

import pytest

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import (
    DrainLimitExceeded,
    assert_awaiting,
    assert_done,
    assert_failed,
    assert_status,
    drain,
    durable,
)
from tests.durable_app.durable import Counter, Flaky, GiveUp, Plain

pytestmark = pytest.mark.django_db


def statuses(queue):
    return dict(Instance.objects.filter(queue=queue).values_list("id", "status"))


def test_drain_runs_to_quiescence_and_tallies_outcome_kinds(queue_name):
    counter = gd.insert(Counter, state={"target": 3}, queue=queue_name)
    gd.insert(Flaky, queue=queue_name)
    gd.insert(GiveUp, queue=queue_name)
    tally = drain(queue=queue_name)
    # Counter: next, next, done; Flaky: retry, retry, done; GiveUp: retry, retry, stop.
    assert dict(tally) == {"steps": 9, "next": 2, "retry": 4, "done": 2, "stop": 1}
    assert_done(counter, {"count": 3})
    assert set(statuses(queue_name).values()) == {"done", "failed"}


def test_drain_without_scheduled_leaves_a_future_row_for_a_later_drain(queue_name):
    id_ = gd.insert(Plain, queue=queue_name, schedule_in=60)
    assert drain(queue=queue_name, with_scheduled=False)["steps"] == 0
    assert_status(id_, "runnable")
    assert dict(drain(queue=queue_name)) == {"steps": 1, "done": 1}
    assert_done(id_)


def test_drain_of_one_queue_leaves_other_queues_alone(queue_name):
    a = gd.insert(Plain, queue=queue_name + "-a")
    b = gd.insert(Plain, queue=queue_name + "-b")
    assert drain(queue=queue_name + "-a")["done"] == 1
    assert_done(a)
    assert_status(b, "runnable")


def test_drain_past_max_steps_raises_and_leaves_nothing_claimed(queue_name):
    # Pick order (priority) differs from id order: the rows left unrun must still be released.
    ids = [gd.insert(Counter, state={"target": 50}, queue=queue_name, priority=p) for p in (2, 1, 0)]
    with pytest.raises(DrainLimitExceeded, match="max_steps=1"):
        drain(queue=queue_name, max_steps=1)
    assert statuses(queue_name) == {i: "runnable" for i in ids}
    assert Instance.objects.get(id=ids[2]).state == {"target": 50, "n": 1}  # the one step that ran


def test_drain_max_steps_counts_across_rounds(queue_name):
    gd.insert(Counter, state={"target": 50}, queue=queue_name)
    with pytest.raises(DrainLimitExceeded):
        drain(queue=queue_name, max_steps=5)
    (row,) = Instance.objects.filter(queue=queue_name)
    assert (row.status, row.state["n"]) == ("runnable", 5)


def test_assert_status_names_step_attempt_and_last_error(queue_name):
    id_ = gd.insert(GiveUp, queue=queue_name)
    drain(queue=queue_name)
    with pytest.raises(AssertionError) as info:
        assert_status(id_, "done")
    text = str(info.value)
    assert "expected done" in text and "status=failed" in text and "step=perform" in text
    assert "attempt=2" in text and "always" in text


def test_assertions_on_a_missing_instance_say_so():
    with pytest.raises(AssertionError, match="no gen_durable instance"):
        assert_done(-1)
    with pytest.raises(AssertionError, match="no gen_durable instance 'no-such-key'"):
        assert_failed("no-such-key")
    assert durable(-1) is None


def test_assert_done_compares_the_result(queue_name):
    id_ = gd.insert(Counter, state={"target": 2}, queue=queue_name)
    drain(queue=queue_name)
    assert assert_done(id_, {"count": 2})["status"] == "done"
    with pytest.raises(AssertionError, match=r"result \{'count': 2\} != \{'count': 3\}"):
        assert_done(id_, {"count": 3})


def test_assert_failed_matches_a_substring_or_a_regex(queue_name):
    id_ = gd.insert(GiveUp, queue=queue_name)
    drain(queue=queue_name)
    assert_failed(id_)
    assert_failed(id_, "alw")
    assert_failed(id_, re.compile(r"^al+ways$"))
    with pytest.raises(AssertionError, match="does not match"):
        assert_failed(id_, "sometimes")
    with pytest.raises(AssertionError, match="expected failed"):
        assert_failed(gd.insert(Plain, queue=queue_name))


def test_assert_awaiting_checks_status_and_a_subset_of_names(queue_name):
    row = Instance.objects.create(fsm="tests.Plain", step="start", status="awaiting_signal",
                                  awaits=["go", "stop"], queue=queue_name)
    assert_awaiting(row.id, "go")
    assert_awaiting(row.id, ["stop", "go"])
    with pytest.raises(AssertionError, match=r"not \['later'\]"):
        assert_awaiting(row.id, ["go", "later"])
    with pytest.raises(AssertionError, match="expected awaiting_signal"):
        assert_awaiting(gd.insert(Plain, queue=queue_name), "go")


def test_a_string_target_is_the_latest_row_with_that_correlation_key(queue_name):
    key = f"order:{queue_name}"
    first = gd.insert(Plain, queue=queue_name, correlation_key=key)
    drain(queue=queue_name)
    second = gd.insert(Plain, queue=queue_name, correlation_key=key)  # the key is free again
    assert durable(key)["id"] == second
    assert_status(key, "runnable")
    drain(queue=queue_name)
    assert_done(key, {})
    assert durable(first)["status"] == "done"
    assert set(durable(key)) == {"id", "fsm", "step", "status", "state", "result", "last_error",
                                 "attempt", "awaits", "queue"}
