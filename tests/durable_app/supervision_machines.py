"""Machines of the supervision and fault tests (tests/faults/test_supervision.py, …);
imported by durable.py so that `rundurable` subprocesses register them too.

Each run appends "<id> <step> <attempt> <what> <pid> <monotonic time>" to the file
state["log"]: a file outlives a killed process and counts runs across processes.
"""

import os
import time

import gen_durable as gd


def record(ctx, what, step=None):
    with open(ctx.state["log"], "a") as f:
        f.write(f"{ctx.id} {step or ctx.step} {ctx.attempt} {what} {os.getpid()} {time.monotonic():.6f}\n")


class DiesInStep(gd.Job):
    """Kills its own process (os._exit) in every run while args["exit"] is true."""

    name = "tests.faults.DiesInStep"
    max_attempts = 3

    def perform(self, args, ctx):
        record(ctx, "start")
        if args.get("exit"):
            os._exit(3)
        record(ctx, "end")
        return {"attempt": ctx.attempt}


class AlwaysDies(DiesInStep):
    """DiesInStep with room for many deaths (the host gives up first)."""

    name = "tests.faults.AlwaysDies"
    max_attempts = 100


class ThreeSteps(gd.Machine):
    """Three steps, each sleeping state["sleep"] seconds between its start and end lines."""

    name = "tests.faults.ThreeSteps"

    def _run(self, ctx, nxt):
        record(ctx, "start")
        time.sleep(ctx.state.get("sleep", 0))
        record(ctx, "end")
        return gd.Next(nxt) if nxt else gd.Done({"attempt": ctx.attempt})

    @gd.step
    def start(self, ctx):
        return self._run(ctx, "second")

    @gd.step
    def second(self, ctx):
        return self._run(ctx, "third")

    @gd.step
    def third(self, ctx):
        return self._run(ctx, None)


class Sleeper(gd.Job):
    """Sleeps args["sleep"] seconds (a long step for the shutdown tests); with
    args["once"], only its first attempt sleeps."""

    name = "tests.faults.Sleeper"
    max_attempts = 5

    def perform(self, args, ctx):
        record(ctx, "start")
        if not (args.get("once") and ctx.attempt > 0):
            time.sleep(args["sleep"])
        record(ctx, "end")
        return {"attempt": ctx.attempt}


class Queries(gd.Job):
    """Runs args["queries"] small queries of about 10 kB of text each."""

    name = "tests.faults.Queries"

    def perform(self, args, ctx):
        from django.db import connection

        with connection.cursor() as cur:
            for _ in range(args.get("queries", 1)):
                cur.execute("SELECT %s::text IS NOT NULL", ["x" * 10_000])
        return {"pad": "y" * args.get("result", 0)}
