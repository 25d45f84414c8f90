"""Internal: the per-process timer — await deadlines and scheduled rows fire on time.

Each worker process keeps one timer thread. It reads how long until its next deadline
(`sql/next_timers.sql`: the earliest armed Await deadline, and per served queue the
earliest runnable row that is not yet due — a few index probes, flat in the number of
rows) and sleeps until then. On waking it fires what is due: expired Await deadlines
(`expire_awaits`, SKIP LOCKED and guarded by status, so several processes never fire one
twice), a poke of each queue whose scheduled row came due, and the cron schedules whose
tick came (`schedules.fire_due`: once per tick across every process). It wakes early,
re-reading, when a row is scheduled for later (NOTIFY on `gen_durable_timer`), when this
process commits a Retry with a delay or an Await with a timeout, and when the listener
reconnects; it re-reads at least every MAX_SLEEP seconds whatever happens (a deadline
armed by a process that then died, a lost notification). Neither the reaper nor the
poll interval bounds its precision (docs/guide.md "Time").
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import NamedTuple

from .. import db, sql
from ..schedules import fire_due
from . import connections
from .maintenance import expire_awaits
from .roles import Role

logger = logging.getLogger("gen_durable.timer")

MAX_SLEEP = 30.0   # seconds: the longest the timer sleeps without re-reading
MIN_REREAD = 0.05  # seconds between two re-reads caused by notifications (insert bursts)
LEAD = 0.002       # seconds slept past a deadline, so the database's now() has passed it
RETRY = 0.1        # seconds before retrying deadlines another process holds locked
ERROR_BACKOFF = 1.0


class Timers(NamedTuple):
    awaits: float | None   # seconds until the earliest armed await deadline (None: none)
    queues: dict           # queue -> seconds until its earliest not-yet-due runnable row
    schedules: float | None  # seconds until the earliest next tick of the schedules


def next_timers(queues, using=None, schedules=()) -> Timers:
    """Seconds until each timer of a process serving `queues` and firing `schedules`
    (names) is due; queues with no row scheduled for later are absent. One statement."""
    awaits, due, ticks = None, {}, None
    params = {"queues": db.pg_array(sorted(queues)), "schedules": db.pg_array(sorted(schedules))}
    for kind, queue, seconds in db.fetchall(sql.NEXT_TIMERS, params, using):
        if seconds is None:
            continue
        if kind == "await":
            awaits = seconds
        elif kind == "schedule":
            ticks = seconds
        else:
            due[queue] = seconds
    return Timers(awaits, due, ticks)


class Timer(Role):
    """The timer thread of one worker process (see the module docstring).

    queues: the queues this process serves; on_due(queue): called when a scheduled row
    of that queue came due (the supervisor pokes that queue's scheduler); schedules:
    name -> schedules.Schedule, the cron schedules this process fires when due.
    """

    name = "timer"

    def __init__(self, queues, on_due, using=None, schedules=None):
        self.queues = sorted(queues)
        self.on_due = on_due
        self.using = using
        self.schedules = dict(schedules or {})
        self._poke = threading.Event()
        self._targets: dict = {}  # queue -> time.monotonic() instant its next row is due
        self._last_read = -math.inf
        self.reads = 0
        self.fired = 0  # await deadlines this timer fired
        super().__init__("gd-timer")

    def poke(self):
        """Something may have armed an earlier deadline: re-read now (rate-limited)."""
        self._poke.set()

    def stop(self, timeout=5):
        self._stop.set()
        self._poke.set()  # cut the sleep short
        super().stop(timeout)

    def run_once(self) -> float:
        """Fire due queues and await deadlines; return seconds until the next timer."""
        now = time.monotonic()
        for queue, at in list(self._targets.items()):
            if at <= now:
                del self._targets[queue]
                self.on_due(queue)
        awaits, due, ticks = self._read()
        if (awaits is not None and awaits <= 0) or (ticks is not None and ticks <= 0):
            if awaits is not None and awaits <= 0:
                self.fired += len(expire_awaits(self.using))
            if ticks is not None and ticks <= 0:
                fire_due(self.schedules, self.using)
            awaits, due, ticks = self._read()
            # Still due: locked by another process firing them right now; look again soon.
            if awaits is not None and awaits <= 0:
                awaits = RETRY
            if ticks is not None and ticks <= 0:
                ticks = RETRY
        now = time.monotonic()
        self._targets = {q: now + s + LEAD for q, s in due.items()}
        waits = [s + LEAD for s in due.values()]
        if awaits is not None:
            waits.append(max(awaits, 0.0) + LEAD)
        if ticks is not None:
            waits.append(max(ticks, 0.0) + LEAD)
        return min(waits + [MAX_SLEEP])

    def _read(self):
        self._last_read = time.monotonic()
        self.reads += 1
        return next_timers(self.queues, self.using, self.schedules)

    def _loop(self):
        connections.bind("timer", self.using, tag=getattr(self, "tag", None))  # keepalives, statement bounds (docs/reliability.md)
        while not self._stop.is_set():
            try:
                wait = self.run_once()
            except Exception as exc:
                logger.warning("timer read failed: %s; retrying in %.0fs", exc, ERROR_BACKOFF)
                db.connection(self.using).close()
                wait = ERROR_BACKOFF
            if self._poke.wait(wait):
                self._poke.clear()
                # A burst of notifications costs one re-read per MIN_REREAD, never more;
                # a target falling due meanwhile still fires on time.
                spacing = self._last_read + MIN_REREAD - time.monotonic()
                soonest = min(self._targets.values(), default=math.inf) - time.monotonic()
                if spacing > 0:
                    self._stop.wait(max(min(spacing, soonest), 0.0))
        db.connection(self.using).close()
