"""Internal: group commit of step outcomes (docs/design.md#outcomes, docs/design.md#decisions).

`flush(entries)` applies a batch in ONE transaction with a bounded number of
statements: flush.sql (every transition, consume and purge riders) and, only when the
batch needs them, park_recheck.sql (Await), insert_all.sql + spawn_park.sql
(ScheduleChildren) and join_parents.sql (terminal children). A plain batch of Next
outcomes is one statement whatever its size.

`Flusher` is the thread that workers hand entries to. It flushes at once when nothing
is in flight; entries that arrive during a flush form the next batch (group commit).
It lingers up to FLUSH['MAX_DELAY'] only while other steps are still running and the
batch is below MAX_BATCH — so an idle worker pays no added latency.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field

from django.db import DatabaseError, reset_queries

from .. import db, sql, telemetry
from ..calls import Batch, insert_rows
from .claims import load_inputs
from ..codec import clean_text
from ..conf import get_settings
from . import connections

logger = logging.getLogger("gen_durable.flusher")

UNSTORABLE = "outcome could not be stored"
DEFER_DELAY = 0.5  # seconds before an outcome blocked by another session's lock is tried again
# The rows of a batch nobody else has locked right now (the lock goes at once: autocommit).
_FREE_ROWS = "SELECT id FROM gen_durable WHERE id = ANY (%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED"
NO_INPUTS = ((), ())  # (inbox, children) of a continued row that has neither
COMMIT_TIMEOUT = 30.0  # seconds a worker waits for its flush (the lease is the real floor)


@dataclass
class FlushResult:
    committed: dict = field(default_factory=dict)  # id -> new status
    stale: list = field(default_factory=list)      # entries that failed the ownership guard
    woken: set = field(default_factory=set)        # queues with rows made runnable by riders


def _arrays(entries):
    """flush.sql's parameters: one array literal per column (db.pg_array)."""
    arr = db.pg_array
    return {
        "id": arr([e.id for e in entries]), "worker": arr([e.worker for e in entries]),
        "kind": arr([e.kind for e in entries]), "step": arr([e.step for e in entries]),
        "state": arr([e.state for e in entries]), "result": arr([e.result for e in entries]),
        "error": arr([e.error for e in entries]), "delay": arr([e.delay for e in entries]),
        "awaits": arr([e.awaits for e in entries]), "timeout": arr([e.timeout for e in entries]),
        "set_key": arr([e.set_key for e in entries]), "new_key": arr([e.new_key for e in entries]),
        "rate_limit": arr([e.rate_limit for e in entries]), "weight": arr([e.weight for e in entries]),
        "detail": arr([e.detail for e in entries]),
        "c_target": arr([e.id for e in entries for _ in e.consumed]),
        "c_id": arr([sid for e in entries for sid in e.consumed]),
        "lease": float(get_settings().LEASE_TTL),
    }


