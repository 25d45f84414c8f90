"""Internal: group commit of step outcomes (docs/design.md#outcomes, docs/design.md#decisions).

`flush(entries)` applies a batch atomically with a bounded number of statements:
flush.sql (every transition, consume and purge riders, and the inboxes of rows that
continue inline) and, only when the batch needs them, park_recheck.sql (Await),
insert_all.sql + spawn_park.sql (ScheduleChildren), join_parents.sql (terminal
children) and load_children.sql (inline rows with children), in one transaction. A
plain batch is one statement whatever its size; on a connection in use it runs alone,
without BEGIN and COMMIT — one round trip per flush.

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
from .claims import load_children
from ..codec import clean_text, loads
from ..machine import Signal
from ..conf import get_settings, history_enabled
from . import connections

logger = logging.getLogger("gen_durable.flusher")

UNSTORABLE = "outcome could not be stored"
MAX_BYTES = 8 * 1024 * 1024  # FLUSH["MAX_BYTES"]'s default: encoded outcome data per batch


def entry_bytes(entry) -> int:
    """The encoded data an outcome carries into the flush statement: its state, result,
    error and attempt record, and its children's states (characters of JSON text — bytes
    for ASCII). The flush's columns and the statement hold each about twice over."""
    n = 0
    for name in ("state", "result", "error", "detail"):
        value = getattr(entry, name, None)
        if isinstance(value, str):
            n += len(value)
    for child in getattr(entry, "children", None) or ():
        value = getattr(child, "state", None)
        if isinstance(value, str):
            n += len(value)
    return n
DEFER_DELAY = 0.5  # seconds before an outcome blocked by another session's lock is tried again
# The rows of a batch nobody else has locked right now (the lock goes at once: autocommit).
_FREE_ROWS = "SELECT id FROM gen_durable WHERE id = ANY (%(ids)s::bigint[]) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED"
NO_INPUTS = ((), ())  # (inbox, children) of a continued row that has neither
COMMIT_TIMEOUT = 30.0  # seconds a worker waits for its flush (the lease is the real floor)
# Seconds since its last answer within which the flush connection is taken to be up
# (when the server has not closed it since): a batch that needs one statement then
# runs it without BEGIN/COMMIT (`flush`, `alone`). Under load flushes follow each other
# within milliseconds; after a pause the first flush starts with BEGIN.
FRESH_CONNECTION = 1.0


@dataclass
class FlushResult:
    committed: dict = field(default_factory=dict)  # id -> new status
    stale: list = field(default_factory=list)      # entries that failed the ownership guard
    woken: set = field(default_factory=set)        # queues with rows made runnable by riders


def _column(values):
    """A nullable flush.sql column: NULL when every element is (unnest pads it), else its
    array literal."""
    return None if values.count(None) == len(values) else db.pg_array(values)


def _arrays(entries):
    """flush.sql's parameters: one array literal per column (db.pg_array); an all-NULL
    column as NULL, and worker, kind and weight as one value when the batch shares it
    (db.batch_column) — a batch of one kind parses no arrays of copies on the server."""
    col = _column
    settings = get_settings()
    params = {
        "id": db.pg_array([e.id for e in entries]),
        "step": col([e.step for e in entries]), "state": col([e.state for e in entries]),
        "result": col([e.result for e in entries]), "error": col([e.error for e in entries]),
        "tb": col([e.traceback for e in entries]),
        # Read only for a retry (its delay) and when a key is set (true).
        "delay": col([e.delay if e.kind == "retry" else None for e in entries]),
        "set_key": col([True if e.set_key else None for e in entries]),
        "awaits": col([e.awaits for e in entries]), "timeout": col([e.timeout for e in entries]),
        "new_key": col([e.new_key for e in entries]), "rate_limit": col([e.rate_limit for e in entries]),
        "detail": col([e.detail for e in entries]),
        "c_target": db.pg_array([e.id for e in entries for _ in e.consumed]),
        "c_id": db.pg_array([sid for e in entries for sid in e.consumed]),
        "lease": float(settings.LEASE_TTL),
        # An inline row's lease is renewed once a heartbeat's worth of it is spent.
        "renew": float(settings.LEASE_TTL - settings.HEARTBEAT_INTERVAL),
        "inline": db.pg_array([e.id for e in entries if e.kind == "inline"]),
    }
    for name in ("worker", "kind", "weight", "claim"):
        params[name], params[name + "_1"] = db.batch_column([getattr(e, name) for e in entries])
    return params


