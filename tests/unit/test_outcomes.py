"""Outcome values: validation and normalisation (docs/design.md#outcomes).

The outcome values as the guide names them: `Await(names, next=, timeout=)` takes seconds (int,
float or timedelta) > 0; `Done(result)` takes any JSON value (docs/guide.md), so the
original's "non-dict result is invalid" does not apply.
"""

import dataclasses
import math
from datetime import timedelta

import pytest

import gen_durable as gd
from gen_durable.outcomes import KEEP, OUTCOMES
from tests.durable_app.durable import Plain

# --- invalid values raise InvalidInput at construction --------------------------------

INVALID = [
    ("retry negative delay", lambda: gd.Retry(delay=-1)),
    ("retry negative timedelta", lambda: gd.Retry(delay=timedelta(seconds=-0.5))),
    ("retry nan delay", lambda: gd.Retry(delay=math.nan)),
    ("retry infinite delay", lambda: gd.Retry(delay=math.inf)),
    ("retry string delay", lambda: gd.Retry(delay="5")),
    ("retry bool delay", lambda: gd.Retry(delay=True)),
    ("await empty list", lambda: gd.Await([], next="go")),
    ("await empty tuple", lambda: gd.Await((), next="go")),
    ("await empty name", lambda: gd.Await("", next="go")),
    ("await one empty name in a set", lambda: gd.Await(["paid", ""], next="go")),
    ("await non-string name", lambda: gd.Await([1], next="go")),
    ("await timeout zero", lambda: gd.Await("paid", next="go", timeout=0)),
    ("await timeout zero timedelta", lambda: gd.Await("paid", next="go", timeout=timedelta(0))),
    ("await timeout negative", lambda: gd.Await("paid", next="go", timeout=-1)),
    ("await timeout string", lambda: gd.Await("paid", next="go", timeout="30")),
    ("await without next", lambda: gd.Await("paid", next="")),
    ("await next not a string", lambda: gd.Await("paid", next=None)),
    ("next weight zero", lambda: gd.Next("go", weight=0)),
    ("next weight negative", lambda: gd.Next("go", weight=-2)),
    ("next weight bool", lambda: gd.Next("go", weight=True)),
    ("next weight string", lambda: gd.Next("go", weight="1")),
    ("next weight nan", lambda: gd.Next("go", weight=math.nan)),
    ("next empty step", lambda: gd.Next("")),
    ("next step not a string", lambda: gd.Next(None)),
    ("next rate limit triple", lambda: gd.Next("go", rate_limit=("a", "b", "c"))),
    ("next rate limit empty", lambda: gd.Next("go", rate_limit="")),
    ("next rate limit int", lambda: gd.Next("go", rate_limit=5)),
    ("next concurrency key empty", lambda: gd.Next("go", concurrency_key="")),
    ("children holding a machine class", lambda: gd.ScheduleChildren(next="join", children=[Plain])),
    ("children holding a dict", lambda: gd.ScheduleChildren(next="join", children=[{"machine": Plain}])),
    ("children mixing a child and a string",
     lambda: gd.ScheduleChildren(next="join", children=[gd.Child(Plain), "Plain"])),
    ("children without next", lambda: gd.ScheduleChildren(next="", children=[gd.Child(Plain)])),
]


@pytest.mark.parametrize("build", [b for _, b in INVALID], ids=[n for n, _ in INVALID])
def test_invalid_outcome_values_are_rejected_at_construction(build):
    with pytest.raises(gd.InvalidInput):
        build()


def test_invalid_input_is_a_value_error_with_a_message_naming_the_field():
    with pytest.raises(ValueError, match="Retry delay"):
        gd.Retry(delay=-1)
    with pytest.raises(ValueError, match="Await timeout"):
        gd.Await("paid", next="go", timeout=0)
    with pytest.raises(ValueError, match="weight"):
        gd.Next("go", weight=0)


# --- normalisation ------------------------------------------------------------------------

def test_next_rate_limit_pair_becomes_name_colon_partition():
    out = gd.Next("charge", rate_limit=("stripe", 42), weight=50)
    assert (out.rate_limit, out.weight) == ("stripe:42", 50)


@pytest.mark.parametrize("given, stored", [
    (None, None),
    ("stripe", "stripe"),
    (("stripe", "tenant-7"), "stripe:tenant-7"),
    (("gate", 7), "gate:7"),
])
def test_key_shapes_normalise(given, stored):
    assert gd.Next("go", rate_limit=given).rate_limit == stored
    assert gd.Next("go", concurrency_key=given).concurrency_key == stored


def test_fractional_weight_is_accepted():
    assert gd.Next("go", rate_limit="r", weight=0.25).weight == 0.25


@pytest.mark.parametrize("given", [0.0, -0.0, -1.5, math.inf, -math.inf, math.nan])
def test_a_float_weight_outside_the_open_range_is_refused(given):
    # Float weights skip the conversion call on the common path; the range check stays.
    with pytest.raises(ValueError, match="weight"):
        gd.Next("go", weight=given)


