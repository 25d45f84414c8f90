"""Internal: reaper and GC sweeps (docs/design.md#leases, docs/design.md#gc).

Each sweep is a function (used by tests and `Maintenance.run_once`). Several processes
may run them at once: rows are taken in id order with SKIP LOCKED, and terminal rows
are immutable, so no leader election is needed.
"""

from __future__ import annotations

import logging

import time

from django.db import reset_queries, transaction

from .. import db, sql, telemetry
from ..conf import database_alias, history_enabled
from . import connections
from .roles import FailureLog, Role

logger = logging.getLogger("gen_durable.maintenance")

REAP_BATCH = 1000


def reap(using=None, limiter=None) -> list[int]:
    """Return every expired lease to runnable (attempt + 1); return the ids. Loops by batch.

    The gate slots the reaped rows held are credited (with a transactional limiter, in
    the reap's transaction).
    """
    if limiter is None:
        from ..limiter import get_limiter

        limiter = get_limiter(using)
    reaped = []
    params = {"limit": REAP_BATCH, "history": history_enabled()}  # a lost attempt's timeline entry
    while True:
        if limiter.transactional:
            with transaction.atomic(using=database_alias(using)):
                rows = db.fetchall(sql.REAP, params, using)
                limiter.credit([limiter.slot_for(r[0], r[2], r[3], r[4]) for r in rows])
        else:
            rows = db.fetchall(sql.REAP, params, using)
            limiter.credit([limiter.slot_for(r[0], r[2], r[3], r[4]) for r in rows])
        reaped += [r[0] for r in rows]
        if len(rows) < REAP_BATCH:
            break
    if reaped:
        telemetry.emit("reaper.reaped", {"count": len(reaped)}, {})
    return reaped


def expire_awaits(using=None) -> list[int]:
    """Wake parked rows whose Await timeout passed; return the ids."""
    rows = db.fetchall(sql.EXPIRE_AWAITS, {"force": False, "limit": 100_000}, using)
    if rows:
        telemetry.emit("await.timeout", {"count": len(rows)}, {})
    return [r[0] for r in rows]


def gc(retention: float, batch: int, using=None, limiter=None) -> int:
    """Delete terminal rows older than `retention` seconds, `batch` ids per statement pair.

    A full batch is followed at once by another. A parent one of
    whose children is locked elsewhere at that moment is left for a later sweep.
    Returns rows deleted.
    """
    deleted = 0
    while True:
        # One transaction per batch: lock the batch (SKIP LOCKED), lock the children its
        # delete will rewrite (SKIP LOCKED), delete. Nothing here ever waits on a lock,
        # so no GC pass is part of a deadlock (docs/reliability.md "Deadlocks").
        with transaction.atomic(using=database_alias(using)):
            rows = db.fetchall(sql.GC_SELECT, {"retention": float(retention), "batch": batch}, using)
            ids = [r[0] for r in rows]
            parents = [r[0] for r in rows if r[1]]
            if parents:
                busy = {r[0] for r in db.fetchall(sql.GC_CHILDREN, {"ids": db.pg_array(parents)}, using)}
                ids = [i for i in ids if i not in busy]  # a child is held elsewhere: a later sweep
            if ids:
                deleted += db.execute(sql.GC_DELETE, {"ids": db.pg_array(ids)}, using)
        if len(rows) < batch:
            break
    healed = limiter.reconcile() if limiter is not None else {"buckets": 0, "gates": 0}
    if deleted or healed.get("buckets") or healed.get("gates"):
        telemetry.emit("gc.swept", {"count": deleted, "buckets": healed.get("buckets", 0),
                                    "gates": healed.get("gates", 0)}, {})
    return deleted


