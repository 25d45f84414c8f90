"""Machines of the timer, step-timeout and schedule tests (tests/integration/test_time*.py)."""

import threading

import gen_durable as gd

from .durable import Counter  # noqa: F401
from .signal_machines import Recorder  # noqa: F401  (parks with state["timeout"])


@gd.job(name="tests.time.RetriesOnce", backoff=lambda attempt: 1.5)
def retries_once(args, ctx):
    """Fails its first attempt; the retry waits its backoff (about 1.1-1.5 s)."""
    if ctx.attempt == 0:
        return gd.Error("first attempt fails")
    return {"attempt": ctx.attempt}


# --- step timeouts: a step blocks on GATES[state["gate"]] until the test releases it ---
GATES: dict = {}


def gate(name):
    return GATES.setdefault(name, threading.Event())


def hang(ctx):
    """Block while the attempt is listed in state["hang"] (bounded: tests release the gate)."""
    if ctx.attempt in ctx.state.get("hang", [0]):
        name = ctx.state["gates"][ctx.attempt] if "gates" in ctx.state else ctx.state["gate"]
        gate(name).wait(60)
        return True
    return False


class Hangs(gd.Machine):
    """`start` may run 0.5 s; handle() reports the StepTimeout it was given."""

    name = "tests.time.Hangs"

    @gd.step(timeout=0.5)
    def start(self, ctx):
        hang(ctx)
        return gd.Done({"late": True})

    def handle(self, error, ctx):
        if isinstance(error, gd.StepTimeout):
            return gd.Done({"timed_out": True, "step": error.step, "timeout": error.timeout})
        return gd.Stop(repr(error))


class HangsDefault(gd.Machine):
    """No timeout of its own: MAX_STEP_SECONDS applies; default handle() stops."""

    name = "tests.time.HangsDefault"

    @gd.step
    def start(self, ctx):
        hang(ctx)
        return gd.Done({"late": True})


@gd.job(name="tests.time.HangJob", timeout=0.5, max_attempts=3, backoff=lambda attempt: 0)
def hang_job(args, ctx):
    """Hangs on the attempts listed in args["hang"]; else returns its attempt."""
    hang(ctx)
    return {"attempt": ctx.attempt}


@gd.job(name="tests.time.HangJobSlow", timeout=3, max_attempts=3, backoff=lambda attempt: 0)
def hang_job_slow(args, ctx):
    """Like hang_job with a 3 s budget and one gate per attempt (args["gates"])."""
    hang(ctx)
    return {"attempt": ctx.attempt}
