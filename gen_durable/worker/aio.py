"""Internal: the worker process's event loop for `async def` steps.

One loop per process, on one daemon thread, started on first use and shared by every
queue's scheduler. Why one and not one per queue: async steps are expected to spend
their time awaiting I/O, so a single loop multiplexes thousands of them on one thread;
a loop per queue would add threads without adding throughput (the GIL runs one at a
time anyway), and the engine's own work for an async step — outcome encoding, the
hand-off to the flusher — is short. The price: an async step that blocks (a sync
HTTP call, `time.sleep`, heavy CPU) stalls every async step of the process; do such
work in a sync step, or off the loop (`asyncio.to_thread`, `sync_to_async`).

Database access from the loop follows Django's async rules: the ORM's async API or
`sync_to_async`, whose default (`thread_sensitive=True`) runs the call on one shared
thread — so all async steps of a process use one database connection between them. The
engine's own statements for async steps (a buffered row's re-check, a continued step's
admission) run on a thread of their own instead (`engine_call`): a step whose sync call
never returns holds the shared thread, and must not hold every other async step's start.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_engine: ThreadPoolExecutor | None = None  # the engine's own thread for async steps (`engine_call`)


def get_loop() -> asyncio.AbstractEventLoop:
    """The process's step loop, started (on a daemon thread) on first use."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def run():
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            threading.Thread(target=run, name="gd-async-loop", daemon=True).start()
            ready.wait()
            _loop = loop
            asyncio.run_coroutine_threadsafe(_bind_sync_thread(), loop).result(10)
        return _loop


async def _bind_sync_thread():
    """Give the shared sync thread's engine connection the options a step thread's has
    (TCP keepalives, application_name, kept open between steps: worker/connections.py)."""
    from asgiref.sync import sync_to_async

    from . import connections

    await sync_to_async(connections.bind)("async steps", statements=False, persistent=True)


def submit(coro) -> Future:
    """Schedule `coro` on the step loop; return a concurrent Future of its result.

    `future.cancel()` cancels the task (the coroutine sees CancelledError).
    """
    return asyncio.run_coroutine_threadsafe(coro, get_loop())


def run(coro, timeout: float | None = None):
    """Run `coro` on the step loop from a thread that is not the loop's; return its result."""
    return submit(coro).result(timeout)


def _bind_engine_thread():
    from . import connections

    connections.bind("async engine", persistent=True)


def _engine_run(fn, args):
    from django.db import close_old_connections

    close_old_connections()  # a connection an earlier call broke (a server restart) is replaced
    return fn(*args)


async def engine_call(fn, *args):
    """`fn(*args)`, a short engine statement for an async step, on the engine's own thread
    (its own connection, the engine's statement options), awaited from the loop. Not on
    Django's shared sync thread, which a step's `sync_to_async` call may hold for as long
    as it runs, past the step's timeout too. Raises what `fn` raises."""
    global _engine
    with _lock:
        if _engine is None:
            _engine = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gd-async-engine",
                                         initializer=_bind_engine_thread)
        engine = _engine
    return await asyncio.get_running_loop().run_in_executor(engine, _engine_run, fn, args)


def on_loop() -> bool:
    """Whether the calling thread is the step loop's."""
    try:
        return asyncio.get_running_loop() is _loop
    except RuntimeError:
        return False


def close_sync_thread_connections(timeout: float = 5.0) -> None:
    """Close the database connections of the thread `sync_to_async` runs on, and of the
    engine's own (`engine_call`).

    Async steps reach the database through Django's shared sync thread; a stopping
    worker closes its connection there as it closes its roles' own. No-op when no
    async step ever ran in this process.
    """
    if _loop is None or _loop.is_closed():
        return
    from asgiref.sync import sync_to_async
    from django.db import connections

    async def close():
        await sync_to_async(connections.close_all)()

    run(close(), timeout)
    if _engine is not None:
        _engine.submit(connections.close_all).result(timeout)
