"""Internal: one scheduler per queue — feeder, step threads, back-off (docs/design.md#pick, docs/design.md#worker).

The feeder claims into an in-memory buffer (ceiling concurrency + PREFETCH);
`concurrency` long-lived step threads take rows from it, run the step and hand the
outcome to the flusher. A row stays "in flight" (held, heartbeated, counted against the
ceiling) until the flush that commits its outcome settles it; the instance never moves
on before that commit (docs/design.md#outcomes), but the thread is free to run another instance's
step meanwhile — no thread sleeps on a commit. Every settled flush wakes the feeder to
refill, so throughput is not bounded by the poll interval. An empty poll on an idle queue
doubles the wait up to MAX_POLL_INTERVAL; any work resets it. A NOTIFY for the queue
wakes it when it has room.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque

from contextlib import nullcontext

from asgiref.sync import sync_to_async
from django.conf import settings as django_settings
from django.db import close_old_connections, connections as django_connections, reset_queries

from .. import db, registry, sql, telemetry
from . import connections
from .claims import abandon, adopt_known, hand_back_all, pick, reclaim, release, still_owned
from .roles import FailureLog
from . import aio
from .executor import (StepWhere, aexecute, continuation, emit_stop, error_text, execute, execute_timeout, is_async,
                       job_timeout, past_deadline, report_slow, requeue_entry, stop_entry)

logger = logging.getLogger("gen_durable.scheduler")

# A margin past any lease: every claim of a process known to be dead is taken.
DEAD_MARGIN = 10 * 365 * 86400.0
RELEASE_ATTEMPTS = 5  # shutdown release passes over rows locked for a moment; retry them
LOCKED_RELEASE_WAIT = 1.0  # seconds shutdown waits at least for rows still locked after those passes
PAUSE_CHECK_INTERVAL = 1.0  # seconds: how stale this scheduler's view of a queue pause may be
# Rows another release handed back that one adoption makes eligible again (at most; the
# queue's demand when larger): adopted rows are ordinary runnable rows any worker that
# knows them claims, so the batch bounds one UPDATE, not this worker's share.
ADOPT_BATCH = 1000
PICK_FAILURE_LOG_INTERVAL = 60.0  # seconds between log lines while picks keep failing
# Rows a pick claims after the limiter denied rows in the previous one, or after it handed
# back rows of machines this release does not know: enough to move such a head out of the
# queue's way (each such row is deferred or handed back once) in few picks.
LIMITED_WINDOW = 500
# A step thread's connections: kept open between steps (whatever CONN_MAX_AGE says),
# checked with a round trip before a step after STEP_HEALTH_CHECK_AFTER s idle (the
# server or a NAT may have dropped it), closed after STEP_IDLE_RELEASE s without work.
STEP_HEALTH_CHECK_AFTER = 1.0
STEP_IDLE_RELEASE = 30.0
# The re-check of prefetched rows before they start (`Scheduler._still_ours`): the claim
# itself proves a row ours, and so does a re-check; a row starts without another probe
# for RECHECK_FRESH s after either. Past that, one statement re-checks the starting row
# with the stale prefetched rows queued behind it that are expected to start within the
# next RECHECK_FRESH s (the rate at which re-checked rows started since the last
# re-check, at least RECHECK_MIN, at most RECHECK_BATCH): a row re-checked further ahead
# would go stale again before it starts and be probed twice (bench/results/history.md, round 6).
# A cancel that commits within the window is caught by the flush guard instead (the step
# runs; its outcome is dropped), as for a running step.
RECHECK_BATCH = 500
RECHECK_MIN = 8
RECHECK_FRESH = 0.05
# The adaptive claim-ahead (PREFETCH / MIN_DEMAND None, the defaults): every
# PREFETCH_WINDOW s the feeder measures the queue's step rate and claims ahead
# PREFETCH_HORIZON s of work at that rate, at most PREFETCH_MAX rows. Short steps get a
# deep buffer (picks of hundreds of rows, a flush batch per pick) — without it a pick
# claims only the slots just freed and the pick → run → flush cycle is latency-bound,
# at a third of the rate (docs/performance.md, "The defaults"); long steps get none, so
# no row waits leased in a buffer while another worker could run it. A buffered row then
# starts within about PREFETCH_HORIZON s, inside RECHECK_FRESH of its claim (no re-check).
PREFETCH_WINDOW = 0.1
# A buffered row beyond what the claim-ahead allows now (the steps turned long after it
# was claimed), or a sync row waiting for the one thread of an async-only queue, that has
# waited HAND_BACK_AFTER s is handed back untouched (runnable, no attempt counted) for
# any worker to take: rows never wait in one worker's buffer while another could run them.
HAND_BACK_AFTER = 1.0
PREFETCH_HORIZON = 0.04
PREFETCH_MAX = 500
# Seconds stop() waits for cancelled async steps to finish their cancellation; one that
# takes longer (it catches CancelledError and goes on) is handed back like a running step.
CANCEL_SETTLE = 1.0


class Abandoned(Exception):
    """Raised in a step thread whose step was abandoned past its timeout: the thread exits."""


class Run:
    """One step thread's current step: when it started and its time budget (seconds).

    `lock` makes the end of a step (active → False, read `abandoned`) and the
    watchdog's decision (active and past its deadline → `abandoned`) exclusive, so a
    step is either finished or abandoned, never both. It is the thread's own lock, not
    the scheduler's: the step threads do not contend on it twice per step. Readers that
    only look (`held_ids`, `next_step_deadline`) see `active` set last and cleared first.
    """

    __slots__ = ("job", "started", "timeout", "active", "abandoned", "handling", "lock", "slow")

    def __init__(self, job, handling=False):
        self.job, self.handling = job, handling
        self.started, self.timeout, self.active, self.abandoned = 0.0, None, False, False
        self.slow = False  # reported past SLOW_STEP_SECONDS (once per step)
        self.lock = threading.Lock()


class TimedOut:
    """A buffered task: run handle(StepTimeout) for a row whose step was abandoned."""

    __slots__ = ("job", "timeout", "elapsed")

    def __init__(self, job, timeout, elapsed):
        self.job, self.timeout, self.elapsed = job, timeout, elapsed

    # What the feeder and the heartbeat read of a held row: the abandoned run's claim.
    id = property(lambda self: self.job.id)
    claim = property(lambda self: self.job.claim)
    session = property(lambda self: self.job.session)
    slot = property(lambda self: self.job.slot)


class Scheduler:
    def __init__(self, queue, concurrency, *, worker_id, prefix, flusher, limiter, settings, predecessors=(),
                 using=None, healthy=None):
        self.queue = queue
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.prefix = prefix
        self.predecessors = tuple(predecessors)  # pids of dead processes whose claims are ours to take
        self.flusher = flusher
        self.limiter = limiter
        self.s = settings
        self.using = using
        # None (the default): sized from the measured step rate (`_adapt`); an int: fixed.
        self._adaptive_prefetch = settings.PREFETCH is None
        self._adaptive_min_demand = settings.MIN_DEMAND is None
        self.prefetch = 0 if self._adaptive_prefetch else settings.PREFETCH
        self.min_demand = 1 if self._adaptive_min_demand else min(settings.MIN_DEMAND, concurrency + self.prefetch)
        self.step_rate = 0.0  # steps/s settled, smoothed over PREFETCH_WINDOW windows (adaptive only)
        self._rate_mark = (time.monotonic(), 0, 0.0, 0)  # (when, completed, step seconds, steps timed)
        self._async_busy, self._async_timed = 0.0, 0  # async steps' seconds and count (under _lock)
        self._thread_busy: dict = {}  # step thread -> (seconds in steps, steps ended): its own writes
        self.flush_allowance = settings.FLUSH["MAX_BATCH"]
        # healthy() is False while the heartbeat has failed for a whole lease: the rows we
        # hold may have been reaped, so no new step starts until it succeeds again.
        self.healthy = healthy or (lambda: True)
        self._lock = threading.Condition()  # guards buffer, in_flight, running
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._stop_steps = False
        self.buffer: deque = deque()
        self.in_flight: dict = {}  # id -> job: taken by a step thread, outcome not yet committed
        self.running = 0
        self.completed = 0
        self._runs: dict = {}  # step thread -> its Run (step timeouts)
        self.stuck = 0  # threads still running a step abandoned past its timeout
        self.timed_out = 0  # steps abandoned past their timeout, in total
        self._paused = False
        self._paused_read = float("-inf")
        self._throttled = False  # the last pick had rows the limiter denied
        self._foreign_head = False  # the last pick handed back rows this release does not know
        self.on_deferred = None  # callback when a pick deferred denied rows (the process timer re-reads)
        self._thread = threading.Thread(target=self._loop, name=f"gd-sched-{queue}", daemon=True)
        # Claimed rows of an unknown machine a pick could not hand back (a row lock held
        # elsewhere): still ours, heartbeated, handed back at the next ticks (`_hand_back_unknown`).
        self._unhanded: dict = {}
        self._steps: list[threading.Thread] = []  # sync step threads, started as sync rows need them
        self._threads = 0  # of them, alive and not stuck on an abandoned step
        # At most this many (the connection budget counts them): one on an async-only queue.
        self.max_threads = registry.step_threads(queue, concurrency)
        self._idle_threads = 0
        self._continuations = 0  # buffered next steps of inline chains (also in in_flight)
        # Whether the buffer may hold async rows: set when one is buffered, so the
        # dispatch scans the buffer for them only then (not on every dispatch).
        self._async_buffered = False
        self._tasks: dict = {}  # token -> concurrent Future of a running async step's task
        self._async_started: dict = {}  # token -> monotonic time that async step started
        # Re-checked rows that started, and (monotonic time, that count) at the last
        # re-check: their start rate sizes the next re-check batch (`_recheck_limit`).
        self._rechecked_starts = 0
        self._recheck_mark = (time.monotonic(), 0)
        # The feeder's connection session: numbered anew whenever its connection is new
        # (a server crash ends every session). Claims made on an earlier session may have
        # been lost with the crash: they go to the next pick as `held` (`_held_claims`).
        self._session, self._session_conn, self._older_claims = 0, None, False

    # --- control -------------------------------------------------------------
    def start(self):
        self._thread.start()
        return self

    def poke(self):
        """A wake-up for this queue arrived (NOTIFY): refill now if there is room."""
        if self.demand() >= self.min_demand or self.idle():
            self._wake.set()

    def stop(self, drain_timeout: float) -> dict:
        """Stop picking, release buffered rows, wait up to `drain_timeout` s for in-flight steps."""
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        locked = []  # rows still locked by another session after the quick passes below
        if self._unhanded:
            self._hand_back_unknown(attempts=RELEASE_ATTEMPTS)
            with self._lock:
                locked = list(self._unhanded.values())  # back to runnable as they were, once free
                self._unhanded.clear()
        with self._lock:
            # Timed-out rows stay: a step thread runs their handle() before it exits.
            buffered = [j for j in self.buffer if not isinstance(j, TimedOut)]
            self.buffer = deque(j for j in self.buffer if isinstance(j, TimedOut))
            self._continuations = 0
        ids, released = [j.id for j in buffered], []
        for _ in range(RELEASE_ATTEMPTS):
            try:
                released += self._release([j for j in buffered if j.id not in released])
            except Exception:
                logger.exception("could not release %d buffered rows of %s", len(ids), self.queue)
                break
            if len(released) >= len(ids):
                break
            # release.sql skips rows locked at that instant (SKIP LOCKED) — typically by a
            # heartbeat that read the buffer just before it was emptied. Try the rest again.
            time.sleep(0.02)
        locked += [j for j in buffered if j.id not in released]
        # Buffered next steps of inline chains were in flight too: released (back at
        # their committed step) or, if that failed, left to their lease.
        chained = [j for j in buffered if getattr(j, "chain", None) is not None]
        self.settle([j.id for j in chained], completed=False, claims=[j.claim for j in chained])
        waiting = len(self.in_flight)  # running, or ended and waiting for their outcome's commit
        if released or waiting:
            logger.info("queue %s: %s released; waiting up to %gs for %s", self.queue,
                        "1 buffered row" if len(released) == 1 else f"{len(released)} buffered rows",
                        round(drain_timeout, 1),
                        "1 step in flight" if waiting == 1 else f"{waiting} steps in flight")
        deadline = time.monotonic() + drain_timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        if locked:
            released += self._release_locked(locked, deadline)
        in_flight = len(self.in_flight)
        telemetry.emit("scheduler.drain", {"released": len(released), "in_flight": in_flight}, {"queue": self.queue})
        with self._lock:
            self._stop_steps = True
            self._lock.notify_all()
            tasks = list(self._tasks.values())
        for task in tasks:  # async steps past the drain: cancelled, nothing commits (the lease recovers them)
            task.cancel()
        # The cancellation is carried out on the loop (its CancelledError may run cleanup
        # code first). Wait, bounded, until the cancelled steps have left (`_async_step`
        # settles them), so the supervisor's hand-back of still-running steps
        # (`abandon_running`) does not take a cancelled one for a running one.
        deadline = time.monotonic() + CANCEL_SETTLE
        while tasks and time.monotonic() < deadline:
            with self._lock:
                if not self._tasks:
                    break
            time.sleep(0.005)
        return {"released": len(released), "in_flight": in_flight}

    def abandon_running(self, drain_timeout: float) -> int:
        """After the drain (and the last flush): hand back the rows whose steps still run.

        They would otherwise keep their lease until it lapsed and the reaper returned
        them; handed back, another worker takes them at once. The attempt counts (the
        step was cut off). Their step threads go on until the process exits; a late
        outcome is refused by the flush guard. Returns the rows handed back.
        """
        with self._lock:
            ids = sorted(self.in_flight)
        if not ids:
            return 0
        try:
            back = abandon(ids, self.worker_id, drain_timeout, self.using, self.limiter)
        except Exception:
            logger.exception("could not hand back %d running steps of %s; their leases will", len(ids), self.queue)
            return 0
        if back:
            logger.warning("queue %s: %s still running after DRAIN_TIMEOUT (%ss) handed back "
                           "(runnable now, attempt counted)", self.queue,
                           "1 step" if len(back) == 1 else f"{len(back)} steps", drain_timeout)
            telemetry.emit("scheduler.abandoned", {"count": len(back)}, {"queue": self.queue})
        return len(back)

    def _release_locked(self, jobs, deadline: float) -> list[int]:
        """Shutdown's last pass over unstarted rows another session kept locked through
        the quick ones (a `gd.signal` inside a long transaction, a `select_for_update`):
        wait for the lock until the drain's deadline (at least LOCKED_RELEASE_WAIT s), so
        they go back to runnable with no attempt spent instead of to the reaper. Rows
        still locked then are named in a WARNING. Returns the ids released."""
        wait = max(deadline - time.monotonic(), LOCKED_RELEASE_WAIT)
        try:
            released = self._release(jobs, wait=wait)
        except Exception:
            logger.exception("could not release %d locked rows of %s", len(jobs), self.queue)
            released = []
        left = sorted(j.id for j in jobs if j.id not in set(released))
        if left:
            logger.warning("queue %s: %d unstarted row(s) stayed locked by another session for %.1fs (a long "
                           "transaction that signalled or selected them for update?) and keep this worker's "
                           "lease: the reaper returns them with an attempt counted (ids %s)", self.queue,
                           len(left), wait, ", ".join(map(str, left[:20])) + (" …" if len(left) > 20 else ""))
        return released

    def _release(self, jobs, wait: float | None = None) -> list[int]:
        """Release buffered rows and credit the gate slots they hold (one transaction on Postgres)."""
        slots = {j.id: j.slot for j in jobs if getattr(j, "slot", None) is not None}
        limiter = self.limiter
        transactional = bool(slots) and limiter is not None and limiter.transactional
        with connections.engine_transaction(self.using) if transactional else nullcontext():
            released = release(jobs, self.worker_id, self.using, wait=wait)
            if slots and limiter is not None:
                limiter.credit([slots[i] for i in released if i in slots])
        return released

    def _hand_back_unknown(self, attempts: int) -> None:
        """Hand back the rows a pick could not (`_unhanded`); those still locked stay,
        while they are ours (one cancelled or reaped meanwhile is let go)."""
        with self._lock:
            jobs = list(self._unhanded.values())
        try:
            stuck = hand_back_all(jobs, self.worker_id, self.using, attempts)
            left = still_owned(stuck, self.worker_id, self.using) if stuck else set()
        except Exception as exc:
            logger.warning("queue %s: could not hand back %d row(s) of unknown machines (%s); retrying",
                           self.queue, len(jobs), exc)
            return
        with self._lock:
            for j in jobs:
                if j.id not in left:
                    self._unhanded.pop(j.id, None)

    # --- state ------------------------------------------------------------------
    def held_ids(self) -> list[int]:
        """Rows to heartbeat: buffered and in flight, less steps running past their
        timeout — a hung step's lease is never renewed past it, whatever else fails.
        A hung run is matched by (id, claim): a newer claim of the same row (this worker
        claimed it again after a crash undid the first claim) is heartbeated."""
        now = time.monotonic()
        with self._lock:
            over: dict = {}  # id -> the newest claim a step past its budget runs under
            for r in self._runs.values():
                if r.active and past_deadline(r.started, r.timeout, now):
                    over[r.job.id] = max(r.job.claim, over.get(r.job.id, r.job.claim))
            held = itertools.chain(self.buffer, self.in_flight.values(), self._unhanded.values())
            return sorted({j.id for j in held if j.id not in over or j.claim > over[j.id]})

    def held_slots(self) -> list:
        """(id, gate slot) of the rows this scheduler holds (buffered or running)."""
        with self._lock:
            jobs = list(self.buffer) + list(self.in_flight.values())
        return [(j.id, j.slot) for j in jobs if getattr(j, "slot", None) is not None]

    def idle(self) -> bool:
        return not self.in_flight and not self.buffer

    def young(self, window: float) -> bool:
        """Whether this queue may hand the flusher another outcome within `window` seconds:
        rows wait in the buffer (the next step starts at once), or a step runs that started
        less than `window` ago. A step that has run longer is not counted — the group
        commit does not hold other outcomes for it (FLUSH.MAX_DELAY). Read without the
        lock: a hint, as the flusher only decides how long to wait."""
        if self.buffer:
            return True
        since = time.monotonic() - window
        return (any(r.active and r.started > since for r in tuple(self._runs.values()))
                or any(t > since for t in tuple(self._async_started.values())))

    def demand(self) -> int:
        """Rows the feeder may claim now.

        Slots are for steps that are running or buffered. A row whose outcome is waiting
        for its flush is still held (heartbeated, counted by `idle`), but its thread is
        free; up to FLUSH.MAX_BATCH such rows do not take a slot, so the next batch is
        claimed and run while the previous one commits.
        """
        waiting = len(self.in_flight) - self.running - self._continuations
        over = waiting - self.flush_allowance
        buffered = len(self.buffer)
        if self.max_threads < self.concurrency and buffered:
            # An async-only queue: sync rows beyond its thread(s) wait for them and must not
            # take the async rows' slots (up to `concurrency` of them; `_hand_back` returns
            # those that wait long).
            sync = sum(1 for j in self.buffer if not getattr(j, "is_async", False))
            buffered -= min(max(sync - self.max_threads, 0), self.concurrency)
        return self.concurrency + self.prefetch - (self.running + buffered + max(over, 0))

    def _hand_back(self, now: float) -> int:
        """Give back buffered rows that wait too long (see HAND_BACK_AFTER); return how many.

        Scans the buffer only when it holds more than the claim-ahead allows, or on an
        async-only queue with buffered rows. Chain continuations and timed-out rows stay.
        """
        with self._lock:
            allowed = max(self.concurrency - self.running, 0) + self.prefetch
            async_only = self.max_threads < self.concurrency
            if len(self.buffer) <= allowed and not (async_only and self.buffer):
                return 0
            old = now - HAND_BACK_AFTER
            surplus = len(self.buffer) - allowed
            def plain(job):
                return not isinstance(job, TimedOut) and getattr(job, "chain", None) is None

            def sync(job):
                return not getattr(job, "is_async", False)

            # Sync rows ahead of each row (nearer the head): past max_threads they wait.
            sync_ahead = sum(1 for j in self.buffer if plain(j) and sync(j)) if async_only else 0
            back, keep = [], []
            for job in reversed(self.buffer):  # the tail: the rows that would start last
                if plain(job) and sync(job):
                    sync_ahead -= 1
                aged = plain(job) and getattr(job, "buffered_at", now) < old
                waits = async_only and sync(job) and sync_ahead >= self.max_threads
                if aged and (surplus > 0 or waits):
                    back.append(job)
                    surplus -= 1
                    continue
                keep.append(job)
            if not back:
                return 0
            keep.reverse()
            self.buffer = deque(keep)
        try:
            released = set(self._release(back))
        except Exception:
            logger.exception("could not hand back %d buffered rows of %s", len(back), self.queue)
            released = set()
        unreleased = [j for j in back if j.id not in released]
        if unreleased:  # still ours (locked at that instant): keep them
            with self._lock:
                self.buffer.extend(unreleased)
                self._dispatch_locked()
        if released:
            telemetry.emit("scheduler.handed_back", {"count": len(released)}, {"queue": self.queue})
            logger.info("queue %s: handed back %d buffered rows that waited over %ss (runnable, no attempt "
                        "counted)", self.queue, len(released), HAND_BACK_AFTER)
        return len(released)

    def paused(self) -> bool:
        """Whether the queue is paused (gd.pause_queue), read at most once a second.

        One primary-key probe of the small pause table per PAUSE_CHECK_INTERVAL, not per
        pick: a pause takes effect within about a second on every worker; rows already
        claimed (buffered or running) finish.
        """
        now = time.monotonic()
        if now - self._paused_read >= PAUSE_CHECK_INTERVAL:
            paused, handed_back = db.fetchone(sql.QUEUE_PAUSED, {"queue": self.queue}, self.using)
            self._paused = bool(paused)
            self._paused_read = now
            if handed_back and not self._paused:
                self.adopt()
        return self._paused

    def adopt(self) -> int:
        """Make rows of this queue that a worker not knowing them handed back (a rolling
        deploy) eligible again when this process knows them; the pick that follows claims
        them. Run when the once-a-second pause read saw such rows, and by a burst before it
        decides that nothing is left. Returns how many rows it adopted (≤ ADOPT_BATCH, or
        the queue's demand when larger)."""
        ids = adopt_known(self.queue, max(self.demand(), ADOPT_BATCH), self.using)
        if ids:
            telemetry.emit("scheduler.adopted", {"count": len(ids)}, {"queue": self.queue})
            logger.info("queue %s: %d rows another worker did not know are runnable again here", self.queue, len(ids))
        return len(ids)

    # --- loop -------------------------------------------------------------------
    def reclaim(self) -> int:
        """Hand back a dead predecessor's claims: on this host, those not renewed for two
        heartbeats; of the processes named in `predecessors` (known dead), all of them."""
        margin = max(self.s.LEASE_TTL - 2 * self.s.HEARTBEAT_INTERVAL, 0)
        ids = reclaim(self.queue, self.prefix, margin, self.using, self.limiter)
        for pid in self.predecessors:
            ids += reclaim(self.queue, f"{self.prefix}{pid}-", DEAD_MARGIN, self.using, self.limiter)
        if ids:
            telemetry.emit("scheduler.reclaimed", {"count": len(ids)}, {"queue": self.queue})
            logger.info("queue %s: reclaimed %d claims of a dead predecessor", self.queue, len(ids))
        return len(ids)

    def _adapt(self, now: float) -> None:
        """Resize the adaptive claim-ahead from the last window's steps.

        The rate is what the queue's slots can run: concurrency / the mean step time of the
        steps that ended in the window (or the settled rate, if higher) — not today's
        throughput alone, which a shallow buffer holds down. prefetch = rate ×
        PREFETCH_HORIZON (at most PREFETCH_MAX); min demand = a quarter of it (at least
        1), so claims come in batches while the buffer still holds three quarters of its
        rows: no step thread waits for a claim, and without claim-ahead a free slot is
        filled at once. The first reading comes as soon as `concurrency` steps ended.
        Fixed settings are left alone.
        """
        then, done, busy0, timed0 = self._rate_mark
        busy, timed = self._busy()
        first = self.step_rate == 0 and timed - timed0 >= self.concurrency
        if now - then < PREFETCH_WINDOW and not first:
            return
        self._rate_mark = (now, self.completed, busy, timed)
        rate = (self.completed - done) / max(now - then, 1e-6)
        if timed > timed0:
            rate = max(rate, self.concurrency * (timed - timed0) / max(busy - busy0, 1e-6))
        # Smoothed, but a rising rate is followed at once: the buffer that lets it rise
        # must not lag it by several windows.
        self.step_rate = rate if rate > self.step_rate else (self.step_rate + rate) / 2
        if self._adaptive_prefetch:
            self.prefetch = min(math.ceil(self.step_rate * PREFETCH_HORIZON), PREFETCH_MAX)
        if self._adaptive_min_demand:
            self.min_demand = max(1, self.prefetch // 4)

    def _busy(self) -> tuple[float, int]:
        """(seconds, count) of the steps that ended on this queue, threads and async."""
        with self._lock:
            accs = tuple(self._thread_busy.values())
            async_busy, async_timed = self._async_busy, self._async_timed
        return sum(a[0] for a in accs) + async_busy, sum(a[1] for a in accs) + async_timed

    def run_once(self) -> int:
        """One feeder tick: pick if there is demand, dispatch; return rows claimed."""
        if not self.healthy():
            return 0
        if self._adaptive_prefetch or self._adaptive_min_demand:
            self._adapt(time.monotonic())
        if self.buffer:
            self._hand_back(time.monotonic())
        if self._unhanded:
            self._hand_back_unknown(attempts=1)
        demand = self.demand()
        claimed = 0
        foreign_head, self._foreign_head = self._foreign_head, False  # set again by this tick's pick
        if demand > 0 and (demand >= self.min_demand or self.idle()) and not self.paused():
            started = time.perf_counter()
            stats: dict = {}
            window = max(demand, LIMITED_WINDOW) if self._throttled or foreign_head else None
            held = self._held_claims()
            jobs = pick(self.queue, demand, self.worker_id, self.s.LEASE_TTL,
                        gates=self.limiter.gate_names(), using=self.using, limiter=self.limiter,
                        window=window, stats=stats, held=held)
            for job in jobs:
                job.session = self._session
            if stats.get("unhanded"):
                with self._lock:
                    self._unhanded.update((j.id, j) for j in stats["unhanded"])
            # A head of rows another release runs (a rolling deploy, web tier first) is
            # handed back a window at a time, and the next pick follows at once: rows this
            # worker knows may wait behind thousands of them.
            self._foreign_head = stats.get("unknown", 0) > 0
            # Widen the next claim only while denied rows dominate the head of the queue.
            denied = stats.get("denied", 0)
            self._throttled = denied > 0 and denied * 2 >= stats.get("claimed", 0)
            if denied and self.on_deferred is not None:
                self.on_deferred()  # they come due at their new eligible_at: wake then, not at the next poll
            claimed = len(jobs)
            telemetry.emit("pick.stop", {"count": claimed, "demand": demand,
                                         "duration": time.perf_counter() - started},
                           {"queue": self.queue, "worker": self.worker_id})
            if jobs:
                any_async = False
                for job in jobs:
                    job.is_async = is_async(job)
                    any_async = any_async or job.is_async
                with self._lock:
                    superseded = self._superseded_locked(jobs) if held else []
                    self._async_buffered = self._async_buffered or any_async
                    # Rows beyond the free slots wait in the buffer (PREFETCH): they
                    # re-check their claim before starting (`_still_ours`).
                    free = max(self.concurrency - self.running - len(self.buffer), 0)
                    claimed_at = time.monotonic()
                    for job in jobs:
                        job.buffered_at = claimed_at
                    for job in jobs[free:]:
                        job.prefetched = True
                        job.checked = claimed_at  # the claim just proved it ours
                    self.buffer.extend(jobs)
                    self._dispatch_locked()
                if superseded and self.limiter is not None and not self.limiter.transactional:
                    # Their admissions ended unstarted; a crash undid the Postgres debit
                    # with the claim, not a Redis slot (docs/design.md, "Claims across a crash").
                    self.limiter.credit_or_log([b.slot for b in superseded if getattr(b, "slot", None) is not None])
        telemetry.emit("scheduler.saturation", {"in_flight": len(self.in_flight), "buffer": len(self.buffer),
                                                "concurrency": self.concurrency, "prefetch": self.prefetch},
                       {"queue": self.queue})
        return claimed

    def _held_claims(self) -> dict | None:
        """{id: claim} of the claims we hold that a server crash may have undone, for pick.

        A claim commits without waiting for the WAL flush (the feeder's connection has
        synchronous_commit off), so a crash can lose it while its step runs here: the row
        is runnable again with its older claim counter, and this worker, claiming it
        again, would get the counter its first run holds — whose late outcome would then
        pass the flush guard. A crash ends the session that made the claim, so only
        claims made on an earlier session of the feeder's connection are suspect (all of
        them behind a transaction pooler, which hides the server's restarts).
        Normally none: one identity check per pick.
        """
        conn = db.connection(self.using)
        conn.ensure_connection()
        if conn.connection is not self._session_conn:
            self._session_conn, self._older_claims = conn.connection, self._session > 0
            self._session += 1
        pooled = connections.pooled()
        if not (self._older_claims or pooled):
            return None
        held: dict = {}
        with self._lock:
            for job in itertools.chain(self.buffer, self.in_flight.values()):
                if pooled or job.session != self._session:
                    held[job.id] = max(job.claim, held.get(job.id, job.claim))
        # Claims only get newer: once none is left from an earlier session, none comes back.
        self._older_claims = bool(held) and not pooled
        return held or None

    def _claimed_again_locked(self, job) -> bool:
        """Whether this worker holds `job`'s row under a newer claim (running or buffered)."""
        running = self.in_flight.get(job.id)
        return ((running is not None and running.claim > job.claim)
                or any(b.id == job.id and b.claim > job.claim for b in self.buffer))

    def _superseded_locked(self, jobs) -> list:
        """Drop (and return) the buffered claims that `jobs` claimed again: a crash undid
        them while they waited here, and the new claim is the one this worker holds, so
        the older must not start too. A TimedOut task stays (`_step_loop` decides)."""
        renewed = {j.id: j.claim for j in jobs}
        gone = [b for b in self.buffer if not isinstance(b, TimedOut) and renewed.get(b.id, -1) > b.claim]
        if gone:
            dropped = {id(b) for b in gone}
            self.buffer = deque(b for b in self.buffer if id(b) not in dropped)
            self._continuations -= sum(1 for b in gone if getattr(b, "chain", None) is not None)
        return gone

    def _dispatch_locked(self):
        """Start what may start now (called with the lock held, whenever rows or slots change).

        A step takes a slot (`running`) when it starts; at most `concurrency` run at
        once. An `async def` step starts at once as a task on the worker's event loop —
        no thread. A sync step is taken by a step thread; threads are started only as
        sync rows need them (up to `concurrency`), so a queue of async steps with a high
        concurrency runs on a handful of threads.
        """
        if not self.buffer or self._stop_steps:
            return
        free = self.concurrency - self.running
        if free <= 0:
            return
        if self._async_buffered:
            keep = deque()
            left = False
            for job in self.buffer:
                if getattr(job, "is_async", False):
                    if free > 0:
                        self._start_async(job)
                        free -= 1
                        continue
                    left = True
                keep.append(job)
            self.buffer = keep
            self._async_buffered = left
        sync = min(len(self.buffer), free)
        if sync:
            spawn = min(sync - self._idle_threads, self.max_threads - self._threads)
            for _ in range(max(spawn, 0)):
                t = threading.Thread(target=self._step_loop, name=f"gd-step-{self.queue}-{len(self._steps)}",
                                     daemon=True)
                self._steps.append(t)
                self._threads += 1
                t.start()
            self._lock.notify(sync)
        if not self.buffer:
            self._wake.set()  # the buffer ran dry: claim the next batch meanwhile

    def _take_locked(self, job):
        if getattr(job, "chain", None) is not None:
            self._continuations -= 1
        self.in_flight[job.id] = job
        self.running += 1

    def _start_async(self, job):
        self._take_locked(job)
        self.flusher.step_started()
        # Keyed by a token of this task, not the row: a chain's next step may start as a
        # task of its own before the task that committed its transition has ended.
        token = object()
        self._async_started[token] = time.monotonic()
        self._tasks[token] = aio.submit(self._async_step(job, token))

    async def _async_step(self, job, token):
        """One async step (and its inline chain) on the event loop; mirrors _step_loop's body."""
        submitted = False
        try:
            # A buffered row is re-checked before it starts, as a sync step's is; a dropped
            # one leaves below like a step that submitted nothing.
            # A fresh row starts without the hop to the engine's thread: only a stale one
            # needs the statement.
            if job.prefetched and not self._fresh(job) and not await aio.engine_call(self._owned, job):
                return
            await self.arun_chain(job)
            submitted = True
        except asyncio.CancelledError:
            logger.warning("async step of %s#%s cancelled at shutdown; its lease will recover it", job.fsm, job.id)
        except BaseException:
            logger.exception("async step failed on %s#%s; its lease will recover it", job.fsm, job.id)
        finally:
            if not submitted:
                self.flusher.step_abandoned()
                self.settle([job.id], completed=False, claims=[job.claim])
            with self._lock:
                self.running -= 1
                self._tasks.pop(token, None)
                started = self._async_started.pop(token, None)
                if started is not None:
                    self._async_busy += time.monotonic() - started
                    self._async_timed += 1
                self._dispatch_locked()

    def _step_loop(self):
        """One sync step thread: take a buffered sync row (or a timed-out row's handle()),
        run its step, hand the outcome on.

        A thread whose step was abandoned past its timeout exits when the step finally
        returns (another thread took its place), dropping the late outcome.
        """
        # This thread's own Django connection: keepalives, kept across steps.
        conn = connections.bind("step", self.using, statements=False, persistent=True, tag=getattr(self, "tag", None))
        db.mark_step_thread()  # every job below ends with discard_dangling
        me = threading.current_thread()
        idle_since = time.monotonic()
        replaced = db.replaced_connections()
        debug = django_settings.DEBUG  # read once: a lazy-settings lookup per step costs ~1 % of it
        owed = False  # the last step's slot, given back with the next take (one lock round)
        try:
            while True:
                with self._lock:
                    freed, owed = owed, False
                    if freed:
                        self.running -= 1
                        if not self.buffer:
                            # The feeder may have looked while this slot was still held
                            # (a flush that settled during the clean-up after the step:
                            # demand 0, nothing claimed): the slot is free now, refill.
                            self._wake.set()
                    self._idle_threads += 1
                    while not self._stop_steps and not (self.buffer and self.running < self.concurrency
                                                        and self.healthy()):
                        if not self._lock.wait(0.5 if self.buffer else STEP_IDLE_RELEASE) and not self.buffer:
                            self._release_idle()
                    self._idle_threads -= 1
                    if not self.buffer:  # stopping (timed-out rows' handle() still runs first)
                        self._runs.pop(me, None)
                        self._threads -= 1
                        break
                    job = self.buffer.popleft()
                    if getattr(job, "is_async", False):  # left in the buffer while slots were full
                        if not self.buffer:
                            self._wake.set()
                        self._start_async(job)
                        continue
                    task = job if isinstance(job, TimedOut) else None
                    job = task.job if task else job
                    if task and self._claimed_again_locked(job):
                        # This worker claimed the row again meanwhile (after a crash undid
                        # the hung run's claim): the newer claim holds it, and the hung
                        # run's StepTimeout outcome would be stale. Drop the task.
                        continue
                    self._take_locked(job)
                    run = self._runs[me] = Run(job, handling=task is not None)
                    if not self.buffer:
                        self._wake.set()  # the buffer ran dry: claim the next batch meanwhile
                    elif freed:
                        self._dispatch_locked()  # slots this thread's take left free
                if time.monotonic() - idle_since > STEP_HEALTH_CHECK_AFTER:
                    self._check_connections()
                if task is None and not self._still_ours(job):
                    continue
                # The flusher waits up to FLUSH.MAX_DELAY for the outcomes of running
                # steps (group commit); the submit, step_abandoned or abandon_overdue
                # below balances this.
                self.flusher.step_started()
                where = StepWhere(job.fsm, job)  # before the step: a continuation reuses the claim
                submitted = False
                try:
                    if task is not None:
                        entry = self._timed(run, job, lambda: execute_timeout(job, task.timeout, task.elapsed,
                                                                              finish=lambda: self._finish(run)))
                        self.flusher.submit(entry)
                    else:
                        self.run_chain(job, run)
                    submitted = True
                except Abandoned:
                    # Abandoned: its slot, flush count and row were handed on by `abandon_overdue`.
                    logger.warning("abandoned step %s#%s %s returned after %.1fs; its late outcome is dropped",
                                   job.fsm, job.id, job.step, time.monotonic() - run.started)
                    with self._lock:
                        self.stuck -= 1
                        self._runs.pop(me, None)
                    break
                except BaseException as exc:
                    # execute() guards the step itself: this is an engine fault. The instance
                    # still gets one recorded outcome instead of a re-run at every lease.
                    logger.exception("step thread failed on %s#%s; failing the instance", job.fsm, job.id)
                    try:
                        self.flusher.submit(stop_entry(job, f"engine error while running step {job.step!r}: "
                                                            f"{error_text(exc)}"))
                        submitted = True
                    except BaseException:
                        logger.exception("could not record the failure of %s#%s; its lease will recover it",
                                         job.fsm, job.id)
                finally:
                    if not submitted and not run.abandoned:
                        self.flusher.step_abandoned()
                        self.settle([job.id], completed=False, claims=[job.claim])
                    owed = not run.abandoned
                    # Like a request boundary: drop a connection the step broke (errors and a
                    # failed health check close it; its age does not, for the engine's alias).
                    if not run.abandoned:
                        # The next step starts clean (`db.mark_step_thread`) whatever path this
                        # one took; then close_old_connections() over what this thread opened.
                        db.discard_dangling(where)
                        for c in db.thread_connections():
                            c.close_if_unusable_or_obsolete()
                    # A connection a step left in a transaction was replaced by a new wrapper
                    # (`db.discard_dangling`, here or in the executor): give that one the step
                    # thread's options too.
                    if db.replaced_connections() != replaced:
                        replaced = db.replaced_connections()
                        if db.connection(self.using) is not conn:
                            conn = connections.bind("step", self.using, statements=False, persistent=True,
                                                    tag=getattr(self, "tag", None))
                    # And like Django after a request: with DEBUG on, every query is kept in
                    # the connection's log until reset (memory grows with each step). Only
                    # DEBUG logs them here (a test's query capture is on its own thread), and
                    # reset_queries walks every alias: not worth it per no-op step otherwise.
                    if debug:
                        reset_queries()
                    idle_since = time.monotonic()
        except BaseException:
            # An engine fault outside any step (the end-of-step connection checks): the
            # thread leaves, giving back the slot it still held and its place, so the
            # dispatch starts another thread; the step's outcome reached the flusher.
            logger.exception("step thread of queue %s failed outside a step; another takes its place", self.queue)
            with self._lock:
                if owed:
                    self.running -= 1
                self._runs.pop(me, None)
                self._threads -= 1
                self._dispatch_locked()
        # Persistent connections (CONN_MAX_AGE) of this thread would outlive it.
        django_connections.close_all()

    @staticmethod
    def _release_idle():
        """No work for a while: give this thread's connections back to the server."""
        for c in django_connections.all(initialized_only=True):
            if c.connection is not None and not c.in_atomic_block:
                c.close()

    @staticmethod
    def _check_connections():
        """After idleness, a round trip tells whether the server still has the connection."""
        for c in django_connections.all(initialized_only=True):
            if c.connection is not None and not c.in_atomic_block and not c.is_usable():
                logger.info("step thread: connection to %r was closed while idle; reconnecting", c.alias)
                c.close()

    def _still_ours(self, job) -> bool:
        """Whether `job` may start (a sync step's row): see `_owned`. A row dropped here
        gives its slot back at once."""
        if not job.prefetched or self._owned(job):
            return True
        self.settle([job.id], completed=False, claims=[job.claim])
        with self._lock:
            self.running -= 1
            self._runs.pop(threading.current_thread(), None)
            self._dispatch_locked()
        return False

    def _fresh(self, job) -> bool:
        """The lock-free first test of `_owned`: a row not lost whose claim or last re-check
        is under RECHECK_FRESH s old, with no re-check of it in flight, may start as it is."""
        checked = job.checked  # before `pending`, as in `_owned`
        if (job.pending is None and not job.lost and checked is not None
                and time.monotonic() - checked <= RECHECK_FRESH):
            if job.rechecked:
                self._rechecked_starts += 1  # unlocked: a lost increment only lowers an estimate
            return True
        return False

    def _owned(self, job) -> bool:
        """Whether this worker still holds `job`, a row claimed beyond the free slots
        (PREFETCH) that waited in the buffer. Once it waited RECHECK_FRESH seconds since
        its claim (or its last re-check), it is re-checked, so a row cancelled while it
        waited does not run its step. One statement re-checks it together with the stale
        prefetched rows queued behind it that are expected to start within RECHECK_FRESH
        (`_recheck_limit`): a prefetch-heavy drain pays no probe for rows that start soon
        after their claim and about one per row for the others, instead of one round
        trip per row (bench/results/history.md#profile). A row that another thread's re-check
        covers waits for that answer; when the statement fails, the starting row runs and
        the others of the batch re-check themselves. Rows claimed for a free slot start at
        once without the check, so with PREFETCH = 0 the hot path is unchanged. Used by sync steps'
        threads and (through aio.engine_call) by async steps. False: logged and reported
        as stale."""
        while True:
            # Fresh (from its claim, a re-check or an inline commit): no lock. A re-check
            # taken on another thread sets `pending` before `checked`, so reading `checked`
            # first and `pending` second never sees its new time without its answer due.
            checked = job.checked
            now = time.monotonic()
            if job.pending is None and (job.lost or (checked is not None and now - checked <= RECHECK_FRESH)):
                if job.rechecked and not job.lost:
                    self._rechecked_starts += 1  # unlocked: a lost increment only lowers an estimate
                break
            with self._lock:
                # A re-check in flight on another thread covers this row: its answer,
                # not the time it was taken, decides (the row waits for it).
                waiting = job.pending
                if waiting is None and (job.lost or (job.checked is not None
                                                     and now - job.checked <= RECHECK_FRESH)):
                    continue  # re-checked by another thread meanwhile
                if waiting is None:
                    self._rechecked_starts += 1
                    behind = (b for b in itertools.islice(self.buffer, RECHECK_BATCH)
                              if getattr(b, "prefetched", False) and not b.lost and b is not job
                              and b.pending is None
                              and (b.checked is None or now - b.checked > RECHECK_FRESH))
                    batch = [job, *itertools.islice(behind, self._recheck_limit(now) - 1)]
                    done = threading.Event()
                    for b in batch:
                        b.pending = done  # first: whoever takes it meanwhile waits for this answer
                        b.rechecked = True
                        b.checked = now  # taken: another step thread does not re-check them too
            if waiting is not None:
                # Bounded by the re-checking thread's statement: its connection's keepalives
                # end a half-open one with an error, which releases the waiters.
                waiting.wait()
                continue  # answered (or failed: then re-checked here)
            try:
                owned = still_owned(batch, self.worker_id, self.using)
            except Exception:
                logger.warning("could not re-check buffered row %s#%s; running it", job.fsm, job.id, exc_info=True)
                for b in batch[1:]:
                    b.checked = None  # not re-checked after all: each re-checks before it starts
                return True
            else:
                for b in batch:
                    if b.id not in owned:
                        b.lost = True  # dropped here or when a step thread takes it
            finally:
                for b in batch:
                    b.pending = None  # after `lost` and `checked`: a waiter reads the answer
                done.set()
            break
        if not job.lost:
            return True
        logger.info("%s#%s was cancelled or lost its claim while buffered; its step %r does not run",
                    job.fsm, job.id, job.step)
        telemetry.emit("outcome.stale", {"count": 1}, {"id": job.id, "fsm": job.fsm, "step": job.step,
                                                       "kind": "unstarted"})
        return False

    def _recheck_limit(self, now: float) -> int:
        """Rows one re-check covers (called with the lock held at each re-check): the
        re-checked rows that started since the last one, per second, times RECHECK_FRESH —
        the rows expected to start while this re-check is fresh — within
        [RECHECK_MIN, RECHECK_BATCH]."""
        since, count = self._recheck_mark
        self._recheck_mark = (now, self._rechecked_starts)
        started, elapsed = self._rechecked_starts - count, now - since
        if started <= 0 or elapsed <= 0:
            return RECHECK_MIN
        return max(RECHECK_MIN, min(RECHECK_BATCH, math.ceil(started / elapsed * RECHECK_FRESH)))

    def _timed(self, run, job, fn):
        """Run `fn()` (one step of `job`) under its time budget; raise Abandoned when the
        watchdog gave up on it meanwhile (its outcome must go nowhere)."""
        timeout = job_timeout(job)
        with run.lock:
            run.job, run.started, run.timeout = job, time.monotonic(), timeout
            run.slow = False
            run.active = True
        try:
            return fn()
        finally:
            abandoned = self._finish(run)
            # This thread's step time (the adaptive claim-ahead): one tuple per thread,
            # replaced whole (a reader sees a step's time with its count); a thread's first
            # entry is added under the lock `_busy` reads under.
            me = threading.current_thread()
            busy, timed = self._thread_busy.get(me, (0.0, 0))
            entry = (busy + time.monotonic() - run.started, timed + 1)
            if timed:
                self._thread_busy[me] = entry
            else:
                with self._lock:
                    self._thread_busy[me] = entry
            if abandoned:
                raise Abandoned()

    @staticmethod
    def _finish(run) -> bool:
        """End `run`'s step (the watchdog can no longer abandon it); return whether it
        was abandoned before. Idempotent: `execute` calls it before its step.stop, so the
        event and the outcome's fate agree, and `_timed` again afterwards."""
        with run.lock:
            run.active = False
            return run.abandoned

    # --- step timeouts ------------------------------------------------------------
    def next_step_deadline(self, now: float) -> float | None:
        """Seconds until the earliest running step reaches its timeout, or SLOW_STEP_SECONDS
        unreported (None: none)."""
        slow = self.s.SLOW_STEP_SECONDS
        with self._lock:
            left = [r.started + r.timeout - now for r in self._runs.values() if r.active and r.timeout is not None]
            if slow is not None:
                left += [r.started + slow - now for r in self._runs.values() if r.active and not r.slow]
        return max(min(left), 0.0) if left else None

    def report_slow(self, now: float | None = None) -> int:
        """Report, once each, the sync steps running for SLOW_STEP_SECONDS or longer
        (`executor.report_slow`; async steps report themselves). Return how many. The step
        keeps running (its timeout, MAX_STEP_SECONDS or its own, still applies)."""
        slow = self.s.SLOW_STEP_SECONDS
        if slow is None:
            return 0
        now = time.monotonic() if now is None else now
        found = []
        with self._lock:
            for r in self._runs.values():
                if r.active and not r.slow and not r.abandoned and now - r.started >= slow:
                    r.slow = True
                    found.append((r.job, now - r.started))
        for job, elapsed in found:
            report_slow(job, elapsed, slow)
        return len(found)

    def abandon_overdue(self, now: float | None = None) -> int:
        """Give up on every step past its timeout; return how many.

        Python cannot stop a thread, so the thread is left to finish and its outcome is
        dropped (`_timed`). Its row is handed to another step thread (which runs
        handle(StepTimeout) and commits that), started if none is idle, so the queue
        keeps its concurrency; the stuck thread is counted in `self.stuck` until it returns.
        An abandoned handle(StepTimeout) itself stops the instance without a third try.
        """
        now = time.monotonic() if now is None else now
        stops = []
        with self._lock:
            overdue = []
            for r in self._runs.values():
                with r.lock:  # against the step ending meanwhile (`_timed`)
                    if r.active and not r.abandoned and past_deadline(r.started, r.timeout, now):
                        r.abandoned = True
                        overdue.append(r)
            for r in overdue:
                self.running -= 1
                self.stuck += 1
                self.timed_out += 1
                if r.handling:
                    stops.append(stop_entry(r.job, f"handle() did not return within the step timeout of "
                                                   f"{r.timeout:g}s after StepTimeout"))
                else:
                    self.buffer.appendleft(TimedOut(r.job, r.timeout, now - r.started))
                    self._lock.notify()
                self._threads -= 1  # stuck: no longer one of the queue's threads
            if overdue:
                self._dispatch_locked()  # a fresh thread for the timed-out rows and the freed slots
        for r in overdue:
            logger.warning("step %s#%s %s ran past its timeout of %gs: abandoned (%d stuck thread(s) on queue %s)",
                           r.job.fsm, r.job.id, r.job.step, r.timeout, self.stuck, self.queue)
            if not r.handling:
                self.flusher.step_abandoned()  # the TimedOut task counts itself when it starts
        for entry, r in zip(stops, [r for r in overdue if r.handling]):
            emit_stop(r.job, entry.kind, now - r.started, entry.error)  # the attempt's outcome, counted once
            self.flusher.submit(entry)  # balances the abandoned handle()'s step_started
        return len(overdue)

    def _may_inline(self, started, steps) -> bool:
        bound = self.s.INLINE
        return (steps < bound["MAX_STEPS"] and time.monotonic() - started < bound["MAX_SECONDS"]
                and not self._stop.is_set())

    def _yielded(self, job, entry, allowed, steps):
        if entry.wanted_inline and entry.kind == "next":
            reason = "key" if allowed else "stopping" if self._stop.is_set() else "bound"
            telemetry.emit("inline.yield", {"steps": steps},
                           {"id": job.id, "fsm": job.fsm, "step": entry.step, "reason": reason})

    def _needs_admission(self, job) -> bool:
        return self.limiter is not None and self.limiter.needs_admission(job)

    def _admit(self, job):
        """Admission of a continued step: True to run it, False to requeue it.

        A limiter that fails is a denial: the row goes back to the pick, which admits it
        (or fails) through the normal path, instead of waiting out its lease.
        """
        try:
            admission = self.limiter.admit([job], self.queue)
        except Exception:
            logger.exception("limiter admission of %s#%s failed; requeueing it", job.fsm, job.id)
            return False
        if job.id not in admission.admitted:
            return False
        if admission.admitted[job.id] is not None:
            job.slot = admission.admitted[job.id]
        return True

    def _requeue(self, job, steps):
        telemetry.emit("inline.yield", {"steps": steps},
                       {"id": job.id, "fsm": job.fsm, "step": job.step, "reason": "throttled"})
        self.flusher.submit(requeue_entry(job))

    def _continued(self, job, steps):
        if telemetry.active():
            telemetry.emit("inline.continue", {"steps": steps},
                           {"id": job.id, "fsm": job.fsm, "from": job.chain[2], "to": job.step})

    def _chain_of(self, job):
        """(started, steps) of the chain `job` is part of: steps counts this one."""
        chain = getattr(job, "chain", None)
        return (chain[0], chain[1]) if chain else (time.monotonic(), 1)

    def _submit(self, job, entry, allowed, started, steps):
        if entry.kind == "inline":
            entry.chain = (started, steps + 1)
        else:
            self._yielded(job, entry, allowed, steps)
        self.flusher.submit(entry)

    def run_chain(self, job, run=None) -> None:
        """Run `job`'s step and hand its outcome to the flusher (one link of a chain).

        An inline continuation is not waited for: the thread goes on with other rows
        while the transition commits (the row stays executing, held by us, its lease
        extended). Only once it has committed does `continue_chains` put the next step
        back in front of the buffer, with the claim it holds — so a stale commit
        (cancelled, reaped, re-claimed) runs nothing more. The next step passes the
        limiter first, here, after that commit: admission stamps rows unguarded, so an
        orphan must never reach it; a denial requeues the row through a plain Next. The
        chain yields after INLINE['MAX_STEPS'] steps or INLINE['MAX_SECONDS'], and when
        the worker stops. Called with one flusher.step_started() pending; returns having
        submitted an outcome; raises with that one still pending. run: the step
        thread's Run (looked up when not given).
        """
        started, steps = self._chain_of(job)
        if steps > 1:
            if self._needs_admission(job) and not self._admit(job):
                return self._requeue(job, steps - 1)
            self._continued(job, steps - 1)
        allowed = self._may_inline(started, steps)
        if run is None:
            run = self._runs.get(threading.current_thread())
        entry = (execute(job, inline=allowed) if run is None  # not on a step thread (tests)
                 else self._timed(run, job, lambda: execute(job, inline=allowed, finish=lambda: self._finish(run))))
        self._submit(job, entry, allowed, started, steps)

    async def arun_chain(self, job) -> None:
        """`run_chain` for `async def` steps, on the event loop: same order, same guard.

        Limiter admission runs off the loop on the engine's own thread (`aio.engine_call`),
        as Django requires of database work from async code.
        """
        started, steps = self._chain_of(job)
        if steps > 1:
            if self._needs_admission(job) and not await aio.engine_call(self._admit, job):
                return self._requeue(job, steps - 1)
            self._continued(job, steps - 1)
        allowed = self._may_inline(started, steps)
        if is_async(job):
            entry = await aexecute(job, inline=allowed)
        else:  # a continuation into a sync step: Django's shared sync thread runs it
            entry = await sync_to_async(execute)(job, inline=allowed)
        self._submit(job, entry, allowed, started, steps)

    def continue_chains(self, entries, committed) -> None:
        """The flush of inline `entries` ended (called by the flusher's on_commit with
        the ids that committed; one lock and one dispatch for the whole flush).

        Committed: the next step goes in front of the buffer as a continuation of the
        same claim (still in flight, heartbeated). Stale: the row is not ours any more;
        it leaves our hands and nothing more runs. A worker stopping meanwhile requeues
        the row with a plain Next instead of running on.
        """
        requeue = []
        with self._lock:
            now = time.monotonic()
            in_flight, front = self.in_flight, self.buffer.appendleft
            stopping = self._stop.is_set()
            continued = any_async = 0
            for entry in entries:
                job = in_flight.get(entry.id)
                if job is None or job.claim != entry.claim:
                    continue  # the row was claimed again meanwhile: the newer claim holds it
                if entry.id not in committed:
                    del in_flight[entry.id]
                    self._wake.set()
                    continue
                nxt = continuation(job, entry)  # the same claim, now at the next step
                # The commit just proved the row ours (the flush is guarded by
                # locked_by), as a claim does: no re-check before it starts (`_owned`).
                nxt.chain = (entry.chain[0], entry.chain[1], entry.from_step)
                nxt.checked, nxt.rechecked = now, False
                continued += 1
                if stopping:
                    requeue.append((entry, nxt))
                    continue
                nxt.is_async = is_async(nxt)
                any_async = any_async or nxt.is_async
                front(nxt)
            self.completed += continued
            self._continuations += continued - len(requeue)
            self._async_buffered = self._async_buffered or bool(any_async)
            self._dispatch_locked()
        for entry, nxt in requeue:
            telemetry.emit("inline.yield", {"steps": entry.chain[1] - 1},
                           {"id": nxt.id, "fsm": nxt.fsm, "step": nxt.step, "reason": "stopping"})
            self.flusher.step_started()
            self.flusher.submit(requeue_entry(nxt))

    def settle(self, ids, completed: bool = True, claims=None) -> None:
        """These rows left our hands: free their slots and wake the feeder to refill.

        Called by the flusher after a flush commits (or fails: the rows then stay
        executing until their lease lapses and the reaper returns them), so a whole
        batch frees its slots at once and the feeder claims one batch for it.
        claims: each id's claim counter (the run that ended): a row this worker claimed
        again meanwhile (after a cancel and retry, or a crash) is held by the newer
        claim, which the older run's end must not drop from in_flight (nor from the
        heartbeat with it).
        """
        with self._lock:
            in_flight = self.in_flight
            if claims is None:
                freed = sum(in_flight.pop(i, None) is not None for i in ids)
            else:
                freed = 0
                for i, claim in zip(ids, claims):
                    job = in_flight.get(i)
                    if job is not None and job.claim == claim:
                        del in_flight[i]
                        freed += 1
            if completed:
                self.completed += freed
        if freed:
            self._wake.set()

    def _loop(self):
        # The feeder's own connection: its commits (claims, releases) need not wait for
        # the WAL flush — a lost claim is recovered by its lease, the step runs either way.
        connections.bind(f"feeder {self.queue}", self.using, relaxed_commit=True, tag=getattr(self, "tag", None))
        interval = self.s.POLL_INTERVAL
        leases_lost = False
        # An outage logs its first failure, one line a minute, and its end (not each retry).
        failures = FailureLog(logger, f"pick on queue {self.queue}", PICK_FAILURE_LOG_INTERVAL)
        try:
            self.reclaim()
        except Exception:
            logger.exception("start-up reclaim failed for queue %s", self.queue)
        while not self._stop.is_set():
            if not self.healthy():
                if not leases_lost:
                    logger.error("queue %s: the heartbeat has failed for a whole lease (%ss); no new steps "
                                 "start until it succeeds again", self.queue, self.s.LEASE_TTL)
                leases_lost = True
            elif leases_lost:
                logger.warning("queue %s: the heartbeat succeeds again; steps resume", self.queue)
                leases_lost = False
            try:
                claimed = self.run_once()
            except Exception as exc:
                failures.failed("pick on queue %s failed: %s; retrying after back-off", self.queue, exc)
                close_old_connections()
                db.connection(self.using).close()
                claimed = 0
                interval = min(max(interval, self.s.POLL_INTERVAL) * 2, self.s.MAX_POLL_INTERVAL)
            else:
                if not leases_lost:  # unhealthy, run_once claims nothing and asks nothing
                    failures.succeeded()
                if self._foreign_head:
                    interval = 0.0  # it handed back a window of foreign rows: more may follow
                elif claimed or self.in_flight:
                    interval = self.s.POLL_INTERVAL
                else:
                    interval = min(interval * 2, self.s.MAX_POLL_INTERVAL)
                if self._paused:  # notice a resume within about a second
                    interval = min(interval, PAUSE_CHECK_INTERVAL)
            # Sleep no later than the next running step's timeout; give up on overdue ones.
            due = self.next_step_deadline(time.monotonic())
            reset_queries()  # DEBUG keeps every query until reset
            self._wake.wait(interval if due is None else min(interval, due + 0.001))
            self._wake.clear()
            self.abandon_overdue()
            self.report_slow()
        db.connection(self.using).close()
        connections.unbind()

    def drop(self, ids) -> int:
        """Forget buffered (unstarted) rows whose lease we lost; return how many."""
        ids = set(ids)
        with self._lock:
            kept = [j for j in self.buffer if j.id not in ids]
            dropped = len(self.buffer) - len(kept)
            self.buffer = deque(kept)
        return dropped
