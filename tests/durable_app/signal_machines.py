"""Machines of the signal, children and await_result tests (docs/design.md#signals, docs/design.md#children).

Imported by tests/integration/test_{signals,children,await_result}.py and
tests/races/test_signal_races.py (not auto-discovered: this is not a durable.py).
"""

import threading
from collections import Counter

import gen_durable as gd


def _sig(s):
    return {"id": s.id, "name": s.name, "payload": s.payload}


class Recorder(gd.Machine):
    """Parks on state['names'] (timeout state['timeout']); records what it was woken with."""

    name = "tests.signals.Recorder"

    @gd.step
    def start(self, ctx):
        return gd.Await(ctx.state.get("names", ["go", "stop"]), next="woke",
                        timeout=ctx.state.get("timeout"))

    @gd.step
    def woke(self, ctx):
        return gd.Done({
            "awaited": [_sig(s) for s in ctx.awaited],
            "all": [_sig(s) for s in ctx.all],
            "timed_out": not ctx.awaited,
        })


class StopOnWake(gd.Machine):
    """Parks on "go", then fails (a terminal outcome of another kind)."""

    name = "tests.signals.StopOnWake"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="woke")

    @gd.step
    def woke(self, ctx):
        return gd.Stop("stopped on wake")


class Consumer(gd.Machine):
    """Waits for "go" twice with a progressing step in between (consume-by-id)."""

    name = "tests.signals.Consumer"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="first")

    @gd.step
    def first(self, ctx):
        return gd.Next("again", state={"first": [s.payload for s in ctx.awaited]})

    @gd.step
    def again(self, ctx):
        return gd.Await("go", next="second")

    @gd.step
    def second(self, ctx):
        return gd.Done({"first": ctx.state["first"], "second": [s.payload for s in ctx.awaited]})


class AwaitRetry(gd.Machine):
    """Woken by "go", retries once, then finishes with the payload."""

    name = "tests.signals.AwaitRetry"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="use")

    @gd.step
    def use(self, ctx):
        if ctx.attempt == 0:
            return gd.Retry(delay=0)
        # IndexError (→ handle → Stop) if the retry lost the awaited signal.
        return gd.Done({"v": ctx.awaited[0].payload["v"], "attempt": ctx.attempt})


class Collector(gd.Machine):
    """Accumulates a pack {a, b, c} across wakes; counts its wakes in the state."""

    name = "tests.signals.Collector"
    PACK = ["a", "b", "c"]

    @gd.step
    def start(self, ctx):
        return gd.Await(self.PACK, next="collect", state={"wakes": 0})

    @gd.step
    def collect(self, ctx):
        wakes = ctx.state["wakes"] + 1
        got = {s.name: s.payload for s in ctx.awaited}
        if set(got) >= set(self.PACK):
            return gd.Done({"sum": sum(got.values()), "count": len(got), "wakes": wakes})
        return gd.Await(self.PACK, next="collect", state={"wakes": wakes})


class HammerAwait(gd.Machine):
    """The racing-the-park machine of the hammer: park on "go", finish with its payload."""

    name = "tests.signals.HammerAwait"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="fin")

    @gd.step
    def fin(self, ctx):
        if not ctx.awaited:
            return gd.Stop("woken without its signal")
        return gd.Done({"got": ctx.awaited[0].payload})


# --- children ---------------------------------------------------------------------

JOIN_RUNS: Counter = Counter()  # parent id -> how many times its join step ran
_join_lock = threading.Lock()


def _count_join(ctx):
    with _join_lock:
        JOIN_RUNS[ctx.id] += 1


class Kid(gd.Machine):
    """A child: done with {"i": i}, or failed when state['fail']."""

    name = "tests.children.Kid"

    @gd.step
    def start(self, ctx):
        if ctx.state.get("fail"):
            return gd.Stop(f"kid {ctx.state.get('i')} failed")
        return gd.Done({"i": ctx.state.get("i")})


def _kids(ctx):
    """Child specs from ctx.state: 'kids' (one state per kid, 'key' → correlation key) in
    'kid_queue' (default: the parent's queue)."""
    queue = ctx.state.get("kid_queue") or ctx.queue
    specs = []
    for kid in ctx.state.get("kids", []):
        kw = {"state": kid, "queue": queue}
        if kid.get("key"):
            kw["correlation_key"] = kid["key"]
        specs.append(gd.Child(Kid, **kw))
    return specs


class FanOut(gd.Machine):
    """Spawns state['kids'] and joins once; reports what ctx.children showed."""

    name = "tests.children.FanOut"

    @gd.step
    def start(self, ctx):
        return gd.ScheduleChildren(next="join", children=_kids(ctx))

    @gd.step
    def join(self, ctx):
        _count_join(ctx)
        statuses = Counter(c.status for c in ctx.children)
        return gd.Done({
            "children": len(ctx.children),
            "done": statuses.get("done", 0),
            "failed": statuses.get("failed", 0),
            "errors": sorted(c.last_error for c in ctx.children if c.last_error),
            "ids": [c.id for c in ctx.children],
        })


class AwaitThenSpawn(gd.Machine):
    """Woken by "go", then fans out (for the stale ScheduleChildren test)."""

    name = "tests.children.AwaitThenSpawn"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="spawn")

    @gd.step
    def spawn(self, ctx):
        return gd.ScheduleChildren(next="join", children=_kids(ctx))

    @gd.step
    def join(self, ctx):
        return gd.Done({"children": len(ctx.children)})


class TwoRounds(gd.Machine):
    """Fans out 2 kids, then 3 more; the second join sees all 5."""

    name = "tests.children.TwoRounds"

    @gd.step
    def start(self, ctx):
        return gd.ScheduleChildren(next="again", children=[gd.Child(Kid, state={"i": i}, queue=ctx.queue) for i in range(2)])

    @gd.step
    def again(self, ctx):
        return gd.ScheduleChildren(next="join", children=[gd.Child(Kid, state={"i": i}, queue=ctx.queue) for i in range(2, 5)],
                                   state={"first_round": len(ctx.children)})

    @gd.step
    def join(self, ctx):
        return gd.Done({"first_round": ctx.state["first_round"], "children": len(ctx.children),
                        "is": sorted(c.result["i"] for c in ctx.children)})


class Mid(gd.Machine):
    """A child that fans out its own children (grandchildren of the top parent)."""

    name = "tests.children.Mid"

    @gd.step
    def start(self, ctx):
        n = ctx.state["n"]
        return gd.ScheduleChildren(next="join", children=[gd.Child(Kid, state={"i": i}, queue=ctx.queue) for i in range(n)])

    @gd.step
    def join(self, ctx):
        return gd.Done({"kids": sum(c.status == "done" for c in ctx.children)})


class Nested(gd.Machine):
    """Two Mid children with 2 and 3 grandchildren."""

    name = "tests.children.Nested"

    @gd.step
    def start(self, ctx):
        return gd.ScheduleChildren(next="join", children=[gd.Child(Mid, state={"n": n}, queue=ctx.queue) for n in (2, 3)])

    @gd.step
    def join(self, ctx):
        _count_join(ctx)
        return gd.Done({"mids": len(ctx.children),
                        "grandchildren": sum(c.result["kids"] for c in ctx.children)})
