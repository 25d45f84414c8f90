"""Internal: one scheduler per queue — feeder, step threads, back-off (SPEC §4.2, §5).

The feeder claims into an in-memory buffer (ceiling concurrency + PREFETCH) and hands
rows to `concurrency` step threads. Every completion wakes it to refill, so
throughput is not bounded by the poll interval. An empty poll on an idle queue
doubles the wait up to MAX_POLL_INTERVAL; any work resets it. A NOTIFY for the queue
wakes it when it has room (behaviours SCH-01/02, PK-04).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections

from .. import db, telemetry
from .claims import pick, reclaim, release
from .executor import execute
from .flusher import FlushError

logger = logging.getLogger("gen_durable.scheduler")

RELEASE_ATTEMPTS = 5  # shutdown release passes over rows locked for a moment; retry them


class Scheduler:
    def __init__(self, queue, concurrency, *, worker_id, prefix, flusher, limiter, settings, using=None):
        self.queue = queue
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.prefix = prefix
        self.flusher = flusher
        self.limiter = limiter
        self.s = settings
        self.using = using
        self.prefetch = settings.PREFETCH
        self.min_demand = min(settings.MIN_DEMAND, concurrency + settings.PREFETCH)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.buffer: list = []
        self.in_flight: dict = {}
        self.completed = 0
        self._tuned = None
        self._thread = threading.Thread(target=self._loop, name=f"gd-sched-{queue}", daemon=True)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix=f"gd-step-{queue}")

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
        with self._lock:
            buffered, self.buffer = self.buffer, []
        ids, released = [j.id for j in buffered], []
        for _ in range(RELEASE_ATTEMPTS):
            try:
                released += release([i for i in ids if i not in released], self.worker_id, self.using)
            except Exception:
                logger.exception("could not release %d buffered rows of %s", len(ids), self.queue)
                break
            if len(released) >= len(ids):
                break
            # release.sql skips rows locked at that instant (SKIP LOCKED) — typically by a
            # heartbeat that read the buffer just before it was emptied. Try the rest again.
            time.sleep(0.02)
        deadline = time.monotonic() + drain_timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        in_flight = len(self.in_flight)
        telemetry.emit("scheduler.drain", {"released": len(released), "in_flight": in_flight}, {"queue": self.queue})
        self._pool.shutdown(wait=False, cancel_futures=True)
        return {"released": len(released), "in_flight": in_flight}

    # --- state ------------------------------------------------------------------
    def held_ids(self) -> list[int]:
        with self._lock:
            return [j.id for j in self.buffer] + list(self.in_flight)

    def idle(self) -> bool:
        return not self.in_flight and not self.buffer

    def demand(self) -> int:
        return self.concurrency + self.prefetch - (len(self.in_flight) + len(self.buffer))

    # --- loop -------------------------------------------------------------------
    def reclaim(self) -> int:
        margin = max(self.s.LEASE_TTL - 2 * self.s.HEARTBEAT_INTERVAL, 0)
        ids = reclaim(self.queue, self.prefix, margin, self.using)
        if ids:
            telemetry.emit("scheduler.reclaimed", {"count": len(ids)}, {"queue": self.queue})
            logger.info("queue %s: reclaimed %d claims of a dead predecessor", self.queue, len(ids))
        return len(ids)

    def _tune_connection(self):
        """Let this feeder's connection commit claims without waiting for the WAL flush.

        A claim need not survive a database crash: a lost claim leaves the row runnable,
        or executing until its lease lapses and the reaper returns it — the step runs
        either way (at-least-once is unchanged). Outcomes are committed by the flusher's
        own connection, synchronously. Saves one fsync wait per pick.
        """
        conn = db.connection(self.using)
        conn.ensure_connection()
        if conn.connection is not self._tuned:
            with conn.cursor() as cur:
                cur.execute("SET synchronous_commit TO off")
            self._tuned = conn.connection

    def run_once(self) -> int:
        """One feeder tick: pick if there is demand, dispatch; return rows claimed."""
        self._tune_connection()
        demand = self.demand()
        claimed = 0
        if demand > 0 and (demand >= self.min_demand or self.idle()):
            started = time.perf_counter()
            jobs = pick(self.queue, demand, self.worker_id, self.s.LEASE_TTL,
                        gates=self.limiter.gate_names(), using=self.using)
            claimed = len(jobs)
            telemetry.emit("pick.stop", {"count": claimed, "demand": demand,
                                         "duration": time.perf_counter() - started},
                           {"queue": self.queue, "worker": self.worker_id})
            with self._lock:
                self.buffer.extend(jobs)
        self._dispatch()
        telemetry.emit("scheduler.saturation", {"in_flight": len(self.in_flight), "buffer": len(self.buffer),
                                                "concurrency": self.concurrency, "prefetch": self.prefetch},
                       {"queue": self.queue})
        return claimed

    def _dispatch(self):
        with self._lock:
            while self.buffer and len(self.in_flight) < self.concurrency:
                job = self.buffer.pop(0)
                self.in_flight[job.id] = job
                self.flusher.step_started()
                self._pool.submit(self._run_step, job)

    def _run_step(self, job):
        submitted = False
        try:
            entry = execute(job)
            submitted = True
            self.flusher.commit(entry)
        except FlushError as exc:
            logger.warning("outcome of %s#%s not committed (%s); its lease will recover it", job.fsm, job.id, exc)
        except BaseException:
            logger.exception("worker thread failed on %s#%s; its lease will recover it", job.fsm, job.id)
        finally:
            if not submitted:
                self.flusher.step_abandoned()
            # Normally `settle` already freed the slot when the flush committed; this
            # covers the paths where no flush did (an error, a failed flush).
            with self._lock:
                freed = self.in_flight.pop(job.id, None) is not None
            close_old_connections()
            if freed:
                self._wake.set()

    def settle(self, ids) -> None:
        """The flush made these rows' outcomes durable: free their slots and refill.

        Called from the flusher thread before it wakes the step threads, so a whole
        flushed batch frees its slots at once and the feeder claims one batch for it
        instead of one small pick per finishing thread.
        """
        with self._lock:
            freed = sum(self.in_flight.pop(i, None) is not None for i in ids)
            self.completed += freed
        if freed:
            self._wake.set()

    def _loop(self):
        interval = self.s.POLL_INTERVAL
        try:
            self.reclaim()
        except Exception:
            logger.exception("start-up reclaim failed for queue %s", self.queue)
        while not self._stop.is_set():
            try:
                claimed = self.run_once()
            except Exception as exc:
                logger.warning("pick on queue %s failed: %s; retrying after back-off", self.queue, exc)
                close_old_connections()
                db.connection(self.using).close()
                claimed = 0
                interval = min(max(interval, self.s.POLL_INTERVAL) * 2, self.s.MAX_POLL_INTERVAL)
            else:
                if claimed or self.in_flight:
                    interval = self.s.POLL_INTERVAL
                else:
                    interval = min(interval * 2, self.s.MAX_POLL_INTERVAL)
            self._wake.wait(interval)
            self._wake.clear()
        db.connection(self.using).close()
