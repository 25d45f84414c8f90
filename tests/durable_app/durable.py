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