def needs_transaction(entries, limiter=None) -> bool:
    """Whether flushing `entries` takes more than flush.sql: an Await (its re-check), a
    ScheduleChildren (the spawn), a child's terminal outcome (its parent's join), a gate
    slot to credit in the same transaction, or a row continuing inline with children
    (their load) — each a statement after flush.sql, in its transaction."""
    transactional = limiter is not None and limiter.transactional
    for e in entries:
        kind = e.kind
        if kind == "inline":  # its slot stays held with the chain: nothing to credit
            if e.has_children:
                return True
        elif kind == "await" or kind == "schedule":
            return True
        elif e.parent_id is not None and (kind == "done" or kind == "stop"):
            return True
        elif transactional and e.slot is not None:
            return True
    return False


def _credited(entries) -> list:
    """The gate slots a commit of `entries` gives back: every one but a chain's, which
    stays held by the row's next step."""
    return [e.slot for e in entries if e.slot is not None and e.kind != "inline"]


def flush(entries, using=None, limiter=None, alone=False, history=None) -> FlushResult:
    """Commit `entries` (len ≤ FLUSH.MAX_BATCH) atomically; return what committed.

    An "inline" entry (a Next continuing in the same worker) is part of the same
    statement: its row stays `executing` (committed status "executing") under the same
    claim, its gate slot kept, its lease renewed once a heartbeat interval of it is spent, and the
    statement returns the inbox its next step starts with (set on `entry.inputs`).

    Statements: 1 for a batch of plain Next/Retry/Done/Stop/inline outcomes (+ BEGIN
    and COMMIT — or, with `alone`, none: the one statement runs in autocommit and
    commits as it ends); +1 when any Await parks (the recheck), +2 when any
    ScheduleChildren spawns, +1 when any terminal child joins its parent, +1 when a
    continuing row has children (theirs), +1 when a committed row held a gate slot and
    `limiter` is transactional (Postgres: the credit commits with the outcomes, so the
    counters never disagree with the executing rows; other limiters are credited after
    the commit) — those batches always take a transaction (`needs_transaction`).

    alone: the caller used this connection moments ago (the Flusher, under load). A
    connection lost during a lone statement leaves its outcome in doubt (it may have
    committed), so a connection that sat idle — and may have been dropped meanwhile —
    starts with a BEGIN, whose failure proves nothing was sent.

    history: whether to write the committed attempts' timeline entries (`write_history`,
    one statement after the commit); None: when HISTORY is on. The Flusher passes False
    and writes them itself once the workers are woken.

    Raises DatabaseError when it fails (nothing commits), CommitInDoubt when the
    connection was lost after the outcome may have been committed.
    """
    entries = sorted(entries, key=lambda e: e.id)
    result = FlushResult()
    if not entries:
        return result
    # Alone only in autocommit: inside a caller's transaction (tests, drain()) the
    # statement would be part of it, and its failure would abort it.
    if alone and not needs_transaction(entries, limiter) and not db.connection(using).in_atomic_block:
        try:
            rows = db.fetchall(sql.FLUSH, _arrays(entries), using)
        except Exception as exc:
            if db.is_connection_error(exc):
                raise CommitInDoubt(f"connection lost during a flush statement: {exc}") from exc
            raise
        parents = _read_outcomes(rows, entries, result)
        if parents:  # an entry that did not name its parent: join now, after the commit
            logger.error("flush: %d terminal children committed without their parent's join in the same "
                         "transaction; joining them now", sum(parents.values()))
            _join_parents(parents, result, using)
    else:
        body_done = False
        try:
            with connections.engine_transaction(using):
                parents = _read_outcomes(db.fetchall(sql.FLUSH, _arrays(entries), using), entries, result)
                ok = [e for e in entries if e.id in result.committed]
                if limiter is not None and limiter.transactional:
                    slots = _credited(ok)
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
                    _join_parents(parents, result, using)
                # Children of the rows that continue inline (a row gets children only from
                # its own ScheduleChildren, which parks it: only a chain claimed with
                # children has any), loaded for their next steps in one statement.
                with_children = {e.id: e for e in ok if e.kind == "inline" and e.has_children}
                if with_children:
                    for parent_id, kids in load_children(sorted(with_children), using).items():
                        e = with_children[parent_id]
                        e.inputs = (e.inputs[0], kids)
                body_done = True
        except Exception as exc:
            if body_done and db.is_connection_error(exc):
                # COMMIT was sent and no answer came: it may or may not have landed.
                raise CommitInDoubt(f"connection lost during COMMIT: {exc}") from exc
            raise
    if history or (history is None and history_enabled()):
        write_history(entries, result.committed, using)
    if limiter is not None and not limiter.transactional:
        # A stale outcome's admission ended too: its slot names that admission alone (a
        # reap credits the claimant's members, a crash that undid the claim credits
        # nothing), so it is given back here; a newer admission of the row keeps its own.
        slots = _credited(e for e in entries if e.id in result.committed)
        slots += [e.slot for e in entries if e.slot is not None and e.id not in result.committed]
        limiter.credit_or_log(slots)
    result.stale = [e for e in entries if e.id not in result.committed]
    for e in result.stale:
        telemetry.emit("outcome.stale", {"count": 1}, {"id": e.id, "fsm": e.fsm, "step": e.from_step, "kind": e.kind})
    return result


