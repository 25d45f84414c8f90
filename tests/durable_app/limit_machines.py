"""Machines of the limiter tests (imported by durable.py, so worker subprocesses have them)."""

import os
import time

from django.db import connection

import gen_durable as gd


class Gated(gd.Machine):
    """One step that marks itself running in the side table gd_test_running (id, tag,
    pid) when state["track"] is a tag, sleeps state["sleep"] seconds, and is done."""

    name = "tests.Gated"

    @gd.step
    def start(self, ctx):
        if ctx.state.get("track"):
            _tracked(ctx)
        else:
            time.sleep(ctx.state.get("sleep", 0))
        return gd.Done({})


class Transitions(gd.Machine):
    """Step "go" returns the outcome state["do"] names; "fin" is done."""

    name = "tests.Transitions"
    initial = "go"

    @gd.step
    def go(self, ctx):
        do = ctx.state["do"]
        if do == "next":
            return gd.Next("fin")
        if do == "next_rate":
            return gd.Next("fin", rate_limit=ctx.state["rate"], weight=ctx.state.get("weight", 1))
        if do == "release":
            return gd.Next("fin", concurrency_key=None)
        if do == "switch":
            return gd.Next("fin", concurrency_key=ctx.state["key"])
        if do == "await":
            return gd.Await("wake", next="fin")
        if do == "retry":
            return gd.Retry(state={**ctx.state, "do": "done"})
        if do == "stop":
            return gd.Stop("stopped")
        return gd.Done({})

    @gd.step
    def fin(self, ctx):
        return gd.Done({"fin": True})


def _tracked(ctx):
    """Mark the step running in gd_test_running for state["track"], sleep state["sleep"].
    ON CONFLICT: a re-run after a worker died mid-step replaces its row."""
    track = ctx.state.get("track")
    with connection.cursor() as cur:
        cur.execute("INSERT INTO gd_test_running (id, tag, pid) VALUES (%s, %s, %s) "
                    "ON CONFLICT (id) DO UPDATE SET tag = EXCLUDED.tag, pid = EXCLUDED.pid",
                    [ctx.id, track, os.getpid()])
    try:
        time.sleep(ctx.state.get("sleep", 0))
    finally:
        with connection.cursor() as cur:
            cur.execute("DELETE FROM gd_test_running WHERE id = %s", [ctx.id])


class KeyHopper(gd.Machine):
    """Moves between keys of one gate name: a (pdf:a|pdf:b) → b (the other key) → c (no
    key) → d ("pdf") → Await (timeout) → e → f (inline, key kept; retried once).
    Every gated step is tracked in gd_test_running under state["track"]; c is not."""

    name = "tests.KeyHopper"
    initial = "a"
    inline_execution = True

    @gd.step
    def a(self, ctx):
        _tracked(ctx)
        other = "pdf:b" if ctx.state["first"] == "pdf:a" else "pdf:a"
        return gd.Next("b", concurrency_key=other)

    @gd.step
    def b(self, ctx):
        _tracked(ctx)
        return gd.Next("c", concurrency_key=None)

    @gd.step
    def c(self, ctx):
        time.sleep(ctx.state.get("sleep", 0))
        return gd.Next("d", concurrency_key="pdf")

    @gd.step
    def d(self, ctx):
        _tracked(ctx)
        return gd.Await("wake", next="e", timeout=0.1)

    @gd.step
    def e(self, ctx):
        _tracked(ctx)
        return gd.Next("f")

    @gd.step
    def f(self, ctx):
        _tracked(ctx)
        if ctx.attempt == 0:
            return gd.Retry(delay=0.05)
        return gd.Done({})
