"""The literal step names a step's source returns (gen_durable/source_steps.py, check
gen_durable.E120): the cases a real codebase has that a naive reading gets wrong."""

import functools

import gen_durable as gd
from gen_durable import checks, registry
from gen_durable.source_steps import literal_step_names


def typo_step(self, ctx):
# a comment at column 0 (and the string below) used to hide the whole function
    sql = """
SELECT 1
"""
    return gd.Next("chrage", state={"sql": sql})


def test_a_step_with_lines_at_column_0_is_read():
    [(outcome, step, filename, line)] = literal_step_names(typo_step)
    assert (outcome, step, filename.endswith("tests/unit/test_source_steps.py")) == ("Next", "chrage", True)
    assert line == typo_step.__code__.co_firstlineno + 5


@functools.lru_cache(maxsize=None)
def cached_step(self, ctx):
    return gd.Next("chrage")


def _wraps(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@_wraps
def wrapped_step(self, ctx):
    return gd.Next("chrage")


def test_a_wrapped_step_is_read_where_its_code_is():
    """An lru_cache or functools.wraps wrapper: the step's own file and line (the check
    crashed on the first and named the decorator's file for the second)."""
    for step in (cached_step, wrapped_step):
        [(_o, name, filename, line)] = literal_step_names(step)
        assert name == "chrage" and filename == __file__
        assert line == step.__wrapped__.__code__.co_firstlineno + 2  # its decorator line, the def, the return


def shadows(self, ctx):
    from collections import namedtuple as Next  # noqa: N813

    def Await(*args, **kwargs):  # noqa: N802
        return None

    try:
        Next("Point", "x")
        Await("a", "b")
    except ValueError as ScheduleChildren:  # noqa: N806
        ScheduleChildren(next="c")
    return gd.Done()


Next = gd.Next  # module-level names that the function above shadows
Await = gd.Await
ScheduleChildren = gd.ScheduleChildren


def test_a_name_the_step_binds_itself_shadows_the_modules():
    assert literal_step_names(shadows) == []


def generic_handle(self, error, ctx):
    if "compensate" in type(self).steps:  # only where such a step exists
        return gd.Next("compensate")
    return gd.Stop(str(error))


def test_a_function_that_reads_its_machines_steps_is_left_alone():
    assert literal_step_names(generic_handle) == []




# --- the signal names a machine awaits (gd.signal's UnawaitedSignalWarning) ----------

from gen_durable.source_steps import awaited_signal_names  # noqa: E402


class Literal(gd.Machine):
    initial = "wait"

    @gd.step
    def wait(self, ctx):
        return gd.Await("confirmed", next="pay", timeout=60)

    @gd.step
    def pay(self, ctx):
        if ctx.awaited:
            return gd.Await(names=["refunded", "disputed"], next="done")
        return Await(("expired",), "done")  # the module's alias of gd.Await, positional

    @gd.step
    def done(self, ctx):
        return gd.Done()


class Dynamic(gd.Machine):
    initial = "wait"

    @gd.step
    def wait(self, ctx):
        if ctx.state.get("first"):
            return gd.Await("confirmed", next="wait")
        return gd.Await(ctx.state["names"], next="wait")  # built at run time


class ReadsInbox(gd.Machine):
    initial = "wait"

    @gd.step
    def wait(self, ctx):
        if any(s.name == "anything" for s in ctx.all):
            return gd.Done()
        return gd.Await("confirmed", next="wait")


class ThroughAHelper(gd.Machine):
    initial = "wait"

    @gd.step
    def wait(self, ctx):
        return self.park_on("whatever")

    def park_on(self, name):
        return gd.Await(name, next="wait")


class OwnHandle(gd.Machine):
    initial = "wait"

    @gd.step
    def wait(self, ctx):
        return gd.Await("confirmed", next="wait")

    def handle(self, error, ctx):
        return gd.Await("operator_fixed", next="wait")


def test_a_machines_literal_awaits_are_its_awaited_names():
    assert awaited_signal_names(Literal) == {"confirmed", "refunded", "disputed", "expired"}
    assert awaited_signal_names(OwnHandle) == {"confirmed", "operator_fixed"}  # its handle() parks too


def test_names_that_cannot_be_known_are_none():
    """Any Await with names built at run time, a step reading the whole inbox (ctx.all),
    or no Await in the steps at all (a helper method parks): nothing can be said."""
    assert awaited_signal_names(Dynamic) is None
    assert awaited_signal_names(ReadsInbox) is None
    assert awaited_signal_names(ThroughAHelper) is None