# The timeline's name of each flush kind (gen_durable_history.outcome): a Stop failed the
# instance; the others are the outcome the step returned.
HISTORY_OUTCOMES = {"next": "next", "inline": "inline", "retry": "retry", "await": "await",
                    "schedule": "schedule", "done": "done", "stop": "failed"}


HISTORY_DELAY = 0.1  # seconds a committed attempt's entry may wait in the Flusher to share a write
HISTORY_BATCH = 1000  # entries per history_insert.sql statement at most


def history_rows(entries, committed) -> list[tuple]:
    """The timeline entries of the committed `entries` that ran an attempt, as small
    tuples (id, attempt, step, outcome, error, worker, began, ended) — the Flusher keeps
    these, not the entries and the states they carry, until it writes them."""
    return [(e.id, e.attempt, e.from_step or e.step or "", HISTORY_OUTCOMES.get(e.kind, e.kind), e.error,
             e.worker, e.began, e.ended) for e in entries if e.attempt is not None and e.id in committed]


def write_history(entries, committed, using=None) -> int:
    """One timeline entry per committed entry that ran an attempt, in one statement
    (sql/history_insert.sql), after the flush committed: an entry never describes an
    outcome that did not commit. Returns the entries written (`write_history_rows`)."""
    return write_history_rows(history_rows(entries, committed), using)


def write_history_rows(rows, using=None) -> int:
    """Insert `rows` (`history_rows`) in one statement; return how many were written.

    Best effort: the outcomes are durable already, so a failure here loses these
    entries (logged, `history.error`) and fails nothing — no flush is retried for it. A
    lost connection is closed, so the next flush starts on a new one."""
    if not rows:
        return 0
    now = time.monotonic()
    # Microseconds before now, as ints (an int array renders faster than floats'
    # shortest reprs); the statement subtracts them from the database's now().
    began = [None if r[6] is None else max(int((now - r[6]) * 1e6), 0) for r in rows]
    params = {
        "id": db.pg_array([r[0] for r in rows]),
        "attempt": db.pg_array([r[1] for r in rows]),
        "error": _column([r[4] for r in rows]),
        "began": _column(began),
        "ended": db.pg_array([0 if r[7] is None else max(int((now - r[7]) * 1e6), 0) for r in rows]),
    }
    for name, i in (("step", 2), ("outcome", 3), ("worker", 5)):
        params[name], params[name + "_1"] = db.batch_column([r[i] for r in rows])
    from django.db import transaction

    conn = db.connection(using)
    try:
        own = not conn.in_atomic_block
        # A caller's transaction (drain(), tests) gets a savepoint, so a failure does not
        # abort it, and no settings: SET LOCAL in a released savepoint would outlive it.
        # Our own transaction gets history_begin.sql's short lock_timeout (a locked table
        # costs entries, never the outcomes behind this write) and asynchronous commit.
        with transaction.atomic(using=conn.alias):
            if own:
                db.execute(sql.HISTORY_BEGIN, None, using)
            db.execute(sql.HISTORY_INSERT, params, using)
    except Exception as exc:
        logger.warning("timeline entries of %d committed outcomes were not written (%s); the outcomes stand",
                       len(rows), str(exc).strip())
        telemetry.emit("history.error", {"count": len(rows)}, {"error": repr(exc)})
        if db.is_connection_error(exc):
            try:
                conn.close()
            except Exception:
                pass
        return 0
    return len(rows)


