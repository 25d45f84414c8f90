"""Machines with `async def` steps (tests/integration/test_async_steps.py)."""

import asyncio
import os
import threading

from asgiref.sync import sync_to_async

import gen_durable as gd
from gen_durable.models import Instance


def record(ctx, what=""):
    if "log" in ctx.state:
        with open(ctx.state["log"], "a") as f:
            f.write(f"{ctx.id} {ctx.step}{what} {ctx.attempt} {threading.current_thread().name} {os.getpid()}\n")


async def ignoring_cancellation(seconds, tick=lambda: None, every=0.05):
    """Await for `seconds`, calling `tick()` each `every` s, catching every CancelledError
    (a bare `except:` around an await): a step that will not be cancelled."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick()
        try:
            await asyncio.sleep(every)
        except asyncio.CancelledError:
            pass


class AsyncSleeper(gd.Machine):
    """One async step: await asyncio.sleep(state["sleep"]) then done; logs start and end."""

    name = "tests.AsyncSleeper"

    @gd.step
    async def start(self, ctx):
        record(ctx, ":start")
        await asyncio.sleep(ctx.state.get("sleep", 0))
        record(ctx, ":end")
        return gd.Done({"slept": ctx.state.get("sleep", 0)})


class AsyncSlowCancel(gd.Machine):
    """Awaits state["sleep"] s; when cancelled, takes state["cleanup"] s to clean up
    before the CancelledError goes on (a step closing a client, say). Logs its start."""

    name = "tests.AsyncSlowCancel"

    @gd.step
    async def start(self, ctx):
        record(ctx, ":start")
        try:
            await asyncio.sleep(ctx.state.get("sleep", 60))
        except asyncio.CancelledError:
            await asyncio.sleep(ctx.state.get("cleanup", 0.3))
            raise
        return gd.Done({})


class AsyncKinds(gd.Machine):
    """Returns the outcome kind named by state["kind"] from an async step."""

    name = "tests.AsyncKinds"

    @gd.step
    async def start(self, ctx):
        await asyncio.sleep(0)
        kind = ctx.state["kind"]
        if kind == "next":
            return gd.Next("finish", state={**ctx.state, "via": "next"})
        if kind == "retry":
            if ctx.attempt == 0:
                return gd.Retry(delay=0)
            return gd.Done({"attempt": ctx.attempt})
        if kind == "await":
            return gd.Await("go", next="finish", state={**ctx.state, "via": "await"})
        if kind == "schedule":
            return gd.ScheduleChildren(next="finish", children=[
                gd.Child(AsyncSleeper, state={"sleep": 0}, queue=ctx.queue) for _ in range(2)],
                state={**ctx.state, "via": "schedule"})
        if kind == "done":
            return gd.Done({"via": "done"})
        if kind == "stop":
            return gd.Stop("stopped from async")
        if kind == "raise":
            raise ValueError("async boom")
        if kind == "orm":  # Django's async ORM from an async step
            n = await Instance.objects.filter(id=ctx.id).acount()
            row = await sync_to_async(Instance.objects.get)(id=ctx.id)
            return gd.Done({"count": n, "status": row.status})
        return "not an outcome"

    @gd.step
    async def finish(self, ctx):
        return gd.Done({"via": ctx.state.get("via"), "awaited": [s.payload for s in ctx.awaited],
                        "children": sorted(c.status for c in ctx.children)})

    async def handle(self, error, ctx):
        await asyncio.sleep(0)
        return gd.Done({"handled": repr(error)})


class Mixed(gd.Machine):
    """sync → async → sync steps of one machine, on one queue; inline when state["inline"]."""

    name = "tests.Mixed"

    @gd.step
    def start(self, ctx):
        record(ctx)
        return gd.Next("middle", inline=ctx.state.get("inline", False))

    @gd.step
    async def middle(self, ctx):
        record(ctx)
        await asyncio.sleep(0.01)
        return gd.Next("end", inline=ctx.state.get("inline", False))

    @gd.step
    def end(self, ctx):
        record(ctx)
        return gd.Done({"threads": "ok"})


class AsyncInlineChain(gd.Machine):
    """a → b → c, async and inline; a waits while the file state["hold"] exists."""

    name = "tests.AsyncInlineChain"
    initial = "a"
    inline_execution = True

    @gd.step
    async def a(self, ctx):
        record(ctx)
        while ctx.state.get("hold") and os.path.exists(ctx.state["hold"]):
            await asyncio.sleep(0.01)
        return gd.Next("b")

    @gd.step
    async def b(self, ctx):
        record(ctx)
        return gd.Next("c")

    @gd.step
    async def c(self, ctx):
        record(ctx)
        return gd.Done()


class AsyncJob(gd.Job):
    name = "tests.AsyncJob"
    max_attempts = 2

    async def perform(self, args, ctx):
        await asyncio.sleep(0)
        if args.get("fail"):
            raise RuntimeError("async job failed")
        return {"doubled": args["x"] * 2}


@gd.job(name="tests.async_fn_job")
async def async_fn_job(args):
    await asyncio.sleep(0)
    return {"got": args["x"]}


class AsyncSlow(gd.Machine):
    """An async step with a 0.3 s timeout that awaits state["sleep"] seconds; handle()
    reports what it was given. state["own_timeout"]: the step raises TimeoutError itself."""

    name = "tests.AsyncSlow"

    @gd.step(timeout=0.3)
    async def start(self, ctx):
        if ctx.state.get("own_timeout"):
            raise TimeoutError("the step's own timeout")
        await asyncio.sleep(ctx.state.get("sleep", 5))
        return gd.Done({"finished": True})

    def handle(self, error, ctx):
        return gd.Done({"error": type(error).__name__, "timeout": getattr(error, "timeout", None)})


class AsyncStubborn(gd.Machine):
    """An async step with a 0.3 s timeout that swallows every cancellation and goes on for
    state["for"] seconds (a bare `except:` around an await); then returns Done. state
    ["block"]: instead, it blocks the loop that long without awaiting (time.sleep)."""

    name = "tests.AsyncStubborn"

    @gd.step(timeout=0.3)
    async def start(self, ctx):
        import time

        if ctx.state.get("block"):
            time.sleep(ctx.state["for"])
        else:
            await ignoring_cancellation(ctx.state["for"])
        return gd.Done({"finished": True})

    async def handle(self, error, ctx):
        await ignoring_cancellation(ctx.state.get("handle_for", 0))  # state["handle_for"]: it swallows too
        return gd.Done({"error": type(error).__name__, "message": str(error)})


class AsyncTicker(gd.Machine):
    """Swallows its cancellation at its 0.3 s timeout and goes on writing ctx.state["ticks"]
    for 2 s; its handle() awaits a little and returns the state it was given: it must be
    the committed one, not the one the abandoned step keeps writing."""

    name = "tests.AsyncTicker"
    inline_execution = True

    @gd.step(timeout=0.3)
    async def start(self, ctx):
        def tick():
            ctx.state["ticks"] = ctx.state.get("ticks", 0) + 1

        await ignoring_cancellation(2, tick, every=0.01)
        return gd.Done({"late": True})

    @gd.step
    async def after(self, ctx):
        return gd.Done({"state": ctx.state})

    async def handle(self, error, ctx):
        await asyncio.sleep(0.2)
        return gd.Next("after", state=ctx.state)


class AsyncSelfCancel(gd.Machine):
    """Awaits a helper that something else cancels (a library's own task): the step's own
    CancelledError, which is an error for handle(), not a shutdown."""

    name = "tests.AsyncSelfCancel"

    @gd.step(timeout=30)
    async def start(self, ctx):
        inner = asyncio.ensure_future(asyncio.sleep(10))
        asyncio.get_running_loop().call_later(0.05, inner.cancel)
        await inner
        return gd.Done({})

    def handle(self, error, ctx):
        return gd.Done({"handled": type(error).__name__, "message": str(error)})


HOLD_SYNC_THREAD = threading.Event()  # set to let AsyncSyncBlock's sync call return


class AsyncSyncBlock(gd.Machine):
    """An async step (timeout 0.5 s) whose sync call holds Django's shared sync thread
    until HOLD_SYNC_THREAD is set (a socket read without a timeout, say)."""

    name = "tests.AsyncSyncBlock"

    @gd.step(timeout=0.5)
    async def start(self, ctx):
        await sync_to_async(HOLD_SYNC_THREAD.wait)(60)
        return gd.Done({"finished": True})

    async def handle(self, error, ctx):  # a sync one would run on the held thread too
        return gd.Done({"error": type(error).__name__})


class AsyncSyncBlockSyncHandle(AsyncSyncBlock):
    """AsyncSyncBlock with a sync handle(): it may use the ORM, so it runs on Django's
    shared sync thread, which the timed-out step's call still holds."""

    name = "tests.AsyncSyncBlockSyncHandle"

    def handle(self, error, ctx):
        return gd.Done({"error": type(error).__name__})


class AsyncRaisesSyncHandle(gd.Machine):
    """An async step (timeout 0.3 s) that raises at once; its sync handle() sleeps
    state["handle_sleep"] seconds, then returns Done."""

    name = "tests.AsyncRaisesSyncHandle"

    @gd.step(timeout=0.3)
    async def start(self, ctx):
        raise RuntimeError("boom")

    def handle(self, error, ctx):
        import time

        time.sleep(ctx.state["handle_sleep"])
        return gd.Done({"handled": type(error).__name__})


class AsyncSlowJob(gd.Job):
    name = "tests.AsyncSlowJob"
    timeout = 0.3
    max_attempts = 2

    async def perform(self, args, ctx):
        if ctx.attempt == 0:
            await asyncio.sleep(5)
        return {"attempt": ctx.attempt}


class AsyncAppName(gd.Machine):
    """Returns the application_name of the connection async steps reach the database on."""

    name = "tests.AsyncAppName"

    @gd.step
    async def start(self, ctx):
        from django.db import connection

        def read():
            with connection.cursor() as cur:
                cur.execute("SELECT current_setting('application_name')")
                return cur.fetchone()[0]

        return gd.Done({"application_name": await sync_to_async(read)()})


ASYNC_GATE = threading.Event()
ASYNC_RAN: list = []


class AsyncBlocker(gd.Machine):
    """state["block"]: wait (without blocking the loop) until ASYNC_GATE is set; otherwise
    record the id in ASYNC_RAN. Then done."""

    name = "tests.AsyncBlocker"

    @gd.step
    async def start(self, ctx):
        if ctx.state.get("block"):
            for _ in range(3000):
                if ASYNC_GATE.is_set():
                    break
                await asyncio.sleep(0.01)
        else:
            ASYNC_RAN.append(ctx.id)
        return gd.Done()


ASYNC_B_STARTED: list = []


class AsyncChainGate(gd.Machine):
    """a → b, async and inline; b records its id in ASYNC_B_STARTED and waits (without
    blocking the loop) until ASYNC_GATE is set."""

    name = "tests.AsyncChainGate"
    initial = "a"
    inline_execution = True

    @gd.step
    async def a(self, ctx):
        return gd.Next("b")

    @gd.step
    async def b(self, ctx):
        ASYNC_B_STARTED.append(ctx.id)
        for _ in range(3000):
            if ASYNC_GATE.is_set():
                break
            await asyncio.sleep(0.01)
        return gd.Done()


class AsyncOnlyQueueSleeper(gd.Machine):
    """The one machine of queue "aio" (all its steps async): awaits state["sleep"] s and
    returns when it started and ended (time.time()), so a test can count the overlap."""

    name = "tests.AsyncOnlyQueueSleeper"
    queue = "aio"

    @gd.step
    async def start(self, ctx):
        import time

        began = time.time()
        await asyncio.sleep(ctx.state.get("sleep", 0))
        return gd.Done({"began": began, "ended": time.time()})
