"""Machines of the timer, step-timeout and schedule tests (tests/integration/test_time*.py)."""

import threading

import gen_durable as gd

from .signal_machines import Recorder  # noqa: F401  (parks with state["timeout"])


@gd.job(name="tests.time.RetriesOnce", backoff=lambda attempt: 1.5)
def retries_once(args, ctx):
    """Fails its first attempt; the retry waits its backoff (about 1.1-1.5 s)."""
    if ctx.attempt == 0:
        return gd.Error("first attempt fails")
    return {"attempt": ctx.attempt}
