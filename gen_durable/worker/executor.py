"""Internal: run one claimed step and turn its outcome into a flush entry (docs/guide.md, docs/design.md#outcomes).

The step runs outside any transaction. Resolution of the machine happens first; an
unknown (name, version) fails the instance with a clear message (docs/design.md#reliability-bars) and the
worker goes on. Everything after — decoding the state, the step, validating and
encoding its outcome, expanding child specs — happens inside the guarded region, so a
data error reaches `handle()` instead of crashing the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import logging
import threading
import time
from dataclasses import dataclass, field

from asgiref.sync import sync_to_async

from .. import db, registry, telemetry
from .. import outcomes as _outcomes
from ..calls import Row, build_row
from ..codec import clean_text, encode, encode_state, load_typed, loads, safe_repr
from ..conf import database_alias, get_settings, routed_alias
from ..exceptions import InvalidOutcome, SerializationError, StepTimeout, TransactionLeftOpen, UnknownMachine
from ..limiter.config import get_limits, name_of
from ..machine import Context, Job, Machine, jittered, step_suggestion
from ..outcomes import KEEP, Await, Done, Next, Retry, ScheduleChildren, Stop
from . import aio
from .claims import Claimed

logger = logging.getLogger("gen_durable.executor")
# Every failed attempt (a step or handle() that raised) is logged here with its
# traceback: WARNING while the instance goes on (retry, or a handled error), ERROR
# when it fails for good (docs/observability.md#failed-attempts).
attempt_logger = logging.getLogger("gen_durable.worker")

PURE_HANDLES = (Machine.handle, Job.handle)
KINDS = ("next", "inline", "retry", "await", "schedule", "done", "stop")
# A step whose database connection was lost or refused is retried after
# min(CONNECTION_RETRY_BASE × 2**attempt, CONNECTION_RETRY_CAP) seconds (jittered).
CONNECTION_RETRY_BASE = 0.5
CONNECTION_RETRY_CAP = 60.0


@dataclass
class Entry:
    """One outcome on its way to the flush (a row of sql/flush.sql's arrays)."""

    id: int
    worker: str
    kind: str
    # The claim it ran under (Claimed.claim): flush.sql commits it only while the row
    # still holds that claim. 0 is a row no pick claimed (tests that stage rows).
    claim: int = 0
    step: str | None = None
    state: str | None = None
    result: str | None = None
    error: str | None = None
    traceback: str | None = None  # the failed attempt's traceback (last_traceback); set with error
    delay: float = 0.0
    awaits: str | None = None
    timeout: float | None = None
    set_key: bool = False
    new_key: str | None = None
    rate_limit: str | None = None
    weight: float = 1.0
    consumed: tuple = ()
    presented: tuple = ()
    children: list = field(default_factory=list)
    detail: str | None = None  # JSON record appended to attempt_log (machines that keep one)
    parent_id: int | None = None  # the row's parent: its terminal outcome joins the parent (same transaction)
    # for telemetry and the limiter
    fsm: str = ""
    from_step: str = ""
    queue: str = ""
    slot: object = None
    wanted_inline: bool = False  # a Next that asked to continue inline (kind says whether it may)
    inputs: tuple = ((), ())  # inline: (inbox, children) the flush loaded for the next step
    has_children: bool = False  # inline: the row has children (the flush loads them for the next step)
    chain: tuple = ()  # inline: (started, steps) of the chain the next step continues
    # The instance's timeline entry (HISTORY; the flush writes one per committed entry
    # whose attempt is set): the attempt that ran, and when it began and ended
    # (time.monotonic()). None: no step ran (a requeue), or the time is unknown.
    attempt: int | None = None
    began: float | None = None
    ended: float | None = None


def error_text(error: BaseException) -> str:
    """`Type: message` of an exception, storable and bounded; never raises (an
    exception whose __str__ raises is described by its type)."""
    return _outcomes.error_text(error)


def traceback_text(error: BaseException) -> str:
    """The formatted traceback of `error` (chained causes included), at most
    MAX_TRACEBACK_LENGTH characters: a longer one keeps its head line and its tail (the
    innermost frames and the message), with a marker where it was cut. Never raises."""
    try:
        text = _outcomes.format_traceback(error)
    except Exception:  # a __str__ that raises inside format_exception
        text = error_text(error) + "\n(traceback could not be formatted)"
    text = clean_text(text)
    limit = _outcomes.MAX_TRACEBACK_LENGTH
    if len(text) > limit:
        head = text[:text.find("\n") + 1] if "\n" in text[:200] else ""
        marker = f"… {len(text) - limit} characters cut …\n"
        text = head + marker + text[-(limit - len(head) - len(marker)):]
    return text


def _log_attempt(job: Claimed, entry: Entry, error: BaseException, handle_error: BaseException | None = None):
    """One log record per failed attempt on `gen_durable.worker`: WARNING while the
    instance goes on, ERROR when this attempt failed it (kind stop). The record's
    `extra` carries gd_id, gd_machine, gd_step, gd_attempt, gd_queue, gd_final."""
    final = entry.kind == "stop"
    level = logging.ERROR if final else logging.WARNING
    if not attempt_logger.isEnabledFor(level):
        return
    if entry.kind == "retry":
        what = f"will retry in {entry.delay:.1f} s"
    else:
        what = "failed" if final else f"handled ({entry.kind})"
    shown = handle_error if handle_error is not None else error
    attempt_logger.log(
        level, "%s#%s step %s attempt %s raised %s; %s", job.fsm, job.id, job.step, job.attempt,
        error_text(error) + (f" (handle() then raised {error_text(handle_error)})" if handle_error else ""),
        what, exc_info=(type(shown), shown, _outcomes.user_traceback(shown.__traceback__)),
        extra={"gd_id": job.id, "gd_machine": job.fsm, "gd_step": job.step, "gd_attempt": job.attempt,
               "gd_queue": job.queue, "gd_final": final})


def stop_entry(job: Claimed, reason: str) -> Entry:
    return Entry(id=job.id, worker=job.worker, claim=job.claim, kind="stop", error=reason, fsm=job.fsm,
                 from_step=job.step, queue=job.queue, slot=job.slot, parent_id=job.parent_id,
                 attempt=job.attempt)


def _stamped(entry: Entry, job: Claimed, began: float) -> Entry:
    """`entry` with its timeline fields: `job`'s attempt, run from `began` until now."""
    entry.attempt, entry.began, entry.ended = job.attempt, began, time.monotonic()
    return entry


def execute(job: Claimed, *, inline: bool = False, finish=None) -> Entry:
    """Run `job`'s current step and return the entry to flush. Never raises Exception.

    inline: whether a Next that asks for inline continuation may get it (kind "inline");
    otherwise it is a plain requeued Next. See `inline_kind` for the key rule.
    finish: a step thread's `() -> bool`, called once when the step returned and before
    its `step.stop`: True when the worker abandoned the step past its timeout meanwhile
    (its outcome is dropped, so `step.stop` says kind "abandoned", not the outcome).
    """
    observed = telemetry.active()  # the events' dicts are built only for a listener
    if observed:
        telemetry.emit("step.start", {}, {"id": job.id, "fsm": job.fsm, "step": job.step,
                                          "attempt": job.attempt, "queue": job.queue})
    started = time.perf_counter()
    began = time.monotonic()
    try:
        cls = registry.get(job.fsm, job.fsm_version)
    except UnknownMachine as exc:
        entry = stop_entry(job, str(exc))
    else:
        if _step_is_async(cls, job.step):  # outside the worker (drain()): on the loop, waited for
            entry = aio.run(_arun(cls, job, inline))
        else:
            entry = _run(cls, job, inline)
    _stamped(entry, job, began)
    abandoned = finish is not None and finish()
    if observed or telemetry.active():
        emit_stop(job, ABANDONED if abandoned else entry.kind, time.perf_counter() - started,
                  None if abandoned else entry.error)
    logger.debug("step %s#%s %s -> %s", job.fsm, job.id, job.step, entry.kind)
    return entry


# step.stop's kind for a sync step that returned after the worker abandoned it past its
# timeout: its outcome went nowhere (the timeout's own step.stop carries what handle() did).
ABANDONED = "abandoned"


def emit_stop(job: Claimed, kind: str, duration: float, error: str | None) -> None:
    telemetry.emit("step.stop", {"duration": duration},
                   {"id": job.id, "fsm": job.fsm, "step": job.step, "kind": kind,
                    "attempt": job.attempt, "queue": job.queue, "error": error})


def _prepare(cls, job: Claimed):
    """(method name, machine, ctx, awaited) of `job`'s step; method None if it has no such step."""
    method = cls.steps.get(job.step)
    if method is None:
        return None, None, None, None
    machine = cls()
    inbox = job.inbox
    if inbox and job.awaits:
        names = set(job.awaits)
        awaited = [s for s in inbox if s.name in names]
    else:
        awaited = []
    ctx = Context(id=job.id, step=job.step, state=job.state, attempt=job.attempt, awaited=awaited,
                  all=list(inbox), children=list(job.children), queue=job.queue,
                  correlation_key=job.correlation_key, machine=machine, database=job.database)
    return method, machine, ctx, awaited


def _no_step(cls, job):
    return stop_entry(job, f"{cls.name} version {cls.version} has no step {job.step!r}")


def _exhausted(cls, job):
    """The Stop of a row claimed at its machine's max_attempts, else None.

    Outcomes never retry past the limit, so the last attempt ended with no outcome: the
    reaper (or a shutdown) returned it. A step that kills its own process (os._exit, a
    segfault, the OOM killer) would otherwise run forever.
    """
    limit = cls.max_attempts
    if limit is None or job.attempt < limit:
        return None
    return stop_entry(job, f"step {job.step!r} reached max_attempts ({limit}): its last attempt "
                           "ended without an outcome (the worker died, was killed or stalled in it)")


def _run(cls, job: Claimed, inline: bool = False) -> Entry:
    method, machine, ctx, awaited = _prepare(cls, job)
    if method is None:
        return _no_step(cls, job)
    if (exhausted := _exhausted(cls, job)) is not None:
        return exhausted
    # A step thread starts every step with clean connections; whatever transaction the
    # step (or handle) leaves open is rolled back and the step treated as failed, so the
    # next step on this thread never writes into it. drain() inside a test's atomic
    # block starts unclean and is left alone.
    clean = db.thread_is_clean()
    where = StepWhere(cls.name, job)
    try:
        if cls.State is not None:
            ctx.state = load_typed(cls.State, job.state)
        outcome = getattr(machine, method)(ctx)
        if clean and db.discard_dangling(where):
            raise TransactionLeftOpen(f"{where} returned inside a transaction; it was rolled back")
        ids = tuple(s.id for s in awaited) if awaited else ()
        try:
            entry = to_entry(outcome, cls, job, consumed=ids, presented=ids, inline=inline)
        except (InvalidOutcome, SerializationError) as bad:
            raise _located(bad, cls, method) from None
        _warn_if_state_dropped(cls, job, ctx, outcome)
        return _with_record(entry, machine)
    except BaseException as error:
        if db.is_connection_error(error) and (retry := connection_retry(error, cls, job)) is not None:
            # The database went away under the step (a restart, a failover, no free
            # connection): nothing is wrong with the instance, so it is retried with
            # back-off without asking handle(), for machines and jobs alike.
            if clean:
                db.discard_dangling(where)
            return retry
        # Any exception, SystemExit included (a step thread is not the main thread, so
        # nothing else would stop): handle() sees no inputs, and its outcome consumes
        # none. An unbounded lease/re-run loop is the alternative.
        if clean:
            db.discard_dangling(where)
        return _handled(machine, cls, job, ctx, error, inline, clean=clean)


_KEEPING = (Next, Retry, Await, ScheduleChildren)  # outcomes whose state= defaults to KEEP
_dropped_warned: set = set()  # (machine, step) already warned of, in this process
DROPPED_CHECK_BYTES = 64 * 1024  # larger states are not decoded again to compare


def _warn_if_state_dropped(cls, job: Claimed, ctx: Context, outcome) -> None:
    """Warn, once per machine and step in this process, when a step changed `ctx.state`
    in place (or replaced it) and returned an outcome that keeps the committed state (no
    `state=`): the change is not stored, which reads as lost data. Checked for a plain
    dict state of at most DROPPED_CHECK_BYTES (one decode of it per such outcome, a few
    µs); not for a typed `State` (a decoded instance need not equal another: eq=False,
    default_factory fields), nor for Jobs (their args are input)."""
    raw = job.raw_state
    if (not isinstance(outcome, _KEEPING) or outcome.state is not KEEP or raw is None or cls.State is not None
            or len(raw) > DROPPED_CHECK_BYTES or issubclass(cls, Job) or (cls.name, job.step) in _dropped_warned):
        return
    try:
        changed = loads(raw) != ctx.state
    except Exception:  # an __eq__ that raises: nothing to say
        return
    if changed:
        _dropped_warned.add((cls.name, job.step))
        kind = type(outcome).__name__
        attempt_logger.warning(
            "%s#%s step %s changed ctx.state but returned gd.%s without state=, which keeps the state as it was "
            "committed: the change is not stored. Return gd.%s(..., state=ctx.state) to keep it (said once per "
            "step and process)", cls.name, job.id, job.step, kind, kind,
            extra={"gd_id": job.id, "gd_machine": cls.name, "gd_step": job.step})


def _located(error, cls, method: str):
    """`error` (an outcome the step returned that cannot be stored) naming the step's
    definition, file:line: raised after the step returned, its traceback holds no frame
    of the step's own. A Job's is its `perform`; method "handle" is handle()'s."""
    if issubclass(cls, Job) and method != "handle":
        func = getattr(cls, "perform", None)
    else:
        func = getattr(cls, method, None)
    func = getattr(func, "_gd_function", func)  # a @gd.job's is the function it wraps
    try:
        func = inspect.unwrap(func)
        code = func.__code__
    except Exception:  # a step object with no code of its own (a callable instance, a builtin)
        located = error
    else:
        located = type(error)(f"{error} (returned by {func.__qualname__}, defined at "
                              f"{code.co_filename}:{code.co_firstlineno})")
    # What the code returned, not a passing failure: a Job's default handle() fails it at
    # once rather than re-running it max_attempts times for the same value.
    located.returned = True
    return located


class StepWhere:
    """`step machine.step (instance id)`, for a log line or an error: rendered only when
    one is written (not on every step). The step is read now: an inline continuation
    turns the claim into its next step's (`continuation`)."""

    __slots__ = ("name", "step", "id")

    def __init__(self, name, job):
        self.name, self.step, self.id = name, job.step, job.id

    def __str__(self):
        return f"step {self.name}.{self.step} (instance {self.id})"


def _handled(machine, cls, job: Claimed, ctx: Context, error: BaseException, inline: bool = False,
             clean: bool = False) -> Entry:
    """The entry of `machine.handle(error, ctx)` (inputs hidden); a failing handle() stops.

    Called off the event loop; an `async def handle` is run on the loop and waited for.
    clean: the thread's connections were clean before the step, so a transaction
    handle() leaves open is rolled back and counts as handle() failing.
    """
    hctx = dataclasses.replace(ctx, awaited=[], all=[], children=[])
    where = f"handle() of {cls.name}.{job.step} (instance {job.id})"
    try:
        if inspect.iscoroutinefunction(machine.handle):
            outcome = aio.run(machine.handle(error, hctx))
        else:
            outcome = machine.handle(error, hctx)
        if clean and db.discard_dangling(where):
            raise TransactionLeftOpen(f"{where} returned inside a transaction; it was rolled back")
        entry = _handle_entry(outcome, cls, job, inline)
    except BaseException as handle_error:
        if clean:
            db.discard_dangling(where)
        return _handle_failed(job, error, handle_error)
    return _with_error(entry, error, machine, job)


def _handle_entry(outcome, cls, job: Claimed, inline: bool = False) -> Entry:
    """`to_entry` of what handle() returned; an outcome that cannot be stored names
    handle() and its definition, not the step it was handling."""
    try:
        return to_entry(outcome, cls, job, consumed=(), presented=(), inline=inline,
                        returner=f"{cls.name}.handle() (handling step {job.step!r})")
    except (InvalidOutcome, SerializationError) as bad:
        raise _located(bad, cls, "handle") from None


async def _arun(cls, job: Claimed, inline: bool = False) -> Entry:
    """`_run` for an `async def` step, on the worker's event loop.

    The step's time budget (`step_timeout`) is enforced by cancelling it (`_within`); it
    then goes to handle() as `gd.StepTimeout`, as a sync step abandoned past its timeout
    does — also when the step ignores the cancellation: it is then left running on the
    loop, its late outcome dropped. Any other asyncio.CancelledError is not an outcome:
    the task was cancelled (shutdown), so it propagates and nothing is committed — the
    lease brings the row back.
    """
    method, machine, ctx, awaited = _prepare(cls, job)
    if method is None:
        return _no_step(cls, job)
    if (exhausted := _exhausted(cls, job)) is not None:
        return exhausted
    timeout = step_timeout(cls, job.step)
    started = time.monotonic()
    try:
        if cls.State is not None:
            ctx.state = load_typed(cls.State, job.state)
        outcome = await _within(getattr(machine, method)(ctx), timeout, job, "step")
        ids = tuple(s.id for s in awaited) if awaited else ()
        try:
            entry = to_entry(outcome, cls, job, consumed=ids, presented=ids, inline=inline)
        except (InvalidOutcome, SerializationError) as bad:
            raise _located(bad, cls, method) from None
        _warn_if_state_dropped(cls, job, ctx, outcome)
        return _with_record(entry, machine)
    except asyncio.CancelledError:
        raise
    except BaseException as error:
        if db.is_connection_error(error) and (retry := connection_retry(error, cls, job)) is not None:
            return retry  # as in _run: retried, not handed to handle()
        hctx = dataclasses.replace(ctx, awaited=[], all=[], children=[])
        if isinstance(error, _Overdue):
            elapsed = time.monotonic() - started
            error = StepTimeout(job.step, timeout, elapsed, cancelled=not error.abandoned)
            telemetry.emit("step.timeout", {"count": 1, "elapsed": elapsed},
                           {"id": job.id, "fsm": job.fsm, "step": job.step, "timeout": timeout})
            try:
                hctx.state = _committed_state(cls, job)
            except BaseException as exc:
                return stop_entry(job, f"{error_text(error)}; its state no longer decodes: {error_text(exc)}")
        waiting = None  # a sync handle(): set once Django's shared sync thread runs it
        try:
            handle = machine.handle
            if inspect.iscoroutinefunction(handle):
                outcome = await _within(handle(error, hctx), timeout, job, "handle()")
            elif type(machine).handle in PURE_HANDLES:
                outcome = handle(error, hctx)  # the built-in ones touch no database
            else:  # a user's sync handle() may use the ORM: Django's rule is off the loop;
                # bounded as an async one is (the shared sync thread may also be held by a step's stuck call)
                waiting = threading.Event()

                def run_handle():
                    waiting.set()
                    return handle(error, hctx)

                outcome = await _within(sync_to_async(run_handle)(), timeout, job, "handle()")
            entry = _handle_entry(outcome, cls, job, inline)
        except asyncio.CancelledError:
            raise
        except _Overdue:
            why = (" (it never started: a sync handle() of an async machine runs on Django's shared sync "
                   "thread, which a sync_to_async call of a step still held; make handle() async def)"
                   if waiting is not None and not waiting.is_set() else "")
            return _handle_failed(job, error, TimeoutError(f"handle() did not return within the step timeout "
                                                           f"of {timeout:g}s{why}"))
        except BaseException as handle_error:
            return _handle_failed(job, error, handle_error)
        return _with_error(entry, error, machine, job)


ASYNC_CANCEL_GRACE = 1.0  # seconds a cancelled async step has to end before it is abandoned


class StepCancelled(Exception):
    """An async step's own code raised asyncio.CancelledError (not a timeout, not a shutdown)."""


class _Overdue(Exception):
    """An async step (or handle()) ran past its time budget; `abandoned`: it ignored its
    cancellation and runs on (else it ended, cancelled)."""

    def __init__(self, abandoned: bool):
        super().__init__()
        self.abandoned = abandoned

    def __str__(self):
        return "ran past its time budget"


# Async steps (and handle()s) abandoned past their timeout that have not ended yet, in
# this process: they still run on the event loop. Read and written on the loop only.
_abandoned_tasks = 0


def abandoned_async_steps() -> int:
    """How many abandoned async steps (and handle()s) of this process still run on its
    event loop (the async counterpart of `Scheduler.stuck`)."""
    return _abandoned_tasks


async def _within(coro, timeout, job: Claimed, what: str):
    """The result of awaiting `coro` (the step's, or handle()'s), run as a task of its own,
    for at most `timeout` seconds (None: unbounded); raises `_Overdue` past it. A step
    still running after SLOW_STEP_SECONDS is reported once (`report_slow`), as a sync
    step is by its queue's feeder.

    Past the budget the task is cancelled. One that ignores the cancellation (catches
    CancelledError and carries on: a bare `except:`, a retry loop) still has not ended
    ASYNC_CANCEL_GRACE seconds later: it is left running on the loop, as an abandoned sync
    step's thread is, logged, counted (`abandoned_async_steps`), and whatever it returns is
    dropped. A step that blocks the loop instead (never awaits) cannot be cancelled: its
    outcome stands, and the overrun is logged. The own task costs ~15 µs a step; awaiting
    the step in ours would leave nothing to return to when it swallows the cancellation."""
    global _abandoned_tasks
    task = asyncio.ensure_future(coro)
    began = time.monotonic()
    slow = get_settings().SLOW_STEP_SECONDS if what == "step" else None
    expired = False
    try:
        if slow is not None and (timeout is None or slow < timeout):
            await asyncio.wait((task,), timeout=slow)
            if not task.done():
                report_slow(job, time.monotonic() - began, slow)
        if not task.done():
            left = None if timeout is None else max(timeout - (time.monotonic() - began), 0.0)
            await asyncio.wait((task,), timeout=left)
        if not task.done():
            expired = True
            task.cancel()
            await asyncio.wait((task,), timeout=ASYNC_CANCEL_GRACE)
    except asyncio.CancelledError:  # the worker's own task (shutdown): the step goes with it
        task.cancel()
        raise
    if not task.done():
        _abandoned_tasks += 1
        logger.warning("async %s %s#%s %s ignored its cancellation at its timeout of %gs: abandoned (it runs on, "
                       "on the event loop; its late outcome is dropped; %d abandoned async step(s) in this "
                       "process)", what, job.fsm, job.id, job.step, timeout, _abandoned_tasks)
        # Its name now: a chain's claim moves on to its next step in place (`continuation`).
        task.add_done_callback(functools.partial(_abandoned_done, f"{job.fsm}#{job.id} {job.step}", what, began))
        raise _Overdue(abandoned=True)
    if expired:
        if task.cancelled() or task.exception() is not None:
            raise _Overdue(abandoned=False)
        return task.result()  # it caught the cancellation and returned at once: its outcome
    if task.cancelled():
        # Not ours (not the budget, and the worker's task was not cancelled, or the wait
        # above would have raised): the step's own code cancelled it (a cancelled helper
        # it awaited). An error of the step, for handle(), not a shutdown to leave to the lease.
        raise StepCancelled(f"the async {what} was cancelled by its own code (asyncio.CancelledError)")
    elapsed = time.monotonic() - began
    if timeout is not None and elapsed > timeout:
        logger.warning("async %s %s#%s %s ran %.1fs without giving the event loop a turn, past its timeout of %gs "
                       "(an async step must await, never block: every other async step waited); its outcome "
                       "stands", what, job.fsm, job.id, job.step, elapsed, timeout)
    return task.result()


def _abandoned_done(name, what, began, task):
    """An abandoned async step (`name`: "fsm#id step") finally ended: say so, and retrieve
    its exception."""
    global _abandoned_tasks
    _abandoned_tasks -= 1
    error = None if task.cancelled() else task.exception()
    logger.warning("abandoned async %s %s ended after %.1fs (%s); its late outcome is dropped (%d abandoned async "
                   "step(s) still run in this process)", what, name, time.monotonic() - began,
                   "cancelled" if task.cancelled() else error_text(error) if error else "returned", _abandoned_tasks)


def report_slow(job: Claimed, elapsed: float, threshold: float) -> None:
    """Report `job`'s step, still running `elapsed` seconds after it started, past
    SLOW_STEP_SECONDS (`threshold`): a WARNING on gen_durable.worker and a `step.slow`
    event (docs/observability.md#slow-steps). Called once per step; the step goes on."""
    attempt_logger.warning(
        "%s#%s step %s attempt %s has been running for %.0f s (SLOW_STEP_SECONDS=%gs) on queue %s",
        job.fsm, job.id, job.step, job.attempt, elapsed, threshold, job.queue,
        extra={"gd_id": job.id, "gd_machine": job.fsm, "gd_step": job.step, "gd_attempt": job.attempt,
               "gd_queue": job.queue, "gd_elapsed": elapsed})
    telemetry.emit("step.slow", {"count": 1, "elapsed": elapsed},
                   {"id": job.id, "fsm": job.fsm, "step": job.step, "attempt": job.attempt,
                    "queue": job.queue, "threshold": threshold})


def _handle_failed(job, error, handle_error) -> Entry:
    entry = stop_entry(job, f"handle() failed: {error_text(handle_error)} "
                            f"(while handling {error_text(error)})")
    entry.traceback = traceback_text(handle_error)
    _log_attempt(job, entry, error, handle_error)
    return entry


def _with_error(entry: Entry, error, machine, job: Claimed) -> Entry:
    if entry.kind in ("retry", "stop"):
        if entry.error is None:
            entry.error = error_text(error)
        # Rides the same flush UPDATE as last_error (no statement more); a handled
        # error that moves on (Next, Await, ...) stores neither.
        entry.traceback = traceback_text(error)
    _log_attempt(job, entry, error)
    return _with_record(entry, machine)


def _with_record(entry: Entry, machine) -> Entry:
    # A machine that keeps an attempt log (gen_durable.tasks) leaves this attempt's
    # record on itself; the flush appends it with the worker and the claim time.
    record = getattr(machine, "_gd_attempt_record", None)
    if record is not None:
        entry.detail = encode(record, f"attempt record of {entry.fsm}#{entry.id}")
    return entry


# --- step timeouts ----------------------------------------------------------------
# The one place that decides a step's time budget and what a timeout turns into; the
# thread scheduler calls it, and so can any other runner of steps (async ones too).

def step_timeout(cls, step: str) -> float | None:
    """Seconds `step` of machine `cls` may run: its own timeout (`@gd.step(timeout=)`,
    `Job.timeout`), else GEN_DURABLE["MAX_STEP_SECONDS"]; None means unbounded."""
    own = cls.timeouts.get(step) if cls is not None else None
    return own if own is not None else get_settings().MAX_STEP_SECONDS


def job_timeout(job: Claimed) -> float | None:
    """`step_timeout` of a claimed row's current step (an unregistered machine: the default)."""
    try:
        cls = registry.get(job.fsm, job.fsm_version)
    except UnknownMachine:
        cls = None
    return step_timeout(cls, job.step)


def past_deadline(started: float, timeout: float | None, now: float) -> bool:
    """Whether a step that started at `started` (time.monotonic()) with `timeout`
    seconds is past its deadline at `now`."""
    return timeout is not None and now - started >= timeout


def execute_timeout(job: Claimed, timeout: float, elapsed: float, finish=None) -> Entry:
    """The outcome of `job`'s step abandoned past `timeout`: `handle(gd.StepTimeout)`.

    Runs handle() like any step error (a Job retries by its backoff until max_attempts;
    a Machine's default handle stops the instance). Never raises Exception. Emits the
    attempt's `step.stop` (its duration counts from the step's start), in this thread,
    which emitted no `step.start`; `finish` as for `execute`.
    """
    handling = time.perf_counter()
    entry = _stamped(_execute_timeout(job, timeout, elapsed), job, time.monotonic() - elapsed)
    abandoned = finish is not None and finish()
    emit_stop(job, ABANDONED if abandoned else entry.kind, elapsed + time.perf_counter() - handling,
              None if abandoned else entry.error)
    return entry


def _execute_timeout(job: Claimed, timeout: float, elapsed: float) -> Entry:
    error = StepTimeout(job.step, timeout, elapsed)
    telemetry.emit("step.timeout", {"count": 1, "elapsed": elapsed},
                   {"id": job.id, "fsm": job.fsm, "step": job.step, "timeout": timeout})
    try:
        cls = registry.get(job.fsm, job.fsm_version)
    except UnknownMachine as exc:
        return stop_entry(job, str(exc))
    machine = cls()
    ctx = Context(id=job.id, step=job.step, state=None, attempt=job.attempt, queue=job.queue,
                  correlation_key=job.correlation_key, machine=machine, database=job.database)
    try:
        ctx.state = _committed_state(cls, job)
    except BaseException as exc:
        return stop_entry(job, f"{error_text(error)}; its state no longer decodes: {error_text(exc)}")
    # On a step thread (clean between steps) a transaction handle() leaves open is
    # rolled back here, as after any step, not blamed on the thread's next step.
    return _handled(machine, cls, job, ctx, error, clean=db.thread_is_clean())


def _committed_state(cls, job: Claimed):
    """`job`'s state as its claim read it (typed by `cls.State`), for handle(StepTimeout):
    not the step's `ctx.state`, which the abandoned step may still be mutating. Raises
    what decoding raises."""
    state = loads(job.raw_state) if job.raw_state is not None else job.state
    return load_typed(cls.State, state) if cls.State is not None else state


@functools.lru_cache(maxsize=1024)
def _step_is_async(cls, step: str) -> bool:
    method = cls.steps.get(step)
    return method is not None and inspect.iscoroutinefunction(getattr(cls, method))


def is_async(job: Claimed) -> bool:
    """Whether `job`'s step is an `async def` (runs on the worker's event loop)."""
    try:
        cls = registry.get(job.fsm, job.fsm_version)
    except UnknownMachine:
        return False
    return _step_is_async(cls, job.step)


async def aexecute(job: Claimed, *, inline: bool = False) -> Entry:
    """`execute` for an `async def` step; awaited on the worker's event loop."""
    telemetry.emit("step.start", {}, {"id": job.id, "fsm": job.fsm, "step": job.step,
                                      "attempt": job.attempt, "queue": job.queue})
    started = time.perf_counter()
    began = time.monotonic()
    try:
        cls = registry.get(job.fsm, job.fsm_version)
    except UnknownMachine as exc:
        entry = stop_entry(job, str(exc))
    else:
        entry = await _arun(cls, job, inline)
    _stamped(entry, job, began)
    telemetry.emit("step.stop", {"duration": time.perf_counter() - started},
                   {"id": job.id, "fsm": job.fsm, "step": job.step, "kind": entry.kind,
                    "attempt": job.attempt, "queue": job.queue, "error": entry.error})
    logger.debug("step %s#%s %s -> %s", job.fsm, job.id, job.step, entry.kind)
    return entry


def connection_retry(error: BaseException, cls, job: Claimed) -> Entry | None:
    """The Retry of a step that lost its database connection; None at the last attempt.

    A retry costs an attempt like any other: at the machine's `max_attempts` (a Job's
    default is 20; a Machine has none unless it sets one) the error goes to handle().
    """
    limit = getattr(cls, "max_attempts", None)
    if limit is not None and job.attempt + 1 >= limit:
        return None
    delay = jittered(min(CONNECTION_RETRY_BASE * 2 ** min(job.attempt, 16), CONNECTION_RETRY_CAP))
    logger.warning("step %s#%s %s lost its database connection (%s); retrying in %.1fs",
                   job.fsm, job.id, job.step, error_text(error), delay)
    telemetry.emit("step.connection_retry", {"delay": delay}, {"id": job.id, "fsm": job.fsm, "step": job.step})
    entry = to_entry(Retry(delay=delay), cls, job, consumed=(), presented=())
    entry.error = error_text(error)
    entry.traceback = traceback_text(error)
    return entry


def _state(value, cls, job, what="state") -> str | None:
    if value is KEEP:
        return None
    return encode_state(value, f"{what} of {cls.name}#{job.id}", get_settings().MAX_PAYLOAD_BYTES, cls.State)


def _check_step(cls, name, outcome):
    if name not in cls.steps:
        raise InvalidOutcome(f"{cls.name}: {type(outcome).__name__} names unknown step {name!r}"
                             + step_suggestion(cls, name) + f" (steps are {sorted(cls.steps)})")


def _check_rate(outcome, cls, job):
    """A weight the bucket can never hold is an error now; an unknown name is reported."""
    if outcome.rate_limit is None:
        return
    limit = get_limits().rate_for(outcome.rate_limit)
    name = name_of(outcome.rate_limit)
    if limit is None:
        telemetry.emit("rate_limit.unknown", {"count": 1},
                       {"key": outcome.rate_limit, "name": name, "fsm": cls.name, "step": job.step})
        logger.warning("%s#%s step %r: Next names rate limit %r, which is not in GEN_DURABLE['RATE_LIMITS']; "
                       "the instance will wait at step %r until it is configured", cls.name, job.id, job.step,
                       name, outcome.step)
    elif outcome.weight > limit.burst:
        raise InvalidOutcome(f"{cls.name}.{job.step}: Next({outcome.step!r}) has weight {outcome.weight:g}, "
                             f"above the burst {limit.burst:g} of rate limit {name!r}; it could never be "
                             "admitted (split the step or raise the burst)")


def inline_kind(outcome: Next, cls, job: Claimed, allowed: bool) -> tuple[bool, str]:
    """(wanted, kind) of a Next: kind "inline" runs the next step in this worker.

    Wanted: `Next(inline=...)`, else the machine's `inline_execution`. Granted only when
    `allowed` (the chain bound, shutdown) and the concurrency key is kept — or released
    while no gate slot is held. A new key must go through the pick: an unconfigured key's
    exclusion is the pick's arbiter, a gate's slot its admission; a released gate slot is
    credited by a requeue's commit.
    """
    wanted = cls.inline_execution if outcome.inline is None else outcome.inline
    if not (wanted and allowed):
        return wanted, "next"
    key = outcome.concurrency_key
    if key is KEEP or (key is None and job.slot is None):
        return True, "inline"
    return True, "next"


def _check_children_database(children, cls, job: Claimed):
    """Raise InvalidOutcome for a child GEN_DURABLE['DATABASES'] routes to another database
    than its parent's: a parent and its children are joined in one transaction, on one
    database (docs/scaling.md)."""
    if job.database is None or not get_settings().DATABASES:
        return
    for row in children:
        routed = routed_alias(row.fsm, row.queue)
        if routed is not None and database_alias(routed) != job.database:
            raise InvalidOutcome(
                f"{cls.name}#{job.id} (database {job.database!r}) schedules a child {row.fsm} (queue {row.queue!r}) "
                f"that GEN_DURABLE['DATABASES'] routes to database {routed!r}: a parent and its children live "
                "on one database; route them together, or insert the other instance with gd.insert() "
                "and signal back")


def to_entry(outcome, cls, job: Claimed, *, consumed, presented, inline=False, returner=None) -> Entry:
    """Validate and encode `outcome` (raises InvalidOutcome / SerializationError).

    inline: whether a Next may become an inline continuation (see `inline_kind`).
    returner: who returned it, for the error of a value that is no outcome (default: the step).
    """
    if isinstance(outcome, Next):
        # Every step of a chain ends here: the Entry is built in one call (no shared
        # dict of common fields unpacked into it).
        step = outcome.step
        _check_step(cls, step, outcome)
        _check_rate(outcome, cls, job)
        key = outcome.concurrency_key
        set_key = key is not KEEP
        wanted, kind = inline_kind(outcome, cls, job, inline)
        return Entry(id=job.id, worker=job.worker, claim=job.claim, kind=kind, step=step,
                     state=_state(outcome.state, cls, job), set_key=set_key, new_key=key if set_key else None,
                     rate_limit=outcome.rate_limit, weight=float(outcome.weight),
                     consumed=consumed, wanted_inline=wanted, fsm=job.fsm, from_step=job.step,
                     queue=job.queue, has_children=bool(job.children), parent_id=job.parent_id,
                     # inline: the held slot goes on with the chain (its commit credits
                     # nothing); an inline outcome that cannot be stored becomes a Stop,
                     # which credits it
                     slot=job.slot)
    if isinstance(outcome, Done):  # a job's outcome: second, and built in one call like a Next's
        return Entry(id=job.id, worker=job.worker, claim=job.claim, kind="done",
                     result=encode(outcome.result, f"result of {cls.name}#{job.id}",
                                   get_settings().MAX_PAYLOAD_BYTES),
                     fsm=job.fsm, from_step=job.step, queue=job.queue, slot=job.slot, parent_id=job.parent_id)
    base = dict(id=job.id, worker=job.worker, claim=job.claim, fsm=job.fsm, from_step=job.step, queue=job.queue, slot=job.slot,
                parent_id=job.parent_id)
    if isinstance(outcome, Retry):
        return Entry(kind="retry", state=_state(outcome.state, cls, job),
                     delay=outcome.delay, **base)
    if isinstance(outcome, Await):
        _check_step(cls, outcome.next, outcome)
        # consume: the handed signals are deleted with the park (flush.sql's consume
        # rider), so none is left to present again.
        return Entry(kind="await", step=outcome.next, state=_state(outcome.state, cls, job),
                     awaits=encode(list(outcome.names), "await names"),
                     timeout=outcome.timeout,
                     presented=() if outcome.consume else presented,
                     consumed=consumed if outcome.consume else (), **base)
    if isinstance(outcome, ScheduleChildren):
        _check_step(cls, outcome.next, outcome)
        children = [build_row(c.machine, **c.kwargs) for c in outcome.children]
        _check_children_database(children, cls, job)
        return Entry(kind="schedule", step=outcome.next, state=_state(outcome.state, cls, job),
                     children=children, consumed=consumed, **base)
    if isinstance(outcome, Stop):
        return Entry(kind="stop", error=outcome.reason, **base)
    called = ""
    if isinstance(outcome, type) and issubclass(outcome, (Next, Retry, Await, ScheduleChildren, Done, Stop)):
        called = f": call it, gd.{outcome.__name__}(...)"  # `return gd.Done`: the class itself
    raise InvalidOutcome(f"{returner or f'{cls.name}.{job.step}'} returned {outcome!r}, which is not an outcome "
                         f"(Next, Retry, Await, ScheduleChildren, Done or Stop){called}")


def continuation(job: Claimed, entry: Entry) -> Claimed:
    """Turn `job`, whose inline `entry` committed, into the claim of the step it
    continues with, in place, and return it.

    The row as the commit left it — a requeue and re-pick would have given the same:
    the committed state, attempt 0, no awaits, the new rate limit and key, and the inbox
    and children the flush loaded right after the commit (`entry.inputs`). The gate
    slot stays held.

    In place: once its inline entry is submitted, nothing reads the claim of the step
    that produced it — the step has returned (an abandoned step's outcome is dropped,
    never committed), and its instance is held by this claim alone — so the next step
    reuses the object instead of copying its ~30 fields (a tenth of a continued step's
    Python, bench/results/history.md "Round 7"). Attributes the scheduler keeps on the claim
    (is_async, chain, checked) are set again by continue_chains. The inbox and children
    lists are the flush's own (or its shared empty tuples): nothing appends to a
    claim's inputs (the step gets copies in its Context).
    """
    raw = entry.state if entry.state is not None else job.raw_state
    # The state is decoded again even when the step kept it: the step may have mutated
    # ctx.state (the claim's own object) before returning.
    job.state = loads(raw) if raw is not None else job.state
    job.inbox, job.children = entry.inputs
    job.step, job.raw_state, job.attempt, job.awaits = entry.step, raw, 0, None
    job.rate_limit, job.weight = entry.rate_limit, entry.weight
    if entry.set_key:
        job.concurrency_key = entry.new_key
    return job


def requeue_entry(job: Claimed) -> Entry:
    """A plain Next into `job`'s own (already committed) step: back to the pick."""
    return Entry(id=job.id, worker=job.worker, claim=job.claim, kind="next", step=job.step, rate_limit=job.rate_limit,
                 weight=float(job.weight), fsm=job.fsm, from_step=job.step, queue=job.queue, slot=job.slot,
                 parent_id=job.parent_id)


__all__ = ["ABANDONED", "Entry", "Row", "StepWhere", "aexecute", "continuation", "emit_stop", "execute", "execute_timeout", "is_async",
           "job_timeout", "past_deadline", "requeue_entry", "step_timeout", "to_entry"]
