"""Buffered inserts for high-rate producers: `Producer`, `insert_async`, `flush_async`.

A call validates its arguments at once (bad input raises in the caller, as `insert`
does), queues the row and returns without touching the database. A background thread
writes the queue with `insert_all` — one statement per batch of up to `max_batch`
rows, at most `max_delay` seconds after the first row of a batch was queued — on its
own connection, in autocommit.

So, unlike `insert`, the caller's transaction is NOT joined: a row may be inserted
before the caller commits, and is inserted even when the caller rolls back. Call
`insert_async` from `transaction.on_commit(...)` when the row must follow the caller's
commit. A queued row is durable only once its batch is written: `flush()` waits for
that, and every live producer is flushed when the process exits normally (atexit);
a killed process loses what it had queued.

Failures never reach the caller: a batch that cannot be written is logged and handed
to `on_error(error, specs)` (one call per failed batch, `specs` the `gd.Spec` values
as queued; a batch a bad row breaks is retried row by row, so only that row is
reported). Correlation-key duplicates are not written, as with `insert_all`; each is
reported to `on_error` as `gd.DuplicateInstance`.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref

from django.db import DatabaseError, InterfaceError, OperationalError

from . import telemetry
from .calls import Batch, build_row, insert_rows
from .conf import database_alias, get_settings, routed_alias
from .exceptions import DuplicateInstance, InvalidInput
from .outcomes import Spec

logger = logging.getLogger("gen_durable.producer")

EXIT_FLUSH_TIMEOUT = 30.0  # seconds the process exit waits for each producer's queue

_live: weakref.WeakSet = weakref.WeakSet()


def _positive(value, what, integer=False):
    ok = ((isinstance(value, int) if integer else isinstance(value, (int, float))) and not isinstance(value, bool)
          and math.isfinite(value))
    if not ok or value <= 0 and not (what == "max_delay" and value == 0):
        kind = "an int >= 1" if integer else "seconds >= 0"
        raise InvalidInput(f"Producer {what} must be {kind}, got {value!r}")
    return value


class Producer:
    """A buffered, fire-and-forget inserter (see the module docstring).

    Args:
        max_batch: rows per `insert_all` statement (int >= 1).
        max_delay: seconds a queued row may wait for its batch to fill (>= 0).
        max_buffer: rows queued at most; `insert` blocks while the queue is full
            (back-pressure instead of unbounded memory), so keep it well above max_batch.
        on_error: `callable(error, specs)` for rows that were not written (called on the
            producer's thread; an exception it raises is logged and the producer goes on).
        using: database alias (default GEN_DURABLE['DATABASE']).
    Raises InvalidInput for a bad argument.
    """

    def __init__(self, *, max_batch: int = 1000, max_delay: float = 0.1, max_buffer: int = 10_000,
                 on_error=None, using: str | None = None):
        self.max_batch = _positive(max_batch, "max_batch", integer=True)
        self.max_delay = float(_positive(max_delay, "max_delay"))
        self.max_buffer = _positive(max_buffer, "max_buffer", integer=True)
        if self.max_buffer < self.max_batch:
            raise InvalidInput(f"Producer max_buffer ({max_buffer}) must be >= max_batch ({max_batch})")
        if on_error is not None and not callable(on_error):
            raise InvalidInput(f"Producer on_error must be callable(error, specs), got {on_error!r}")
        self.on_error = on_error
        self.using = using
        self.inserted = self.duplicates = self.failed = 0  # rows, since creation
        self._cond = threading.Condition()
        self._queue: list = []  # (Spec, Row)
        self._first_at = 0.0
        self._queued = 0   # rows ever queued
        self._done = 0     # rows written or reported
        self._urgent = 0   # flush() wants everything up to this count written now
        self._closed = False
        self._pid = None
        self._thread = None
        _live.add(self)

    # --- callers -----------------------------------------------------------------
    def insert(self, machine, **kwargs) -> None:
        """Queue one instance; arguments as `gd.insert` (without `using`). Returns None.

        Raises what `insert` raises for bad input (InvalidInput, SerializationError,
        UnknownMachine) — before anything is queued; never DuplicateInstance (reported
        to `on_error`). Blocks while `max_buffer` rows are queued.
        """
        if "using" in kwargs:
            raise InvalidInput("pass using= to the Producer, not to insert()")
        row = build_row(machine, **kwargs)
        with self._cond:
            if self._closed:
                raise InvalidInput("this Producer is closed")
            self._ensure_thread()
            while len(self._queue) >= self.max_buffer:
                self._cond.wait()
            if not self._queue:
                self._first_at = time.monotonic()
            self._queue.append((Spec(machine, **kwargs), row))
            self._queued += 1
            if len(self._queue) >= self.max_batch or len(self._queue) == 1:
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Write everything queued so far now; wait up to `timeout` seconds (None: no
        limit). Returns True when all of it was written (or reported to on_error)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._queued
            if self._done >= target:
                return True
            self._ensure_thread()
            self._urgent = max(self._urgent, target)
            self._cond.notify_all()
            while self._done < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float | None = EXIT_FLUSH_TIMEOUT) -> bool:
        """Flush, then stop the thread; further inserts raise. Returns what flush returned."""
        ok = self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        _live.discard(self)
        return ok

    @property
    def pending(self) -> int:
        """Rows queued and not yet written."""
        with self._cond:
            return self._queued - self._done

    # --- the thread --------------------------------------------------------------
    def _ensure_thread(self):
        """Start the writer (again in a forked child, whose copy of the queue is the parent's)."""
        if self._thread is not None and self._pid == os.getpid():
            return
        if self._pid is not None and self._pid != os.getpid():
            self._queue, self._done = [], self._queued  # the parent writes its own rows
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._loop, name="gd-producer", daemon=True)
        self._thread.start()

    def _take(self):
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            deadline = self._first_at + self.max_delay
            while (len(self._queue) < self.max_batch and not self._closed
                   and self._urgent <= self._done):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = self._queue[: self.max_batch]
            del self._queue[: self.max_batch]
            if self._queue:
                self._first_at = time.monotonic()
            self._cond.notify_all()  # room for blocked callers
            return batch

    def _loop(self):
        from django.db import connections

        try:
            while True:
                batch = self._take()
                if batch is None:
                    return
                try:
                    self._write(batch)
                except BaseException as exc:  # never leave flush() waiting on a dead thread
                    logger.exception("gen_durable producer: unexpected failure writing %d rows", len(batch))
                    self._report(exc, batch)
                with self._cond:
                    self._done += len(batch)
                    self._cond.notify_all()
        finally:
            connections.close_all()

    def _write(self, batch, retry=True):
        if self.using is None and get_settings().DATABASES:
            # GEN_DURABLE['DATABASES'] may route the buffered rows to several databases:
            # one insert_all per database.
            groups: dict = {}
            for item in batch:
                groups.setdefault(database_alias(routed_alias(item[1].fsm, item[1].queue)), []).append(item)
            if len(groups) > 1:
                for part in groups.values():
                    self._write(part, retry)
                return None
        started = time.perf_counter()
        try:
            ids = insert_rows(Batch.of([row for _, row in batch]), using=self.using)
        except (OperationalError, InterfaceError) as exc:
            from django.db import connections

            connections.close_all()  # a broken connection: reconnect and try once more
            if retry:
                logger.warning("gen_durable producer: %d rows not written (%s); reconnecting", len(batch), exc)
                return self._write(batch, retry=False)
            return self._report(exc, batch)
        except DatabaseError as exc:
            if len(batch) > 1:  # one bad row must not lose its batch: write them one by one
                for item in batch:
                    self._write([item])
                return None
            return self._report(exc, batch)
        dupes = [item for item, id_ in zip(batch, ids) if id_ is None]
        with self._cond:
            self.inserted += len(batch) - len(dupes)
            self.duplicates += len(dupes)
        telemetry.emit("producer.flush", {"count": len(batch) - len(dupes), "duplicates": len(dupes),
                                          "duration": time.perf_counter() - started}, {})
        for spec, row in dupes:
            self._callback(DuplicateInstance(row.correlation_key), [spec])
        return None

    def _report(self, exc, batch):
        with self._cond:
            self.failed += len(batch)
        logger.error("gen_durable producer: %d rows were not inserted: %s", len(batch), exc)
        telemetry.emit("producer.error", {"count": len(batch)}, {"error": repr(exc)})
        self._callback(exc, [spec for spec, _ in batch])

    def _callback(self, exc, specs):
        if self.on_error is None:
            return
        try:
            self.on_error(exc, specs)
        except Exception:
            logger.exception("gen_durable producer: on_error callback failed")


_default: Producer | None = None
_default_lock = threading.Lock()


def default_producer() -> Producer:
    """The process's producer for `insert_async`, configured by GEN_DURABLE['PRODUCER']."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            cfg = get_settings().PRODUCER
            on_error = cfg.get("ON_ERROR")
            if isinstance(on_error, str):
                from django.utils.module_loading import import_string

                on_error = import_string(on_error)
            _default = Producer(max_batch=cfg["MAX_BATCH"], max_delay=cfg["MAX_DELAY"],
                                max_buffer=cfg["MAX_BUFFER"], on_error=on_error)
        return _default


def insert_async(machine, **kwargs) -> None:
    """Queue an insert on the process's producer and return at once (no id).

    Arguments as `gd.insert` (without `using`); bad input raises here. Does NOT join the
    caller's transaction; see the module docstring for durability and errors.
    """
    default_producer().insert(machine, **kwargs)


def flush_async(timeout: float | None = None) -> bool:
    """Write everything `insert_async` queued so far; True when done within `timeout` s."""
    return default_producer().flush(timeout) if _default is not None else True


@atexit.register
def _flush_at_exit():
    for producer in list(_live):
        try:
            if not producer.close(EXIT_FLUSH_TIMEOUT):
                logger.error("gen_durable producer: %d queued rows were not written before exit", producer.pending)
        except Exception:
            logger.exception("gen_durable producer: flush at exit failed")