def flush(entries, using=None, limiter=None) -> FlushResult:
    """Commit `entries` (len ≤ FLUSH.MAX_BATCH) in one transaction; return what committed.

    An "inline" entry (a Next continuing in the same worker) is part of the same
    statement: its row stays `executing` (committed status "executing") with the lease
    extended by LEASE_TTL and its gate slot kept.

    Statements: 1 for plain Next/Retry/Done/Stop batches; +2 when any inline entry
    commits (the inbox and children its next step starts with, set on `entry.inputs`);
    +1 when any Await parks
    (the recheck), +2 when any ScheduleChildren spawns, +1 when any terminal child
    joins its parent, +1 when a committed row held a gate slot and `limiter` is
    transactional (Postgres: the credit commits with the outcomes, so the counters
    never disagree with the executing rows; other limiters are credited after the
    commit). Raises DatabaseError when the transaction
    fails (nothing commits).
    """
    entries = sorted(entries, key=lambda e: e.id)
    result = FlushResult()
    if not entries:
        return result
    body_done = False
    try:
        with connections.engine_transaction(using):
            rows = db.fetchall(sql.FLUSH, _arrays(entries), using)
            parents = Counter()
            for id_, status, queue, parent_id in rows:
                result.committed[id_] = status
                if parent_id is not None and status in ("done", "failed"):
                    parents[parent_id] += 1
            ok = [e for e in entries if e.id in result.committed]
            if limiter is not None and limiter.transactional:
                slots = [e.slot for e in ok if e.slot is not None]
                if slots:
                    limiter.credit(slots)
            parked = [e for e in ok if e.kind == "await"]
            if parked:
                rows = db.fetchall(sql.PARK_RECHECK, {
                    "id": db.pg_array([e.id for e in parked]),
                    "p_target": db.pg_array([e.id for e in parked for _ in e.presented]),
                    "p_id": db.pg_array([sid for e in parked for sid in e.presented]),
                }, using)
                for id_, queue in rows:
                    result.committed[id_] = "runnable"
                    result.woken.add(queue)
            spawning = [e for e in ok if e.kind == "schedule"]
            if spawning:
                kids = [row for e in spawning for row in e.children]
                owners = [e.id for e in spawning for _ in e.children]
                ids = insert_rows(Batch.of(kids), parent_ids=owners, using=using)
                landed = Counter(owner for owner, id_ in zip(owners, ids) if id_ is not None)
                rows = db.fetchall(sql.SPAWN_PARK, {"id": db.pg_array([e.id for e in spawning]),
                                                    "n": db.pg_array([landed[e.id] for e in spawning])}, using)
                for id_, status, queue in rows:
                    result.committed[id_] = status
                    if status == "runnable":
                        result.woken.add(queue)
            if parents:
                ordered = sorted(parents)
                rows = db.fetchall(sql.JOIN_PARENTS, {"parent_id": db.pg_array(ordered), "n": db.pg_array([parents[p] for p in ordered])}, using)
                for id_, status, queue in rows:
                    if status == "runnable":
                        result.woken.add(queue)
            continuing = [e for e in ok if e.kind == "inline"]
            if continuing:
                # The inputs of the steps that continue inline, loaded here for the whole
                # batch (2 statements) rather than by each step thread on a connection of
                # its own: step threads of inline chains stay off the database.
                inputs = load_inputs([e.id for e in continuing], using)
                for e in continuing:
                    e.inputs = inputs.get(e.id, NO_INPUTS)
            body_done = True
    except Exception as exc:
        if body_done and db.is_connection_error(exc):
            # COMMIT was sent and no answer came: it may or may not have landed.
            raise CommitInDoubt(f"connection lost during COMMIT: {exc}") from exc
        raise
    if limiter is not None and not limiter.transactional:
        slots = [e.slot for e in entries if e.slot is not None and e.id in result.committed]
        if slots:
            try:
                limiter.credit(slots)
            except Exception:
                logger.exception("limiter credit failed; the slots come back when their leases lapse")
    result.stale = [e for e in entries if e.id not in result.committed]
    for e in result.stale:
        telemetry.emit("outcome.stale", {"count": 1}, {"id": e.id, "fsm": e.fsm, "step": e.from_step, "kind": e.kind})
    return result


class CommitInDoubt(DatabaseError):
    """The connection was lost after COMMIT was sent: the flush may have committed."""


class FlushError(Exception):
    """The flush transaction failed; the outcome was not committed (the lease recovers it)."""