def gc_history(retention: float, cap: int, batch: int, after: int | None = None, using=None) -> tuple[int, int | None]:
    """Trim the timeline (gen_durable_history; docs/design.md#history): delete entries
    older than `retention` seconds, then all but the newest `cap` of each instance with
    an entry written after id `after` (None: from the oldest entry — a new GC process
    reads the whole timeline once, a batch per statement, so an instance that went over
    the cap before it started, or before MAX_PER_INSTANCE was lowered, is trimmed too).

    Bounded batches (`batch` entries read and at most `batch` deleted per statement); a
    full batch is followed at once by another. Returns (entries deleted, the `after` to
    pass next time): an instance goes over the cap only by gaining an entry, so each
    pass looks only at what was written since the previous one.
    """
    deleted = 0
    while True:
        n = db.execute(sql.HISTORY_GC_AGE, {"retention": float(retention), "batch": batch}, using)
        deleted += n
        if n < batch:
            break
    while True:
        last, seen, gone = db.fetchall(sql.HISTORY_GC_CAP, {"after": after, "batch": batch, "cap": cap}, using)[0]
        deleted += gone
        if gone >= batch:
            continue  # the same window again: its instances may have more to trim
        if last is not None:
            after = last
        if seen < batch:
            break
    if deleted:
        telemetry.emit("gc.history", {"count": deleted}, {})
    return deleted, after


class Periodic(Role):
    """A daemon thread calling `fn()` every `interval` seconds until stopped.

    The role keeps its own connection for the life of the process. A failure on a lost or
    refused connection closes it and tries again after a back-off (0.1 s doubling, never
    longer than `interval`); any other failure keeps the connection (unless it is no
    longer usable) and waits for the next tick. `last_ok` is the monotonic time at which
    the last successful call began (start-up counts as one): a lease the heartbeat
    renewed runs from the server's clock at that statement, no earlier, so a worker that
    counts its leases from `last_ok` never believes in one the reaper may already take.
    """

    def __init__(self, name, interval, fn, using=None):
        self.name, self.interval, self.fn, self.using = name, interval, fn, using
        self.last_ok = time.monotonic()
        self.failures = 0
        self.failure_log = FailureLog(logger, name)
        super().__init__(f"gd-{name}")

    def _loop(self):
        connections.bind(self.name, self.using, tag=getattr(self, "tag", None))
        wait = self.interval
        backoff = 0.1
        while not self._stop.wait(wait):
            began = time.monotonic()
            try:
                self.fn()
            except Exception as exc:
                self.failures += 1
                conn = db.connection(self.using)
                if db.is_connection_error(exc):
                    wait = min(backoff, self.interval)
                    backoff = min(backoff * 2, max(self.interval, 0.1))
                    self.failure_log.failed("%s failed on its connection (%s); reconnecting in %.1fs",
                                            self.name, str(exc).strip(), wait)
                    conn.close()
                else:
                    wait = self.interval
                    self.failure_log.failed("%s sweep failed: %s", self.name, exc)
                    if conn.connection is not None and not conn.is_usable():
                        conn.close()
            else:
                self.last_ok = began
                self.failure_log.succeeded()
                wait, backoff = self.interval, 0.1
            reset_queries()  # DEBUG keeps every query until reset
        db.connection(self.using).close()
        connections.unbind()


def reaper_sweep(using=None, limiter=None):
    reaped = reap(using, limiter)
    woken = expire_awaits(using)
    # INFO when the sweep did something; an idle worker's log stays quiet.
    logger.log(logging.INFO if reaped or woken else logging.DEBUG,
               "reaper sweep: %d leases reaped, %d await timeouts fired", len(reaped), len(woken))


def make_gc_sweep(retention, batch, limiter, using=None, history=None):
    """The GC role's tick: terminal rows past `retention`, then the timeline per
    `history` (HISTORY: RETENTION, MAX_PER_INSTANCE; None: not trimmed)."""
    cursor = {"after": None}  # the last timeline id a cap pass read (this process's)

    def sweep():
        n = gc(retention, batch, using, limiter)
        logger.log(logging.INFO if n else logging.DEBUG, "gc sweep: %d terminal rows deleted", n)
        if history:
            trimmed, cursor["after"] = gc_history(history["RETENTION"], history["MAX_PER_INSTANCE"], batch,
                                                  cursor["after"], using)
            logger.log(logging.INFO if trimmed else logging.DEBUG, "gc sweep: %d timeline entries deleted", trimmed)

    return sweep