def test_every_weight_is_stored_as_a_float():
    assert [type(gd.Next("go", rate_limit="r", weight=w).weight) for w in (1, 3, 1.0, 2.5)] == [float] * 4
    assert gd.Next("go").weight == 1.0 and gd.Next("go", rate_limit="r", weight=3).weight == 3.0


def test_await_single_name_becomes_a_one_tuple():
    assert gd.Await("paid", next="ship").names == ("paid",)


def test_await_a_list_of_names_becomes_a_tuple_in_order():
    assert gd.Await(["paid", "cancelled"], next="ship").names == ("paid", "cancelled")
    assert gd.Await(iter(["a", "b"]), next="ship").names == ("a", "b")


@pytest.mark.parametrize("given, stored", [
    (None, None),
    (30, 30.0),
    (0.5, 0.5),
    (timedelta(minutes=2), 120.0),
])
def test_await_timeout_is_seconds(given, stored):
    assert gd.Await("paid", next="ship", timeout=given).timeout == stored


@pytest.mark.parametrize("given, stored", [
    (0, 0.0),
    (2, 2.0),
    (1.5, 1.5),
    (timedelta(minutes=1), 60.0),
])
def test_retry_delay_is_seconds(given, stored):
    out = gd.Retry(delay=given)
    assert out.delay == stored and isinstance(out.delay, float)


def test_schedule_children_keeps_its_children_as_a_tuple():
    kids = [gd.Child(Plain, state={"i": 1}), gd.Spec(Plain, queue="other")]
    out = gd.ScheduleChildren(next="join", children=kids)
    assert out.children == tuple(kids)
    assert out.children[0].machine is Plain and out.children[0].kwargs == {"state": {"i": 1}}
    assert issubclass(gd.Child, gd.Spec)


def test_schedule_children_may_be_empty():
    assert gd.ScheduleChildren(next="join").children == ()


# --- KEEP: an omitted state carries the current state over ------------------------

@pytest.mark.parametrize("outcome", [
    gd.Next("go"),
    gd.Retry(),
    gd.Await("paid", next="go"),
    gd.ScheduleChildren(next="join"),
], ids=["Next", "Retry", "Await", "ScheduleChildren"])
def test_omitted_state_is_keep(outcome):
    assert outcome.state is KEEP


@pytest.mark.parametrize("outcome", [
    gd.Next("go", state={}),
    gd.Retry(state={}),
    gd.Await("paid", next="go", state={}),
    gd.ScheduleChildren(next="join", state={}),
], ids=["Next", "Retry", "Await", "ScheduleChildren"])
def test_an_explicit_empty_state_is_not_keep(outcome):
    # `{}` replaces the state; only an omitted state keeps it.
    assert outcome.state == {} and outcome.state is not KEEP


def test_keep_is_distinct_from_none_and_falsy():
    assert KEEP is not None and not KEEP and repr(KEEP) == "KEEP"
    assert gd.Next("go", state=None).state is None


def test_next_concurrency_key_keeps_by_default_and_none_releases():
    assert gd.Next("go").concurrency_key is KEEP
    assert gd.Next("go", concurrency_key=None).concurrency_key is None


def test_next_defaults():
    out = gd.Next("go")
    assert (out.rate_limit, out.weight, out.inline) == (None, 1, None)


def test_terminal_outcome_defaults():
    assert gd.Done().result is None
    assert gd.Done([1, 2]).result == [1, 2]
    assert gd.Stop().reason == "stopped"
    assert gd.Error().reason == "error"
    assert gd.Cancel().reason == "cancelled"


def test_outcomes_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        gd.Next("go").step = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        gd.Retry().delay = 5


def test_the_six_outcomes_are_the_public_ones():
    assert OUTCOMES == (gd.Next, gd.Retry, gd.Await, gd.ScheduleChildren, gd.Done, gd.Stop)


_ENGINE_SOURCE = '''
def run(step):
    try:
        step()
    except Exception as error:
        return error

def fail():
    raise LookupError("inside the engine")
'''


def _engine_frames():
    """Functions whose frames are the engine's: compiled under a file name in the package."""
    import os

    from gen_durable import outcomes

    namespace = {}
    exec(compile(_ENGINE_SOURCE, os.path.join(outcomes._PACKAGE_DIR, "worker", "engine_frames.py"), "exec"), namespace)
    return namespace["run"], namespace["fail"]


def test_a_step_traceback_starts_at_the_step_not_in_the_worker():
    from gen_durable.outcomes import format_traceback

    run, _fail = _engine_frames()

    def charge():
        try:
            {}["card"]
        except KeyError as missing:
            raise ValueError("declined") from missing

    text = format_traceback(run(charge))
    assert "engine_frames.py" not in text
    assert text.count("Traceback (most recent call last):") == 2  # the cause is kept
    lines = text.splitlines()
    assert "in charge" in lines[-3] and lines[-1] == "ValueError: declined"
    assert "The above exception was the direct cause" in text and "KeyError: 'card'" in text


def test_an_error_raised_inside_the_engine_keeps_every_frame():
    from gen_durable.outcomes import format_traceback

    run, fail = _engine_frames()
    text = format_traceback(run(fail))
    assert text.count("engine_frames.py") == 2 and "in fail" in text and "in run" in text
