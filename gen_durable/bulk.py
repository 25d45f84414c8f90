"""Operator calls on every instance matching a filter, in bounded batches
(docs/guide.md "Bulk operations"): `cancel_where`, `retry_where`, `move_where`.

Each batch is one read of at most `batch` ids from a range of at most WINDOW ids of the
primary key (sql/bulk_select.sql, locking nothing; after a window with no match the walk
jumps to the next existing id, sql/bulk_next.sql, so a gap in the id space costs one
index descent) and then one guarded statement per row (cancel, retry) or one per
batch (move), each committed on its own: workers are never blocked for longer than one
row's or one batch's update, a row that moved on meanwhile is skipped, and a run that is
interrupted can simply be started again. `progress(done, skipped, scanned)` is called
after every batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import calls, db, sql
from .exceptions import GenDurableError, InvalidInput
from .outcomes import reason_text, text
from .statuses import Status

MAX_BATCH = 10_000
WINDOW = 20_000  # ids of the primary key one read looks at, at most


@dataclass
class BulkResult:
    """What a bulk call did: `done` rows changed, `skipped` rows matched but left as they
    were (finished meanwhile, not retryable, key taken), `scanned` rows matched in all,
    `batches` batches run, and the first few skip reasons (`reasons`, at most 20)."""

    done: int = 0
    skipped: int = 0
    scanned: int = 0
    batches: int = 0
    reasons: list = field(default_factory=list)
    # Where a walk bounded by `max_batches` stopped (internal: the admin's "all matching"
    # actions continue from here): the last id looked at, the walk's top id, and whether
    # it reached the top; `start` the first id it looked at.
    start: int = 0
    after: int = 0
    top: int = 0
    finished: bool = True


def _filter(status, queue, machine, batch):
    if status is None:
        statuses = None
    else:
        statuses = [status] if isinstance(status, str) else list(status)
        unknown = [s for s in statuses if s not in Status.values]
        if not statuses or unknown:
            raise InvalidInput(f"status must be one or more of {', '.join(Status.values)}, got {status!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise InvalidInput(f"batch must be an int from 1 to {MAX_BATCH}, got {batch!r}")
    if machine is not None and not isinstance(machine, str):
        machine = calls.resolve_machine(machine).name
    return {"statuses": statuses, "queue": None if queue is None else text(queue, "queue"),
            "fsm": None if machine is None else text(machine, "machine"), "batch": batch}


def _batches(params, using, result, progress, after=None, top=None, max_batches=None):
    """Yield the matching ids in batches of at most params["batch"], walking the primary
    key in windows of WINDOW ids (each read is bounded whatever the filter); rows
    inserted after the walk started (ids past the largest at its start) are not included.

    after/top: resume a walk (ids > after, up to top); max_batches: stop after that many
    non-empty batches or that many windows read, whichever comes first (result.after and
    result.finished say where it stopped)."""
    if after is None or top is None:
        low, top = db.fetchone("SELECT min(id), max(id) FROM gen_durable", None, using)
        if top is None:
            return
        after = low - 1
    result.start, result.after, result.top, result.finished = after + 1, after, top, False
    reads = 0
    while after < top:
        if max_batches is not None and (result.batches >= max_batches or reads >= max_batches * 5):
            result.after = after
            return
        reads += 1
        ids = [r[0] for r in db.fetchall(sql.BULK_SELECT, {**params, "after": after, "window": WINDOW}, using)]
        after = ids[-1] if len(ids) == params["batch"] else min(after + WINDOW, top)
        result.after = after
        if not ids:
            # A gap in the id space (an old row, everything after it deleted) would
            # otherwise be read WINDOW ids at a time: jump to the next existing id.
            if after < top:
                (nxt,) = db.fetchone(sql.BULK_NEXT, {"after": after}, using)
                after = top if nxt is None or nxt > top else max(after, nxt - 1)
                result.after = after
            continue
        result.scanned += len(ids)
        result.batches += 1
        yield ids
        if progress is not None:
            progress(result.done, result.skipped, result.scanned)
    result.finished = True


def _skip(result, id_, why):
    result.skipped += 1
    if len(result.reasons) < 20:
        result.reasons.append(f"#{id_}: {why}")


def _each(action, params, using, progress, result=None, **walk) -> BulkResult:
    # `result` may be the caller's: filled in as the walk goes, so counts survive an error.
    result = BulkResult() if result is None else result
    for ids in _batches(params, using, result, progress, **walk):
        for id_ in ids:
            try:
                action(id_)
            except GenDurableError as exc:  # NoTarget, NotRetryable, DuplicateInstance
                _skip(result, id_, f"{type(exc).__name__}: {exc}")
            except BaseException:
                # Interrupted (a database error): a walk resumed from result.after starts
                # at this row, not past the rest of its batch.
                result.after, result.finished = id_ - 1, False
                raise
            else:
                result.done += 1
    return result


def _defaults(operation, params):
    if params["statuses"] is None:
        skip = {"cancel": ("done", "failed"), "move": ("executing", "done")}.get(operation, ())
        params["statuses"] = [s for s in Status.values if s not in skip]
    return params


def count_where(operation: str, *, status=None, queue=None, machine=None, batch: int = 1000, using=None) -> int:
    """How many instances the filter matches for `operation` ("cancel", "retry" or
    "move", whose default statuses differ); reads in batches, changes nothing."""
    params = _defaults(operation, _filter(status, queue, machine, batch))
    result = BulkResult()
    for _ids in _batches(params, using, result, None):
        pass
    return result.scanned


def cancel_where(*, reason: str, status=None, queue: str | None = None, machine=None, batch: int = 1000,
                 progress=None, using=None) -> BulkResult:
    """Cancel every live instance matching the filter, as `gd.cancel(id, reason)` does
    one (a running step's late outcome is dropped; a waiting parent is joined).

    status: a status or a list of them (None: every live one); queue, machine (a name or
    a class): None matches any. batch: ids per keyset read (1..10,000).
    progress: called as progress(done, skipped, scanned) after each batch.
    Statements: one read per batch plus one per matching row. Returns a BulkResult.
    Raises InvalidInput for a bad filter, batch or reason (at most 4,000 characters).
    """
    reason = reason_text(reason, "cancel reason")
    params = _defaults("cancel", _filter(status, queue, machine, batch))
    return _each(lambda id_: calls.cancel(id_, reason, using=using), params, using, progress)


def retry_where(*, status="failed", queue: str | None = None, machine=None, batch: int = 1000,
                progress=None, using=None) -> BulkResult:
    """Retry every instance matching the filter now, as `gd.retry(id)` does one (e.g.
    200,000 rows failed in an outage: `gd.retry_where(status="failed", queue="email")`).

    status: default "failed"; queue, machine, batch, progress: as in `cancel_where`.
    Rows that cannot be retried (done, executing, awaiting children, a key held by
    another live instance) are skipped and counted. Statements: one read per batch plus
    one per matching row. Returns a BulkResult. Raises InvalidInput for a bad filter.
    """
    params = _filter(status, queue, machine, batch)
    return _each(lambda id_: calls.retry(id_, using=using), params, using, progress)


def move_where(*, to_queue: str, status=None, queue: str | None = None, machine=None, batch: int = 1000,
               progress=None, using=None) -> BulkResult:
    """Move every instance matching the filter to queue `to_queue` (a queue renamed or
    overloaded): its next step is claimed by that queue's workers.

    Executing and done rows are not moved (skipped and counted): a claimed row's outcome
    commits under its own queue first — run it again once they have finished. Runnable
    rows wake the target queue's workers. status, queue, machine, batch, progress: as in
    `cancel_where` (status None: every status but executing and done). Statements: two
    per batch. Returns a BulkResult. Raises InvalidInput, before any row moves, for a bad
    filter or a `to_queue` nobody declares (GEN_DURABLE['QUEUES'], a machine's queue or
    EXTRA_QUEUES): no worker would ever claim the rows there.
    """
    target = _target(to_queue)
    return _move(target, _defaults("move", _filter(status, queue, machine, batch)), using, progress)


def _target(to_queue) -> str:
    target = text(to_queue, "to_queue")
    calls.check_queue(target)
    return target


def _move(target, params, using, progress, result=None, **walk) -> BulkResult:
    result = BulkResult() if result is None else result
    for ids in _batches(params, using, result, progress, **walk):
        try:
            moved = {r[0] for r in db.fetchall(sql.BULK_MOVE, {"ids": db.pg_array(ids), "queue": target}, using)}
        except BaseException:
            result.after, result.finished = ids[0] - 1, False  # the batch's one UPDATE did nothing
            raise
        result.done += len(moved)
        for id_ in ids:
            if id_ not in moved:
                _skip(result, id_, "executing, done, or already in the queue")
    return result



RETRYABLE = ("failed", "awaiting_signal", "runnable")  # what gd.retry acts on


def actionable_statuses(operation: str) -> list:
    """The statuses `operation` can change: live rows for cancel, every status but
    executing and done for move, RETRYABLE for retry."""
    if operation == "retry":
        return list(RETRYABLE)
    return _defaults(operation, {"statuses": None})["statuses"]


def window_statuses(operation: str, status=None) -> list:
    """The statuses `run_window` acts on: `status` (one or a list) narrowed to the
    operation's `actionable_statuses`, or, with no status, the same default as the
    *_where call (failed only for retry, as `retry_where`: waking every parked or
    scheduled instance takes asking for those statuses) — a row of another status would
    only be read to be skipped. May be empty (the action does nothing to that status)."""
    able = actionable_statuses(operation)
    if status is None:
        return ["failed"] if operation == "retry" else able
    wanted = [status] if isinstance(status, str) else list(status)
    return [s for s in wanted if s in able]


def run_window(operation: str, *, status=None, queue=None, machine=None, reason=None, to_queue=None,
               batch: int = 1000, after=None, top=None, max_batches=None, using=None,
               result: BulkResult | None = None) -> BulkResult:
    """Internal (the admin's "all matching" actions): `operation` ("cancel", "retry",
    "move") on the filter, as the *_where call does, but resumable and bounded: ids
    after `after` up to `top` (None: the whole table as it is now), at most
    `max_batches` batches (None: to the end). The result's after/top/finished say
    where it stopped; the next call passes them back. Statuses: `window_statuses`
    (InvalidInput when none is left). `result`: a BulkResult to fill in as it goes (what
    was done before an error is still counted there)."""
    params = _filter(window_statuses(operation, status), queue, machine, batch)
    walk = {"after": after, "top": top, "max_batches": max_batches, "result": result}
    if operation == "cancel":
        reason = reason_text(reason, "cancel reason")
        return _each(lambda id_: calls.cancel(id_, reason, using=using), params, using, None, **walk)
    if operation == "retry":
        return _each(lambda id_: calls.retry(id_, using=using), params, using, None, **walk)
    if operation == "move":
        return _move(_target(to_queue), params, using, None, **walk)
    raise InvalidInput(f"operation must be cancel, retry or move, got {operation!r}")