def _read_outcomes(rows, entries, result) -> Counter:
    """Fill `result.committed` and the inline entries' inputs from flush.sql's rows;
    return the terminal children per parent (for join_parents.sql)."""
    parents = Counter()
    inboxes: dict = {}
    committed = result.committed
    for id_, status, queue, parent_id, sid, name, payload, at in rows:
        if status is None:  # a signal in the inbox of a row that continues inline
            inboxes.setdefault(id_, []).append(Signal(sid, name, loads(payload), at))
            continue
        committed[id_] = status
        if parent_id is not None and (status == "done" or status == "failed"):
            parents[parent_id] += 1
    for e in entries:
        if e.kind == "inline" and e.id in committed:
            inbox = inboxes.get(e.id)
            e.inputs = NO_INPUTS if inbox is None else (sorted(inbox, key=lambda sig: sig.id), ())
    return parents


def _join_parents(parents, result, using):
    ordered = sorted(parents)
    rows = db.fetchall(sql.JOIN_PARENTS, {"parent_id": db.pg_array(ordered),
                                          "n": db.pg_array([parents[p] for p in ordered])}, using)
    for id_, status, queue in rows:
        if status == "runnable":
            result.woken.add(queue)


WRITE_HISTORY = object()  # `Flusher._take`'s answer when only timeline entries wait


class CommitInDoubt(DatabaseError):
    """The connection was lost after COMMIT — or a lone flush statement, which commits as
    it ends — was sent: the flush may have committed."""


class FlushError(Exception):
    """The flush transaction failed; the outcome was not committed (the lease recovers it)."""


