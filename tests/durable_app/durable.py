"""Machines the test suite runs; imported by autodiscovery (gen_durable.apps.ready)."""

import gen_durable as gd


class Counter(gd.Machine):
    """Counts to state['target'] one step at a time."""

    name = "tests.Counter"

    @gd.step
    def start(self, ctx):
        n = ctx.state.get("n", 0) + 1
        if n >= ctx.state.get("target", 3):
            return gd.Done({"count": n})
        return gd.Next("start", state={**ctx.state, "n": n})


class Plain(gd.Machine):
    name = "tests.Plain"

    @gd.step
    def start(self, ctx):
        return gd.Done({})


@gd.job(name="tests.noop")
def noop(args):
    return None


# --- machines for the engine tests (tests/integration/test_outcomes.py, test_jobs.py,
# --- tests/races/*) -------------------------------------------------------------------

import os  # noqa: E402
import time  # noqa: E402


class Flow(gd.Machine):
    """Three named steps; the flush-level tests build its outcomes by hand."""

    name = "tests.Flow"

    @gd.step
    def start(self, ctx):
        return gd.Next("second")

    @gd.step
    def second(self, ctx):
        return gd.Next("third")

    @gd.step
    def third(self, ctx):
        return gd.Done(ctx.state)


class Handled(gd.Machine):
    """Its step raises; handle() reports what it was given as the result."""

    name = "tests.Handled"

    @gd.step
    def start(self, ctx):
        raise ValueError("step boom")

    def handle(self, error, ctx):
        return gd.Done({"error": repr(error), "awaited": len(ctx.awaited), "all": len(ctx.all)})


class HandleRaises(gd.Machine):
    """Its step raises and so does its handle()."""

    name = "tests.HandleRaises"

    @gd.step
    def start(self, ctx):
        raise ValueError("step boom")

    def handle(self, error, ctx):
        raise RuntimeError("handle boom")


class BadReturn(gd.Machine):
    """Its step returns a value that is not an outcome; handle() describes the error."""

    name = "tests.BadReturn"

    @gd.step
    def start(self, ctx):
        return 42

    def handle(self, error, ctx):
        return gd.Stop(f"handled {type(error).__name__} (TypeError: {isinstance(error, TypeError)}): {error}")


class BadResult(gd.Machine):
    """Returns a result JSON cannot encode."""

    name = "tests.BadResult"

    @gd.step
    def start(self, ctx):
        return gd.Done({"oops": object()})


@gd.job(name="tests.double")
def double(args):
    return {"doubled": args["n"] * 2}


class GiveUp(gd.Job):
    """Always returns gd.Error: retried until max_attempts, then failed."""

    name = "tests.GiveUp"
    max_attempts = 3

    def perform(self, args, ctx):
        return gd.Error("always")

    def backoff(self, attempt):
        return 0


class Cancels(gd.Job):
    name = "tests.Cancels"

    def perform(self, args, ctx):
        return gd.Cancel("nope")


class Flaky(gd.Job):
    """Raises on its first two attempts, then succeeds."""

    name = "tests.Flaky"
    max_attempts = 5

    def perform(self, args, ctx):
        if ctx.attempt < 2:
            raise ValueError(f"flaky at attempt {ctx.attempt}")
        return {"ok_at": ctx.attempt}

    def backoff(self, attempt):
        return 0


class AlwaysRaises(gd.Job):
    name = "tests.AlwaysRaises"
    max_attempts = 3

    def perform(self, args, ctx):
        raise ValueError("kaput")

    def backoff(self, attempt):
        return 0


class KeepsFailing(gd.Job):
    """Default backoff, practically unlimited attempts (the backoff-cap test)."""

    name = "tests.KeepsFailing"
    max_attempts = 10**6

    def perform(self, args, ctx):
        return gd.Error("again")


class Recorder(gd.Machine):
    """Appends "<id> <attempt> start|end <pid>" lines to the file state["log"].

    The first run of an instance (no earlier start line for its id) sleeps
    state["sleep"] seconds between start and end — cut short once the file
    state["hold"], when given, is gone; re-runs do not sleep. A file works across
    processes and survives kill -9, which the row's state (not yet committed) does not.
    """

    name = "tests.Recorder"

    @staticmethod
    def _line(ctx, what):
        with open(ctx.state["log"], "a") as f:
            f.write(f"{ctx.id} {ctx.attempt} {what} {os.getpid()}\n")

    @gd.step
    def start(self, ctx):
        with open(ctx.state["log"], "a+") as f:
            f.seek(0)
            first = not any(line.split()[0] == str(ctx.id) for line in f if line.strip())
        self._line(ctx, "start")
        if first:
            hold = ctx.state.get("hold")
            deadline = time.monotonic() + ctx.state.get("sleep", 0)
            while time.monotonic() < deadline and (hold is None or os.path.exists(hold)):
                time.sleep(0.01)
        self._line(ctx, "end")
        return gd.Done({"attempt": ctx.attempt})


class SlowCounter(gd.Machine):
    """Counter whose every step sleeps state["sleep"] seconds (a run that lasts a while)."""

    name = "tests.SlowCounter"

    @gd.step
    def start(self, ctx):
        time.sleep(ctx.state.get("sleep", 0))
        n = ctx.state.get("n", 0) + 1
        if n >= ctx.state["target"]:
            return gd.Done({"count": n})
        return gd.Next("start", state={**ctx.state, "n": n})

from . import inline_machines  # noqa: E402,F401  (registered for worker subprocesses too)
from . import history_machines  # noqa: E402,F401
from . import async_machines  # noqa: E402,F401
from . import limit_machines  # noqa: E402,F401  (registered for worker subprocesses too)
from tests.durable_app import supervision_machines  # noqa: E402,F401  (supervision and fault tests)
from tests.durable_app import fault_machines  # noqa: E402,F401  (the fault suite's machines)
from tests.durable_app import multihost_machines  # noqa: E402,F401  (tests/faults/test_multihost.py)


@gd.job(name="tests.sleep")
def sleep_job(args):
    """Blocks args["sleep"] seconds (a long sync step); returns when it ran."""
    import time

    began = time.time()
    time.sleep(args.get("sleep", 0))
    return {"began": began, "ended": time.time()}


def _nested(depth, pad=0):
    if depth == 0:
        raise RuntimeError("smtp down" + " details" * pad)
    return _nested(depth - 1, pad)


class SendsMail(gd.Job):
    """Raises RuntimeError("smtp down") `depth` frames deep every attempt (tracebacks);
    `pad` appends " details" that many times to the message."""

    name = "tests.SendsMail"
    max_attempts = 2

    def perform(self, args, ctx):
        _nested(args.get("depth", 0), args.get("pad", 0))

    def backoff(self, attempt):
        return 0


from tests.durable_app import deploy_machines  # noqa: E402,F401  (tests/integration/test_deploys.py)


class Confirms(gd.Machine):
    """Awaits one signal named by a literal (gd.signal's UnawaitedSignalWarning)."""

    name = "tests.Confirms"
    initial = "wait"

    @gd.step
    def wait(self, ctx):
        return gd.Await("confirmed", next="ship", timeout=3600)

    @gd.step
    def ship(self, ctx):
        return gd.Done()