class Flusher:
    """The group-commit thread of one worker process."""

    def __init__(self, *, using=None, max_batch=100, max_delay=0.005, limiter=None, on_commit=None,
                 on_failure=None, retry_window=None):
        self.using = using
        self.retry_window = retry_window  # seconds a failing flush is retried (default: LEASE_TTL)
        self.retries = 0
        self._deferred_since: dict = {}  # id -> monotonic time its outcome was first blocked
        self.max_batch = max_batch
        self.max_delay = max_delay
        self.limiter = limiter
        self.on_commit = on_commit  # callback(FlushResult, entries) after each commit, before waking workers
        self.on_failure = on_failure  # callback(entries) when a flush transaction failed
        self._cond = threading.Condition()
        self._pending: list[tuple] = []
        self._running = 0  # steps started but not yet submitted
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gd-flusher", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout=None):
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def step_started(self):
        with self._cond:
            self._running += 1

    def step_abandoned(self):
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def submit(self, entry, wait: bool = False) -> Future | None:
        """Queue `entry` for the next flush; with `wait`, return a Future of its fate."""
        fut: Future | None = Future() if wait else None
        with self._cond:
            self._running -= 1
            self._pending.append((entry, fut))
            self._cond.notify_all()
        return fut

    def commit(self, entry, timeout=COMMIT_TIMEOUT) -> str:
        """Hand `entry` to the flush and wait until it is durable: 'committed' or 'stale'.

        Raises FlushError when the flush failed or timed out.
        """
        fut = self.submit(entry, wait=True)
        try:
            return fut.result(timeout)
        except Exception as exc:
            raise FlushError(str(exc)) from exc

    def _take(self):
        with self._cond:
            while not self._pending and not self._stopping:
                self._cond.wait()
            if not self._pending:
                return None
            deadline = time.monotonic() + self.max_delay
            while (len(self._pending) < self.max_batch and self._running > 0 and not self._stopping):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = self._pending[: self.max_batch]
            del self._pending[: self.max_batch]
            return batch

    def _loop(self):
        connections.bind("flusher", self.using, tag=getattr(self, "tag", None))
        while True:
            batch = self._take()
            if batch is None:
                break
            self._flush(batch)
            reset_queries()  # DEBUG keeps every query until reset, as after a request
        self._close()
        connections.unbind()

    def _close(self):
        try:
            db.connection(self.using).close()
        except Exception:
            pass

    def _retry_window(self) -> float:
        # While a flush retries, its rows stay in flight and heartbeated; past a lease
        # the outcome is likely stale anyway, and the reaper has the rows.
        return self.retry_window if self.retry_window is not None else get_settings().LEASE_TTL

    def _flush(self, batch):
        entries = [e for e, _ in batch]
        started = time.perf_counter()
        deadline = time.monotonic() + self._retry_window()
        delay = 0.0
        while True:
            try:
                result = flush(entries, self.using, self.limiter)
                break
            except CommitInDoubt as exc:
                # Running it again could apply an outcome twice to a row our own feeder
                # claimed again meanwhile; the lease settles it instead.
                return self._fail(batch, exc, reconnect=True)
            except Exception as exc:
                if db.is_lock_timeout(exc):
                    return self._lock_timed_out(batch, exc)
                if db.is_transient_error(exc) and time.monotonic() < deadline:
                    # Nothing of this transaction reached a COMMIT: run it again on a new
                    # connection — at once the first time (a connection the server
                    # closed while idle), then with back-off (the server is away).
                    self._close()
                    self.retries += 1
                    logger.warning("flush of %d outcomes failed before COMMIT (%s); retrying %s on a new "
                                   "connection", len(entries), str(exc).strip(),
                                   "at once" if not delay else f"in {delay:.2f}s")
                    telemetry.emit("flush.retry", {"count": len(entries), "delay": delay}, {"error": repr(exc)})
                    time.sleep(delay)
                    delay = min(max(delay * 2, 0.05), 2.0)
                    continue
                if db.is_connection_error(exc):
                    return self._fail(batch, exc, reconnect=True)
                return self._unstorable(batch, exc)
        telemetry.emit("flush.stop", {"count": len(entries), "stale": len(result.stale),
                                      "duration": time.perf_counter() - started}, {})
        if self.on_commit is not None:
            try:
                self.on_commit(result, entries)
            except Exception:
                logger.exception("on_commit callback failed")
        stale = {e.id for e in result.stale}
        for entry, fut in batch:
            self._deferred_since.pop(entry.id, None)
            if fut is not None:
                fut.set_result("stale" if entry.id in stale else "committed")
        return None

    def _unstorable(self, batch, exc):
        # Not the connection: a statement of this batch failed on its data (a value
        # Postgres rejects, a unique conflict, a program limit: SQLSTATE 22, 23,
        # 54…). One bad outcome must not hold back the others of its batch, again at
        # every lease: flush them one by one, and store a failing one as a Stop.
        if len(batch) > 1:
            logger.warning("flush of %d outcomes failed (%s); retrying them one by one", len(batch), exc)
            for item in batch:
                self._flush([item])
            return None
        entry, fut = batch[0]
        if db.is_transient_error(exc):  # a deadlock or timeout says nothing about the data
            return self._fail(batch, exc, reconnect=False)
        if entry.kind == "stop" and entry.error and entry.error.startswith(UNSTORABLE):
            return self._fail(batch, exc, reconnect=False)
        stop = dataclasses.replace(
            entry, kind="stop", step=None, state=None, result=None, awaits=None, timeout=None,
            set_key=False, new_key=None, rate_limit=None, weight=1.0, consumed=(), presented=(),
            children=[], error=clean_text(f"{UNSTORABLE} ({entry.kind} of step {entry.from_step!r}): {exc}"))
        logger.error("outcome of %s#%s cannot be stored (%s); failing the instance", entry.fsm, entry.id, exc)
        return self._flush([(stop, fut)])

    def _lock_timed_out(self, batch, exc):
        """A row of the batch stayed locked by another session for LOCK_TIMEOUT.

        Find the entries whose own rows are locked now and flush the others at once; the
        blocked ones come back for a later flush (their rows stay in flight, heartbeated)
        until the retry window closes. When the lock was on another row (a parent, a
        signal), the batch is split one by one to isolate it.
        """
        entries = [e for e, _ in batch]
        try:
            ids = db.pg_array(sorted(e.id for e in entries))
            free = {r[0] for r in db.fetchall(_FREE_ROWS, {"ids": ids}, self.using)}
        except Exception as probe_exc:
            self._close()
            return self._fail(batch, probe_exc, reconnect=True)
        blocked = [item for item in batch if item[0].id not in free]
        ready = [item for item in batch if item[0].id in free]
        if blocked and ready:
            self._flush(ready)
        elif len(batch) > 1:
            for item in batch:
                self._flush([item])
            return None
        else:
            blocked = batch
        logger.warning("flush of %d outcomes waited LOCK_TIMEOUT on a row another session holds (%s); "
                       "%d outcome(s) retried later: %s", len(batch), str(exc).strip(), len(blocked),
                       ", ".join(f"{e.fsm}#{e.id}" for e, _ in blocked))
        self._defer(blocked, exc)
        return None

    def _defer(self, items, exc):
        now = time.monotonic()
        late = [it for it in items if now - self._deferred_since.setdefault(it[0].id, now) > self._retry_window()]
        keep = [it for it in items if it not in late]
        if late:
            for e, _ in late:
                self._deferred_since.pop(e.id, None)
            self._fail(late, exc, reconnect=False)
        if keep:
            timer = threading.Timer(DEFER_DELAY, self._requeue, [keep])
            timer.daemon = True
            timer.start()

    def _requeue(self, items):
        with self._cond:
            self._pending.extend(items)
            self._cond.notify_all()

    def _fail(self, batch, exc, *, reconnect):
        """Nothing of `batch` committed: the rows stay executing until their leases lapse."""
        entries = [e for e, _ in batch]
        logger.error("flush of %d outcomes failed: %s", len(entries), exc)
        telemetry.emit("flush.error", {"count": len(entries)}, {"error": repr(exc)})
        if reconnect:
            self._close()  # reconnect on the next flush
        if self.on_failure is not None:
            try:
                self.on_failure(entries)
            except Exception:
                logger.exception("on_failure callback failed")
        for _, fut in batch:
            if fut is not None:
                fut.set_exception(exc)
