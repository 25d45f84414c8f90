"""Machines of the inline-continuation tests (tests/integration/test_inline.py).

Every step appends "<id> <step> <attempt> <thread ident> <pid>" to the file
state["log"], which works across processes and survives kill -9.
"""

import os
import signal
import threading
import time

import gen_durable as gd
from gen_durable.outcomes import KEEP


def record(ctx):
    if "log" in ctx.state:
        with open(ctx.state["log"], "a") as f:
            f.write(f"{ctx.id} {ctx.step} {ctx.attempt} {threading.get_ident()} {os.getpid()}\n")


def hold(path, limit=60.0):
    """Wait while the file `path` exists (a test removes it to let the step go on)."""
    deadline = time.monotonic() + limit
    while path and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


class InlineChain(gd.Machine):
    """a → b → c → done, inline. state["hold"]: a waits while that file exists;
    state["kill"]: b kills its process (SIGKILL) if that file exists, removing it first."""

    name = "tests.InlineChain"
    initial = "a"
    inline_execution = True

    @gd.step
    def a(self, ctx):
        record(ctx)
        hold(ctx.state.get("hold"))
        return gd.Next("b", state={**ctx.state, "a": True}, rate_limit=ctx.state.get("rate"))

    @gd.step
    def b(self, ctx):
        record(ctx)
        kill = ctx.state.get("kill")
        if kill and os.path.exists(kill):
            os.unlink(kill)
            os.kill(os.getpid(), signal.SIGKILL)
        return gd.Next("c")

    @gd.step
    def c(self, ctx):
        record(ctx)
        return gd.Done({"a": ctx.state.get("a"), "signals": [s.payload for s in ctx.all]})


class InlineBoundary(gd.Machine):
    """An inline machine whose a → b transition opts out (requeued); b → c is inline."""

    name = "tests.InlineBoundary"
    initial = "a"
    inline_execution = True

    @gd.step
    def a(self, ctx):
        record(ctx)
        return gd.Next("b", inline=False)

    @gd.step
    def b(self, ctx):
        record(ctx)
        return gd.Next("c")

    @gd.step
    def c(self, ctx):
        record(ctx)
        return gd.Done()


class InlineOptIn(gd.Machine):
    """Not an inline machine; one transition asks for it: a → b inline, b → c requeued."""

    name = "tests.InlineOptIn"
    initial = "a"

    @gd.step
    def a(self, ctx):
        record(ctx)
        ctx.state["mutated"] = True  # in place, not returned: the committed state is kept
        return gd.Next("b", inline=True)

    @gd.step
    def b(self, ctx):
        record(ctx)
        return gd.Next("c", state={**ctx.state, "b_saw_mutation": "mutated" in ctx.state})

    @gd.step
    def c(self, ctx):
        record(ctx)
        return gd.Done(ctx.state)


class InlineCounter(gd.Machine):
    """Counts to state["target"], inline; each step sleeps state["sleep"] seconds and
    tracks how many instances of its concurrency key run at once (ACTIVE / PEAK)."""

    name = "tests.InlineCounter"
    inline_execution = True
    lock = threading.Lock()
    ACTIVE: dict = {}
    PEAK: dict = {}

    @gd.step
    def start(self, ctx):
        record(ctx)
        tag = ctx.state.get("tag", "")
        with self.lock:
            self.ACTIVE[tag] = self.ACTIVE.get(tag, 0) + 1
            self.PEAK[tag] = max(self.PEAK.get(tag, 0), self.ACTIVE[tag])
        try:
            time.sleep(ctx.state.get("sleep", 0))
        finally:
            with self.lock:
                self.ACTIVE[tag] -= 1
        n = ctx.state.get("n", 0) + 1
        if n >= ctx.state["target"]:
            return gd.Done({"count": n})
        return gd.Next("start", state={**ctx.state, "n": n},
                       concurrency_key=ctx.state.get("switch_to", KEEP))
