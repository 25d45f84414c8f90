"""Machines of the fault-injection suite (tests/faults/); imported by durable.py so that
`rundurable` subprocesses register them too.

Each run appends "<id> <attempt> <what> <pid>" to the file state["log"] (a file outlives
a killed process and counts runs across processes).
"""

import os
import time

from django.db import connection

import gen_durable as gd


def _log(ctx, what):
    with open(ctx.state["log"], "a") as f:
        f.write(f"{ctx.id} {ctx.attempt} {what} {os.getpid()}\n")


def db_body(ctx):
    """The step body: state["mode"] says what it does on its database connection.

    "lose": the first attempt terminates its own session (a lost connection);
    "data": divides by zero in SQL (a data error, every attempt);
    "query": one query, then sleeps state["sleep"] s holding the connection.
    """
    _log(ctx, "start")
    mode = ctx.state.get("mode", "query")
    with connection.cursor() as cur:
        if mode == "lose" and ctx.attempt == 0:
            cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        elif mode == "data":
            cur.execute("SELECT 1 / 0")
        else:
            cur.execute("SELECT 1")
    time.sleep(ctx.state.get("sleep", 0))
    _log(ctx, "end")
    return {"attempt": ctx.attempt}


class DbJob(gd.Job):
    """A job with two attempts: a failure handle() sees at the second is final."""

    name = "tests.faults.DbJob"
    queue = "default"
    max_attempts = 2

    def perform(self, args, ctx):
        return db_body(ctx)


class DbMachine(gd.Machine):
    """The same body as a machine (the default handle() stops on any exception)."""

    name = "tests.faults.DbMachine"

    @gd.step
    def start(self, ctx):
        return gd.Done(db_body(ctx))
