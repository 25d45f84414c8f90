"""await_result and get: read an instance's outcome from a view (docs/guide.md).

Waiting is cheap in the waiting process: one `ResultWatcher` thread per process
LISTENs on `gen_durable_result` (the flush notifies the ids that settled) and wakes
the waiters of those ids; each waiter then re-reads its row. A notification is only
a hint — the row is the truth — and polling every POLL_FLOOR seconds is the floor
when a notification is missed or the listener is down.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from . import db, sql
from .codec import loads
from .conf import database_alias, get_settings
from .worker.listener import Listener

POLL_FLOOR = 0.25  # seconds between re-reads when no notification arrives


@dataclass(frozen=True)
class Snapshot:
    """An instance row as a read-only value (docs/guide.md)."""

    id: int
    fsm: str
    fsm_version: int
    step: str
    status: str
    state: Any
    result: Any
    last_error: str | None
    attempt: int
    queue: str
    priority: int
    correlation_key: str | None
    awaits: list | None
    parent_id: int | None
    children_pending: int
    eligible_at: dt.datetime
    inserted_at: dt.datetime
    updated_at: dt.datetime
    # The formatted traceback of the last failed attempt (bounded), beside last_error;
    # None when the error came from no exception (gd.Stop, a cancel) or none happened.
    last_traceback: str | None = None


@dataclass(frozen=True)
class Result:
    """What await_result saw: status is done | failed | awaiting | busy | not_found."""

    status: str
    result: Any = None
    error: str | None = None
    snapshot: Snapshot | None = None

    @property
    def ok(self) -> bool:
        return self.status == "done"


def target_params(target) -> dict:
    """An id (int) or a correlation key (str) → the (id, key) parameters of the SQL."""
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        from .exceptions import InvalidInput

        raise InvalidInput(f"target must be an instance id (int) or a correlation key (str), got {target!r}")
    if isinstance(target, int):
        if not -(2**63) <= target < 2**63:
            from .exceptions import InvalidInput

            raise InvalidInput(f"instance ids are 64-bit integers, got {target!r}")
        return {"id": int(target), "key": None}
    from .outcomes import text

    return {"id": None, "key": text(target, "correlation key")}


def get(target, *, using=None) -> Snapshot | None:
    """Return the instance `target` as a Snapshot, or None.

    target: an id (int) or a correlation key (str). A key finds the instance holding it
    (live, by default) or, when none does, the newest finished or failed one that had it.
    Raises InvalidInput for another type or an invalid key.

    Statements: 1. Warns `IdAsKeyWarning` when a str of digits finds nothing (an id
    read from a URL, still a str).
    """
    snap = _read(target, using)
    if snap is None:
        _digits_hint("get", target)
    return snap


def _read(target, using=None) -> Snapshot | None:
    row = db.fetchone(sql.GET, target_params(target), using)
    if row is None:
        return None
    values = list(row)
    values[5], values[6] = loads(values[5]), loads(values[6])
    return Snapshot(*values)


def _digits_hint(call: str, target) -> None:
    """Warn (at the user's line: through aget/aawait_result too) when `target`, a str that
    found nothing, is an id in ASCII digits: a str is always a correlation key."""
    if isinstance(target, str) and target.strip().isascii() and target.strip().isdecimal():
        from .calls import caller_stacklevel
        from .exceptions import IdAsKeyWarning

        warnings.warn(f"gd.{call}({target!r}) found nothing: a str target is a correlation key, and no instance "
                      f"has the key {target!r}; to address instance {target.strip()} by id pass an int: "
                      f"int({target!r})", IdAsKeyWarning,
                      stacklevel=caller_stacklevel())


_aread = sync_to_async(_read)


async def aget(target, *, using=None) -> Snapshot | None:
    """Async twin of `get`."""
    snap = await _aread(target, using)
    if snap is None:
        _digits_hint("aget", target)  # here, not in the thread: at the caller's line
    return snap


class ResultWatcher:
    """One per process and database: routes that database's `gen_durable_result`
    notifications to waiting threads. Started by the first await_result that has to
    wait on the database (an instance already settled needs none)."""

    _instances: dict = {}  # database alias -> its watcher
    _guard = threading.Lock()

    def __init__(self, using=None):
        self._lock = threading.Lock()
        self._waiters: dict[int, list[threading.Event]] = {}
        # Behind a transaction pooler (GEN_DURABLE POOLER) there is no LISTEN: waiters
        # re-read their row every POLL_FLOOR seconds.
        self.listener = None
        if get_settings().POOLER is None:
            self.listener = Listener(self._on_note, self._wake_all, using=using,
                                     channel="gen_durable_result").start()

    @classmethod
    def get(cls, using=None) -> "ResultWatcher":
        """The watcher of database `using` (an alias; None: GEN_DURABLE["DATABASE"])."""
        alias = database_alias(using)
        with cls._guard:
            watcher = cls._instances.get(alias)
            if watcher is None:
                watcher = cls._instances[alias] = cls(alias)
            return watcher

    @classmethod
    def shutdown(cls) -> None:
        """Stop the process's watchers and close their connections (a test suite's end,
        before its test database is dropped: `gen_durable.testing.stop_result_watchers`;
        a process exit does it anyway)."""
        with cls._guard:
            watchers, cls._instances = list(cls._instances.values()), {}
        for watcher in watchers:
            if watcher.listener is not None:
                watcher.listener.stop()

    def register(self, id_: int) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            self._waiters.setdefault(id_, []).append(ev)
        return ev

    def unregister(self, id_: int, ev) -> None:
        with self._lock:
            evs = self._waiters.get(id_, [])
            if ev in evs:
                evs.remove(ev)
            if not evs:
                self._waiters.pop(id_, None)

    def _on_note(self, payload: str) -> None:
        if payload == "*":
            return self._wake_all()
        with self._lock:
            for part in payload.split(","):
                try:
                    for ev in self._waiters.get(int(part), ()):
                        ev.set()
                except ValueError:
                    continue

    def _wake_all(self) -> None:
        with self._lock:
            for evs in self._waiters.values():
                for ev in evs:
                    ev.set()


def _answered(target, until: str, using) -> tuple[Snapshot | None, Result | None]:
    """(the row, and its Result when the call needs no wait: not found, or settled)."""
    snap = _read(target, using)
    if snap is None:
        return None, Result("not_found")
    return snap, _settled(snap, until)


def _settled(snap: Snapshot, until: str) -> Result | None:
    if snap.status == "done":
        return Result("done", result=snap.result, snapshot=snap)
    if snap.status == "failed":
        return Result("failed", error=snap.last_error, snapshot=snap)
    if until == "settled" and snap.status in ("awaiting_signal", "awaiting_children"):
        return Result("awaiting", snapshot=snap)
    return None


def await_result(id: int, timeout: float = 5.0, *, until: str = "settled", using=None) -> Result:
    """Wait until instance `id` settles or `timeout` seconds pass.

    Args:
        id: the instance id (int), or a correlation key (str) as `get` takes it: the live
            holder, else the newest finished or failed instance that had it.
        timeout: seconds ≥ 0.
        until: "settled" (default: done, failed, or parked awaiting a signal/children)
            or "terminal" (wait through parking).
    Returns: Result with status done (result), failed (error), awaiting (parked),
        busy (still runnable/executing at the deadline — not a failure: call again
        later, that is the retry protocol) or not_found; every result but not_found
        carries a snapshot (status, step, attempt, ...).
    Warns `IdAsKeyWarning` when a str of digits finds nothing.
    """
    result = _await_result(id, timeout, until, using)
    if result.status == "not_found":
        _digits_hint("await_result", id)
    return result


def _await_result(id, timeout, until, using) -> Result:
    from .outcomes import seconds

    timeout = seconds(timeout, "timeout")
    if until not in ("settled", "terminal"):
        from .exceptions import InvalidInput

        raise InvalidInput(f"until must be 'settled' or 'terminal', got {until!r}")
    deadline = time.monotonic() + timeout
    # A settled (or missing) instance is answered by one read, with no watcher: no
    # LISTEN connection is opened until a call has to wait.
    snap, found = _answered(id, until, using)
    if found is not None:
        return found
    if db.connection(using).in_atomic_block and _written_here(snap.id, using):
        from .exceptions import UncommittedInstance

        raise UncommittedInstance(id)
    if timeout <= 0:
        return Result("busy", snapshot=snap)
    watcher = ResultWatcher.get(using)
    watched = snap.id  # a key's holder: the notifications carry ids
    ev = watcher.register(watched)
    try:
        while True:
            ev.clear()
            # Read again once registered: a notification sent before is not lost.
            snap, found = _answered(id, until, using)
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                return Result("busy", snapshot=snap)
            ev.wait(min(left, POLL_FLOOR))
    finally:
        watcher.unregister(watched, ev)


def _written_here(id: int, using=None) -> bool:
    """Whether the caller's open transaction — or one of its savepoints (a nested
    `atomic()`) — wrote instance `id`'s current row version (`written_here.sql`). One statement."""
    row = db.fetchone(sql.WRITTEN_HERE, {"id": id}, using)
    return bool(row and row[0])


def _await_result_off_thread(id, timeout, until, using) -> Result:
    try:
        return _await_result(id, timeout, until, using)
    finally:
        # This is an executor thread, not the request thread: Django's end-of-request
        # cleanup never runs here, so release the connection as a request would
        # (CONN_MAX_AGE) instead of leaving one idle session per executor thread.
        db.connection(using).close_if_unusable_or_obsolete()


# A waiting call must not hold the shared sync thread of an async view.
_aawait_result = sync_to_async(_await_result_off_thread, thread_sensitive=False)


async def aawait_result(id: int, timeout: float = 5.0, *, until: str = "settled", using=None) -> Result:
    """Async twin of `await_result` (it waits in a thread of its own)."""
    result = await _aawait_result(id, timeout, until, using)
    if result.status == "not_found":
        _digits_hint("aawait_result", id)  # here, not in the thread: at the caller's line
    return result
