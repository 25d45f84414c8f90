"""Machines of the timeline tests (tests/integration/test_history.py)."""

import gen_durable as gd


class HistoryFlow(gd.Machine):
    """a → b (inline) → b raises once (handled: Retry) → b parks on "go" → c → done."""

    name = "tests.HistoryFlow"
    initial = "a"
    inline_execution = True

    @gd.step
    def a(self, ctx):
        return gd.Next("b")

    @gd.step
    def b(self, ctx):
        if ctx.attempt == 0:
            raise ValueError("flaky")
        return gd.Await(["go"], "c")

    @gd.step
    def c(self, ctx):
        return gd.Done({"signals": [s.payload for s in ctx.all]})

    def handle(self, error, ctx):
        return gd.Retry(delay=0)


class HistoryFails(gd.Machine):
    """Its one step raises: the default handle() fails the instance."""

    name = "tests.HistoryFails"

    @gd.step
    def start(self, ctx):
        raise RuntimeError("boom")