class Flusher:
    """The group-commit thread of one worker process."""

    def __init__(self, *, using=None, max_batch=100, max_delay=0.005, limiter=None, on_commit=None,
                 on_failure=None, retry_window=None, young=None, clock=time.monotonic, max_bytes=MAX_BYTES):
        self.using = using
        self.clock = clock  # the window's clock (monotonic seconds)
        # young(seconds) -> whether a step started less than that long ago is still
        # running (the supervisor asks its schedulers). The window waits only for those:
        # a step that has already run longer than it is not about to finish, and waiting
        # for it would hold every other outcome — an inline chain's each link — for the
        # whole window. None: every running step counts.
        self.young = young
        self.retry_window = retry_window  # seconds a failing flush is retried (default: LEASE_TTL)
        self.retries = 0
        self._deferred_since: dict = {}  # id -> monotonic time its outcome was first blocked
        self._deferred_why: dict = {}  # id -> the error that deferred its outcome (lock or key conflict)
        self.max_batch = max_batch
        # A batch also ends once its outcomes carry max_bytes of encoded data (an outcome
        # larger than that goes alone): memory stays flat whatever the result size.
        self.max_bytes = max_bytes
        self._pending_bytes = 0
        self.max_delay = max_delay
        self.limiter = limiter
        self.on_commit = on_commit  # callback(FlushResult, entries) after each commit, before waking workers
        self.on_failure = on_failure  # callback(entries) when a flush transaction failed
        self._cond = threading.Condition()
        self._pending: list[tuple] = []
        self._first_at = 0.0  # self.clock() when the oldest pending outcome was submitted
        self._held = False  # whether the batch being flushed waited for the window
        self._running = 0  # steps started but not yet submitted
        self._stopping = False
        self._used = float("-inf")  # monotonic time the flush connection last answered
        # Timeline entries of committed attempts not written yet (`_note_history`), and
        # the monotonic time the oldest of them was kept. The flusher thread's own.
        self._history: list[tuple] = []
        self._history_at = 0.0
        self._thread = threading.Thread(target=self._loop, name="gd-flusher", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def alive(self) -> bool:
        """Whether the flusher thread is running (or was never started)."""
        return self._thread.is_alive() or self._thread.ident is None

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
            if not self._pending:
                self._first_at = self.clock()
            self._pending.append((entry, fut))
            self._pending_bytes += entry_bytes(entry)
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
                if not self._history:
                    self._cond.wait()
                    continue
                left = self._history_at + HISTORY_DELAY - time.monotonic()
                if left <= 0:
                    return WRITE_HISTORY  # idle: the kept timeline entries go now
                self._cond.wait(left)
            if not self._pending:
                return None
            # Group commit: the oldest waiting outcome waits at most max_delay for others
            # to share its commit, and only while steps that could add one in time run
            # (started within the window). Counted from its submit, not from here:
            # outcomes that queued during the previous flush have waited already, so a
            # busy flusher never idles on top.
            deadline = self._first_at + self.max_delay
            held = False
            while (len(self._pending) < self.max_batch and self._pending_bytes < self.max_bytes
                   and self._running > 0 and not self._stopping and self._young()):
                left = deadline - self.clock()
                if left <= 0:
                    break
                held = True
                self._cond.wait(left)
            self._held = held
            n, size = 0, 0
            for entry, _ in self._pending[: self.max_batch]:
                weight = entry_bytes(entry)
                if n and size + weight > self.max_bytes:
                    break
                n, size = n + 1, size + weight
            batch = self._pending[:n]
            del self._pending[:n]
            self._pending_bytes -= size
            return batch

    def _young(self) -> bool:
        """self.young(max_delay), and True when there is none or it fails: the window then
        waits for every running step, as it would without the hint."""
        if self.young is None:
            return True
        try:
            return bool(self.young(self.max_delay))
        except Exception:
            logger.debug("young() failed; waiting for every running step", exc_info=True)
            return True

    def _loop(self):
        connections.bind("flusher", self.using, tag=getattr(self, "tag", None))
        self._connect()
        try:
            while True:
                batch = self._take()
                if batch is None:
                    break
                if batch is WRITE_HISTORY:
                    self._write_history()
                else:
                    self._flush(batch)
                reset_queries()  # DEBUG keeps every query until reset, as after a request
            self._write_history()  # stopping: what is kept is written before the connection closes
        finally:  # a thread that dies (the supervisor stops the worker) leaves no session open
            self._close()
            connections.unbind()

    def _connect(self):
        """Open the flush connection when the worker starts, not at its first outcome:
        Django's connection set-up takes tens of milliseconds, which the first commit
        would otherwise wait for. A server that cannot be reached now is logged; the
        first flush connects (and retries) as after any lost connection."""
        try:
            db.connection(self.using).ensure_connection()
        except Exception as exc:
            logger.warning("flusher: could not connect at start-up (%s); connecting at the first flush", exc)

    def _close(self):
        self._used = float("-inf")  # a new connection: its first flush starts with BEGIN
        try:
            db.connection(self.using).close()
        except Exception:
            pass

    def _retry_window(self) -> float:
        # While a flush retries, its rows stay in flight and heartbeated; past a lease
        # the outcome is likely stale anyway, and the reaper has the rows.
        return self.retry_window if self.retry_window is not None else get_settings().LEASE_TTL

    def _flush(self, batch):
        if self._deferred_since:
            batch = self._still_locked_out(batch)
            if not batch:
                return None
        entries = [e for e, _ in batch]
        started = time.perf_counter()
        deadline = time.monotonic() + self._retry_window()
        delay = 0.0
        while True:
            try:
                # Under load the connection was just used and the server has not
                # closed it since: a batch that needs only flush.sql runs it alone (one
                # round trip; `flush`, `alone`). Otherwise a BEGIN goes first: a
                # connection lost meanwhile fails there, and the flush is retried.
                alone = (time.monotonic() - self._used < FRESH_CONNECTION
                         and connections.untouched(self.using))
                result = flush(entries, self.using, self.limiter, alone=alone, history=False)
                self._used = time.monotonic()
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
                                      "duration": time.perf_counter() - started, "held": self._held}, {})
        if self.on_commit is not None:
            try:
                self.on_commit(result, entries)
            except Exception:
                logger.exception("on_commit callback failed")
        stale = {e.id for e in result.stale}
        for entry, fut in batch:
            self._deferred_since.pop(entry.id, None)
            self._deferred_why.pop(entry.id, None)
            if fut is not None:
                fut.set_result("stale" if entry.id in stale else "committed")
        # The timeline last: the chains and step threads this commit frees go on
        # meanwhile instead of waiting one more round trip (docs/design.md#history).
        if history_enabled():
            self._note_history(entries, result.committed)
        return None

    def _note_history(self, entries, committed):
        """Keep the committed attempts' timeline entries; write them once HISTORY_BATCH
        are kept or the oldest has waited HISTORY_DELAY — one statement for the entries
        of many flushes under load. `_take` writes them when the flusher goes idle."""
        rows = history_rows(entries, committed)
        if not rows:
            return
        if not self._history:
            self._history_at = time.monotonic()
        self._history += rows
        if len(self._history) >= HISTORY_BATCH or time.monotonic() - self._history_at >= HISTORY_DELAY:
            self._write_history()

    def _write_history(self):
        rows, self._history = self._history, []
        for i in range(0, len(rows), HISTORY_BATCH):
            if write_history_rows(rows[i:i + HISTORY_BATCH], self.using):
                self._used = time.monotonic()

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
        if db.is_key_conflict(exc):
            # The move (a Retry or Next back to runnable, a park…) would reserve a
            # correlation key another row holds now: not the outcome's fault, and failing
            # the instance would lose its work. It waits, held and heartbeated, retried
            # every DEFER_DELAY for up to a lease; after that its lease lapses and the
            # reaper, which skips a row whose key is taken, returns it once the key is free.
            logger.warning("outcome %s of %s#%s waits: its correlation key is held by another row (%s); "
                           "retried every %.1fs", entry.kind, entry.fsm, entry.id, str(exc).strip().splitlines()[0],
                           DEFER_DELAY)
            telemetry.emit("flush.key_conflict", {"count": 1}, {"id": entry.id, "fsm": entry.fsm})
            return self._defer(batch, exc)
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
            locked = self._locked(entries)
        except Exception as probe_exc:
            self._close()
            return self._fail(batch, probe_exc, reconnect=True)
        blocked = [item for item in batch if item[0].id in locked]
        ready = [item for item in batch if item[0].id not in locked]
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

    def _still_locked_out(self, batch):
        """`batch` without the outcomes a lock held them back and whose rows are still
        locked (deferred again, at once): one probe, and only when the batch holds a
        deferred outcome. Without it each retry would wait LOCK_TIMEOUT again, and
        every other outcome of the process with it."""
        deferred = [item for item in batch if item[0].id in self._deferred_since]
        if not deferred:
            return batch
        try:
            ids = self._locked([e for e, _ in deferred])
        except Exception:  # the flush itself will meet (and handle) what failed here
            logger.debug("probe of deferred outcomes' rows failed", exc_info=True)
            return batch
        locked = [item for item in deferred if item[0].id in ids]
        for item in locked:
            self._defer([item], self._deferred_why.get(item[0].id) or FlushError("its row is locked by another session"))
        return [item for item in batch if item not in locked]

    def _locked(self, entries) -> set:
        """Ids of `entries` whose row, or whose parent's row (a child's end takes its
        parent's lock to count it off the join), another session holds locked now: one
        `SKIP LOCKED` probe. Raises what the statement raises."""
        rows = {e.id for e in entries} | {e.parent_id for e in entries if e.parent_id is not None}
        free = {r[0] for r in db.fetchall(_FREE_ROWS, {"ids": db.pg_array(sorted(rows))}, self.using)}
        return {e.id for e in entries if e.id not in free or (e.parent_id is not None and e.parent_id not in free)}

    def _defer(self, items, exc):
        now = time.monotonic()
        for e, _ in items:
            self._deferred_why[e.id] = exc
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
            if not self._pending:
                self._first_at = self.clock()
            self._pending.extend(items)
            self._pending_bytes += sum(entry_bytes(e) for e, _ in items)
            self._cond.notify_all()

    def _fail(self, batch, exc, *, reconnect):
        """Nothing of `batch` committed: the rows stay executing until their leases lapse."""
        entries = [e for e, _ in batch]
        for e in entries:  # a later outcome of the row starts its own retry window
            self._deferred_since.pop(e.id, None)
            self._deferred_why.pop(e.id, None)
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
