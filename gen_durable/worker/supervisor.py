"""Internal: host every role of one worker process (docs/design.md#worker).

Connections (docs/design.md#connections): each role has its own Django connection (Django keeps one
per thread), so heartbeats and commits never wait behind step work:
    per process = Σ queue concurrency (sync step threads, started on demand, only if
                  their steps use the DB)
                + 1 for all async steps (Django's shared sync_to_async thread)
                + queues (one scheduler each) + 1 flusher + 1 heartbeat + 1 listener
                + 1 timer + 1 reaper + 1 GC (when enabled here)
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from django.conf import settings as django_settings

from .. import db, registry, schedules, sql
from ..checks import QUEUE_SAMPLE_CAP, describe_rows, describe_stranded, unserved_queues
from ..conf import database_alias, get_settings
from ..limiter import get_limiter, unknown_rate_limits
from . import aio, connections
from .claims import heartbeat
from .flusher import Flusher
from .listener import Listener
from .maintenance import Periodic, make_gc_sweep, reaper_sweep
from .scheduler import Scheduler
from .stopping import StopRequest
from .timers import Timer

logger = logging.getLogger("gen_durable.worker")
MACHINES_LOGGED = 30  # names in the start-up line; the rest are counted
# Seconds past DRAIN_TIMEOUT a stopping process may take for the rest of its shutdown
# (joins, the last flush, hand-back, unregister) before it exits regardless.
SHUTDOWN_GRACE = 10.0
ROLES_JOIN = 5.0  # seconds all background roles together get to leave their loops

# Burst mode's "anything left?": a runnable row counts unless it names a rate limit that
# RATE_LIMITS lacks — such a row is never admitted (the start-up warns of it), and
# waiting for it would keep the burst from ever exiting.
_IDLE_SQL = (
    "SELECT EXISTS (SELECT 1 FROM gen_durable WHERE status = 'runnable' AND queue = ANY (%(q)s::text[]) "
    "AND unknown_since IS NULL AND queue NOT IN (SELECT queue FROM gen_durable_queue_pauses) AND (rate_limit IS NULL OR split_part(rate_limit, ':', 1) = ANY (%(rates)s::text[]))) "
    "OR EXISTS (SELECT 1 FROM gen_durable WHERE status = 'executing' AND queue = ANY (%(q)s::text[]))"
)


BURST_DONE = "burst mode: done"  # why a burst stops once nothing is left that it can run

# `rundurable --burst` exit status when it stops leaving rows of its queues it could not
# run (named in its last log line): distinct from 0 (all done) and 1 (an error).
EXIT_LEFT_WORK = 3

LEFTOVER_WHY = {
    "paused": "the queue is paused (gd.resume_queue)",
    "unknown": "no worker of this release knows their machine, version or step (docs/guide.md, \"Deploying\")",
    "rate_limit": "they name a rate limit GEN_DURABLE['RATE_LIMITS'] lacks",
    "executing": "another worker is running them",
    "later": "due later: a retry's back-off, a schedule, or deferred by the limiter (a weight above its "
             "bucket, the limiter unreachable)",
    "runnable": "due now but not claimed before --max-wait",
}


@dataclass(frozen=True)
class WorkerConfig:
    queues: dict  # name -> concurrency
    reaper: bool = True
    gc: bool = True
    burst: bool = False  # exit 0 once no row of these queues is runnable (and admissible) or executing
    # burst: exit (EXIT_LEFT_WORK) once no step of this worker completed for this many
    # seconds although rows remain (paused queue, limiter down, rows deferred); None: wait
    max_wait: float | None = None
    throughput_every: float = 10.0
    using: str | None = None
    # A child of `rundurable --processes N`: the pid of its parent. When that process is
    # gone (ppid changes), this one drains and exits instead of running on as an orphan.
    parent_pid: int | None = None
    # pids of dead processes of this host (children the parent saw die) whose claims
    # this process takes back at start-up, whatever their lease says.
    predecessors: tuple = ()
    extra: dict = field(default_factory=dict)


class ShutdownGuard:
    """Ends the process at `deadline` (monotonic) if the shutdown has not returned by then.

    Every statement of the shutdown is bounded, but a reconnect (connect_timeout) and
    several bounded steps in a row could still add up: this is the bound whatever the
    network does. Exit code 1; what the shutdown did not finish is recovered by the
    leases (the rows) and by expiry (the registry row).
    """

    def __init__(self, deadline: float, token: str):
        self._done = threading.Event()
        self.deadline, self.token = deadline, token
        threading.Thread(target=self._wait, name="gd-shutdown-guard", daemon=True).start()

    def cancel(self):
        self._done.set()

    def _wait(self):
        if self._done.wait(max(self.deadline - time.monotonic(), 0)):
            return
        logger.error("gen_durable worker %s: shutdown not finished within DRAIN_TIMEOUT + %.0fs (the database "
                     "does not answer?); exiting now, exit code 1 — rows still leased return when their "
                     "leases lapse, the registry row expires", self.token, SHUTDOWN_GRACE)
        logging.shutdown()
        os._exit(1)


def worker_prefix(queue: str) -> str:
    """Host-level prefix of worker ids for `queue` (start-up reclaim matches on it)."""
    return f"{socket.gethostname()}:{queue}:"


def throughput_text(rates: dict) -> str:
    """`queue N steps/s, …` for the periodic log line: whole numbers from 10 steps/s up,
    two significant digits below (a few steps a minute must not read as 0 steps/s)."""
    return ", ".join(f"{q} {r:.0f} steps/s" if r >= 10 or r == 0 else f"{q} {r:.2g} steps/s"
                     for q, r in rates.items())


class Supervisor:
    def __init__(self, config: WorkerConfig):
        self.config = config
        self.s = get_settings()
        self.using = config.using
        self.limiter = get_limiter(self.using)
        self.token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.flusher = Flusher(using=self.using, max_batch=self.s.FLUSH["MAX_BATCH"],
                               max_bytes=self.s.FLUSH["MAX_BYTES"],
                               max_delay=self.s.FLUSH["MAX_DELAY"], limiter=self.limiter,
                               on_commit=self._on_commit, on_failure=self._on_failure,
                               young=lambda window: any(s.young(window) for s in self.schedulers.values()))
        self.schedulers = {
            q: Scheduler(q, n, worker_id=worker_prefix(q) + self.token, prefix=worker_prefix(q),
                         flusher=self.flusher, limiter=self.limiter, settings=self.s,
                         predecessors=config.predecessors, using=self.using, healthy=self.leases_held)
            for q, n in config.queues.items()
        }
        for sched in self.schedulers.values():
            sched.on_deferred = self._poke_timer  # rows the limiter deferred come due on time
        self._stop = StopRequest()  # set from signal handlers: no lock (worker/stopping.py)
        self._stop_signal = None  # the signal that asked this worker to stop (logged as it stops)
        self._stop_reason = None  # or why another part of the process asked it to
        self._roles = []
        self._unserved_logged: set = set()  # queues whose stranded rows were logged (`_warn_of_unserved_queues`)
        self.listener = None
        # Await deadlines and scheduled rows fire on time, reaper or not (docs/guide.md "Time").
        # Cron schedules: every worker process may fire them; the database lets one per tick.
        # With several databases, each schedule fires in the one its machine is routed to.
        self.cron = schedules.for_database(schedules.configured(), self.using)
        self.timer = (Timer(self.schedulers, self._wake, self.using, schedules=self.cron)
                      if self.schedulers or self.cron else None)
        self.heartbeat_role = None
        self._lease_lost = False

    # wake-ups
    def _wake(self, queue):
        sched = self.schedulers.get(queue)
        if sched is not None:
            sched.poke()

    def _wake_all(self):
        for sched in self.schedulers.values():
            sched._wake.set()
        self._poke_timer()

    def _poke_timer(self, *_):
        if self.timer is not None:
            self.timer.poke()

    def _settle(self, entries, completed=True):
        by_queue: dict = {}
        for e in entries:
            ids, claims = by_queue.setdefault(e.queue, ([], []))
            ids.append(e.id)
            claims.append(e.claim)
        for q, (ids, claims) in by_queue.items():
            sched = self.schedulers.get(q)
            if sched is not None:
                sched.settle(ids, completed=completed, claims=claims)

    def _on_commit(self, result, entries):
        # One pass over the batch (it runs on the flusher thread after every flush).
        # An inline entry's row is still ours: its next step goes back to its scheduler
        # (or, if the commit was stale, the row leaves our hands).
        settled, inline, poke = [], {}, False
        committed, schedulers = result.committed, self.schedulers
        for e in entries:
            kind = e.kind
            if kind == "inline":
                if e.queue in schedulers:
                    inline.setdefault(e.queue, []).append(e)
                continue
            settled.append(e)
            # This flush may have armed a deadline earlier than the timer's next one.
            if not poke and ((kind == "retry" and e.delay > 0) or (kind == "await" and e.timeout is not None)):
                poke = e.id in committed
        self._settle(settled)
        for queue, chained in inline.items():
            schedulers[queue].continue_chains(chained, committed)
        for q in result.woken:
            self._wake(q)
        if poke:
            self._poke_timer()

    def _on_failure(self, entries):
        # The rows stay executing; their leases lapse and the reaper returns them.
        self._settle(entries, completed=False)

    def leases_held(self) -> bool:
        """False once the heartbeat has failed for a whole lease: our claims may be gone."""
        role = self.heartbeat_role
        if role is None:
            return True
        lost = time.monotonic() - role.last_ok >= self.s.LEASE_TTL
        if lost:
            self._lease_lost = True
        return not lost

    def _heartbeat(self):
        slots = []
        recovering = self._lease_lost
        held = False
        for sched in self.schedulers.values():
            ids = sched.held_ids()
            held = held or bool(ids)
            if ids:
                kept = set(heartbeat(ids, sched.worker_id, self.s.LEASE_TTL, self.using))
                # Only the slots of rows still ours: a row cancelled or reaped meanwhile
                # (even before its admission) must not keep a slot alive while its
                # wasted step runs on.
                slots += [s for i, s in sched.held_slots() if i in kept]
                if recovering:
                    # Leases lapsed while the heartbeat failed: rows reaped meanwhile may
                    # run elsewhere already. Never start those we no longer own.
                    dropped = sched.drop([i for i in ids if i not in kept])
                    if dropped:
                        logger.warning("queue %s: %d buffered rows lost their lease during the heartbeat "
                                       "outage; not running them", sched.queue, dropped)
        if not held:
            # Nothing to renew: one round trip still proves the heartbeat reaches the
            # database, so a worker whose heartbeat is cut off claims nothing new.
            db.fetchone("SELECT 1", None, self.using)
        self._lease_lost = False
        if slots:
            # Lease-native slots (Redis) expire unless renewed with the rows' leases. An
            # unreachable limiter is not a failed heartbeat: the rows' leases are renewed;
            # the slots lapse (under-admission, the safe side) until it is back.
            try:
                self.limiter.renew(slots)
            except Exception as exc:
                logger.warning("could not renew %d gate slots in the %s limiter (%s); they lapse with their "
                               "lease unless a later heartbeat renews them", len(slots), self.limiter.name, exc)
        self._register()

    def _register(self):
        """Upsert this process's row of the worker registry (the admin overview reads it)."""
        try:
            db.fetchone(sql.WORKER_REGISTER, {
                "id": self.token, "host": socket.gethostname(), "pid": os.getpid(),
                "queues": list(self.schedulers), "stale": 10 * self.s.LEASE_TTL}, self.using)
        except Exception as exc:  # the registry only informs operators; leases do not depend on it
            logger.warning("could not refresh the worker registry: %s", exc)

    def start(self):
        where = db.connection(self.using).settings_dict
        logger.info(
            "gen_durable worker %s starting: database %s (%s on %s:%s), queues %s, lease %ss, heartbeat %ss, "
            "poll %s-%ss, prefetch %s, min demand %s, notify %s, pooler %s, flush %s, reaper %s, gc %s",
            self.token, database_alias(self.using), where.get("NAME"), where.get("HOST") or "local socket",
            where.get("PORT") or 5432, self.config.queues, self.s.LEASE_TTL, self.s.HEARTBEAT_INTERVAL,
            self.s.POLL_INTERVAL, self.s.MAX_POLL_INTERVAL,
            "adaptive (from the step rate)" if self.s.PREFETCH is None else self.s.PREFETCH,
            "adaptive" if self.s.MIN_DEMAND is None else self.s.MIN_DEMAND,
            self.s.NOTIFY, self.s.POOLER or "none", self.s.FLUSH,
            self.s.REAPER if self.config.reaper else "off", self.s.GC if self.config.gc else "off")
        if django_settings.DEBUG:
            logger.warning("DEBUG is on: Django records every query of every connection. The worker "
                           "clears those logs after each step, flush and sweep, but DEBUG slows it "
                           "down; turn it off in production.")
        self._register()
        machines = [f"{name} v{version} (queue {cls.queue})"
                    for (name, version), cls in sorted(registry.all_machines().items())]
        shown = ", ".join(machines[:MACHINES_LOGGED]) + (
            f" and {len(machines) - MACHINES_LOGGED} more" if len(machines) > MACHINES_LOGGED else "")
        logger.info("gen_durable worker %s machines: %s", self.token,
                    shown or "none found (no durable.py was imported: is its app in INSTALLED_APPS?)")
        logger.info("gen_durable worker %s limits (%s limiter): %s", self.token, self.limiter.name,
                    self.limiter.limits.describe())
        try:
            self.limiter.sync_config()
        except Exception as exc:  # visibility only: admission uses this process's settings
            logger.warning("could not record the configured limits: %s", exc)
        self._tag(self.flusher).start()
        for sched in self.schedulers.values():
            self._tag(sched).start()
        self.heartbeat_role = self._tag(Periodic("heartbeat", self.s.HEARTBEAT_INTERVAL, self._heartbeat, self.using))
        self._roles.append(self.heartbeat_role.start())
        if self.cron:
            try:
                schedules.sync(self.cron, self.using)
                logger.info("cron schedules: %s", ", ".join(f"{n} ({s.cron} {s.timezone}, catch_up {s.catch_up})"
                                                            for n, s in sorted(self.cron.items())))
            except Exception:
                logger.exception("could not sync the cron schedules (is migration 0003 applied?); "
                                 "this process will not fire them")
                self.timer.schedules = {}
        if self.timer is not None:
            self._roles.append(self._tag(self.timer).start())
        if self.config.reaper and self.s.REAPER:
            self._roles.append(self._tag(Periodic("reaper", self.s.REAPER["INTERVAL"],
                                                  self._reaper_tick, self.using)).start())
        if self.config.gc and self.s.GC:
            self._roles.append(self._tag(Periodic("gc", self.s.GC["INTERVAL"], make_gc_sweep(
                self.s.GC["RETENTION"], self.s.GC["BATCH"], self.limiter, self.using,
                history=self.s.HISTORY if isinstance(self.s.HISTORY, dict) else None), self.using)).start())
        if self.s.NOTIFY == "postgres" and self.s.POOLER is None and self.schedulers:
            self.listener = self._tag(Listener(self._wake, self._wake_all, self.using,
                                               on_timer=self._poke_timer)).start()
        self._warn_of_stranded_rows()
        return self

    def _warn_of_stranded_rows(self):
        """Log rows nothing will run: unconfigured rate limits, queues no one serves.

        Run once every role has started: the rate-limit scan reads every live row with a
        rate limit (tens of ms at 200k rows), and the first claim need not wait for it.
        """
        try:
            unknown = unknown_rate_limits(self.using)
            if unknown:
                logger.warning("rows name rate limits that GEN_DURABLE['RATE_LIMITS'] lacks: %s; they stay "
                               "runnable and are never admitted until configured", describe_stranded(unknown))
            self._warn_of_unserved_queues()
        except Exception as exc:  # visibility only
            logger.warning("could not check for rows that nothing will run: %s", exc)

    def _warn_of_unserved_queues(self, sweep=False):
        """Log the queues with runnable rows that neither this worker nor QUEUES serves,
        each once in this process's life (at start-up, then with every reaper sweep: rows
        a machine's misspelt `queue` sends there after the start are reported too). A
        sweep passes over EXTRA_QUEUES (other deployments serve them, by declaration) and
        the queues logged already. Statements: 1 (+1 when a new queue is unserved).
        Raises DatabaseError."""
        served = set(self.schedulers) | set(self.s.QUEUES if isinstance(self.s.QUEUES, dict) else ())
        extra = self.s.EXTRA_QUEUES if sweep and isinstance(self.s.EXTRA_QUEUES, (list, tuple)) else ()
        new = unserved_queues(served | self._unserved_logged, self.using, patterns=extra)
        self._unserved_logged |= {w[0] for w in new}
        if new:
            logger.warning("runnable rows wait in queues that neither this worker nor "
                           "GEN_DURABLE['QUEUES'] serves: %s (a misspelt queue on a machine or at insert? "
                           "`manage.py check --database %s` reports them as W006)",
                           describe_stranded(new, QUEUE_SAMPLE_CAP), database_alias(self.using))

    def _reaper_tick(self):
        reaper_sweep(self.using, self.limiter)
        try:
            self._warn_of_unserved_queues(sweep=True)
        except Exception as exc:  # visibility only: the sweep itself succeeded
            logger.debug("could not check for queues no one serves: %s", exc)

    def _tag(self, role):
        """Our token joins the application_name of the role's connection (pg_stat_activity)."""
        role.tag = self.token
        return role

    def request_stop(self, signum=None, frame=None, *, reason=None):
        """Ask the worker to drain and stop (a signal handler: `signum` is the signal, if
        any; `reason`, else the signal, is logged by the run loop as the drain begins,
        since a handler must not write to the log itself, nor take any lock)."""
        if isinstance(signum, int) and self._stop_signal is None:
            self._stop_signal = signum
        if reason is not None and self._stop_reason is None:
            self._stop_reason = reason
        self._stop.set()

    def _log_stopping(self, why: str | None) -> str:
        """One line as the drain begins: why (returned). What each queue releases and
        waits for is counted by its scheduler once it has stopped taking rows
        (`Scheduler.stop`)."""
        if why is None and self._stop_signal is not None:
            try:
                why = f"received {signal.Signals(self._stop_signal).name}"
            except ValueError:
                why = f"received signal {self._stop_signal}"
        why = why or self._stop_reason or "asked to stop"
        logger.info("gen_durable worker %s stopping (%s): no new claims; its buffered rows are released and "
                    "its running steps get up to %gs (DRAIN_TIMEOUT) to finish", self.token, why,
                    self.s.DRAIN_TIMEOUT)
        return why

    def stop(self, deadline: float | None = None):
        """Drain and stop every role; hand back what still runs; leave the registry.

        `deadline` (monotonic; `run()` passes SIGTERM + DRAIN_TIMEOUT + SHUTDOWN_GRACE):
        the roles are joined and this thread's statements are watched no longer than
        that, so a database that stopped answering cannot hold the shutdown.
        """
        if deadline is None:
            deadline = time.monotonic() + self.s.DRAIN_TIMEOUT + SHUTDOWN_GRACE
        watch = db.engine_thread.watch
        if watch is not None:
            watch.until = deadline - 1.0  # the last second is the exit's
        for sched in self.schedulers.values():  # stop picking first (docs/design.md#worker)
            sched._stop.set()
            sched._wake.set()
        # Tell every background role at once, then wait for them within one budget: a
        # role stuck in a statement on a silent connection (its watchdog cuts it after
        # STATEMENT_TIMEOUT + 2 s) must not cost its join timeout once per role.
        others = [r for r in self._roles if r.name != "heartbeat"] + ([self.listener] if self.listener else [])
        for role in others:
            role._stop.set()
            if role is self.timer:
                role._poke.set()
        joined_by = min(time.monotonic() + ROLES_JOIN, deadline)
        for role in others:
            role._thread.join(max(joined_by - time.monotonic(), 0))
        # One drain for every queue (their steps run at once), not DRAIN_TIMEOUT each.
        drained_by = time.monotonic() + self.s.DRAIN_TIMEOUT
        results = {q: s.stop(max(drained_by - time.monotonic(), 0)) for q, s in self.schedulers.items()}
        for role in self._roles:
            if role.name == "heartbeat":
                role.stop(timeout=max(min(5, deadline - time.monotonic()), 0))
        self.flusher.stop(timeout=max(min(5, deadline - time.monotonic()), 0))
        # Steps still running after the drain and the last flush: hand their rows back
        # (runnable now, attempt counted) rather than leave them leased until the reaper.
        for sched in self.schedulers.values():
            sched.abandon_running(self.s.DRAIN_TIMEOUT)
        # A row left behind (no time left, or no answer) is harmless: the overview counts
        # a worker live only while its heartbeat refreshes the row (LEASE_TTL), and the
        # next worker to register prunes it after 10 × LEASE_TTL.
        for retry in (False, True):
            if time.monotonic() >= deadline - 1.0:
                break
            try:
                db.execute(sql.WORKER_UNREGISTER, {"id": self.token}, self.using)
                break
            except Exception as exc:
                if not retry and db.is_connection_error(exc):
                    # The connection died while the worker ran (a server restart): one
                    # more try on a new one, within the shutdown's deadline.
                    db.connection(self.using).close()
                    continue
                logger.warning("could not remove worker %s from the registry (the row expires): %s",
                               self.token, exc)
                break
        try:
            aio.close_sync_thread_connections()
        except Exception:
            logger.exception("could not close the async steps' database connection")
        logger.info("gen_durable worker %s stopped: %s", self.token, results)
        return results

    def leftovers(self) -> list[tuple[str, str, int, int]]:
        """(queue, reason, rows, an example id) of the rows of this worker's queues still
        runnable or executing (sql/burst_leftovers.sql; reasons: LEFTOVER_WHY)."""
        rates = db.pg_array(sorted(self.limiter.limits.rates))
        return [tuple(r) for r in db.fetchall(sql.BURST_LEFTOVERS, {"q": list(self.schedulers), "rates": rates},
                                              self.using)]

    def log_leftovers(self, stopped: str | None = None) -> bool:
        """Log what a burst leaves behind and why; True when it leaves anything.
        `stopped`: why the burst was stopped before it was done (a signal): rows due now
        were left because of it, not because it could not run them."""
        rows = self.leftovers()
        if not rows:
            return False
        why_text = dict(LEFTOVER_WHY, runnable="due now: the worker was stopped first") if stopped else LEFTOVER_WHY
        summary = "; ".join(f"queue {q}: {describe_rows(n, example)}: {why_text.get(why, why)}"
                            for q, why, n, example in rows)
        if stopped:
            logger.warning("burst mode: stopped (%s) before its queues were done: leaving %s (exit status %d)",
                           stopped, summary, EXIT_LEFT_WORK)
        else:
            logger.warning("burst mode: leaving rows this worker could not run: %s (exit status %d)",
                           summary, EXIT_LEFT_WORK)
        return True

    def _stopped_burst_code(self, why: str) -> int:
        """The exit code of a burst stopped before it was done (SIGTERM, SIGINT, its
        parent gone): EXIT_LEFT_WORK when rows of its queues remain — a script must not
        read the stop as "all done" — or when what remains cannot be read; else 0."""
        try:
            return EXIT_LEFT_WORK if self.log_leftovers(stopped=why) else 0
        except Exception as exc:
            logger.warning("burst mode: stopped (%s) before its queues were done; could not read what it leaves "
                           "(%s): exit status %d", why, exc, EXIT_LEFT_WORK)
            return EXIT_LEFT_WORK

    def is_idle(self) -> bool:
        if any(not s.idle() for s in self.schedulers.values()):
            return False
        rates = db.pg_array(sorted(self.limiter.limits.rates))
        row = db.fetchone(_IDLE_SQL, {"q": list(self.schedulers), "rates": rates}, self.using)
        return not row[0] and not self.adopt_handed_back()

    def adopt_handed_back(self) -> int:
        """Adopt, in every queue, the rows an older release handed back that this one
        knows; return how many. They wait out of the pick's range until a pause read
        adopts them, a batch a second: a burst that found nothing else left adopts them
        now rather than leave them as "no worker of this release knows" them."""
        return sum(s.adopt() for s in self.schedulers.values())

    def run(self, install_signals=True) -> int:
        """Run until SIGTERM/SIGINT (or, in burst mode, until idle); return the exit code."""
        before = _install_stop_handlers(self.request_stop) if install_signals else None
        # The main thread's connection (registry, burst idle checks, the shutdown's
        # release / hand-back / unregister) gets what every role's has: keepalives,
        # tcp_user_timeout, server-side timeouts and the watchdog.
        main = db.connection(self.using)
        own_settings = main.settings_dict
        connections.bind("main", self.using, tag=self.token)
        try:
            return self._run()
        finally:
            # A caller in-process (call_command) gets its thread's connection back as it
            # was, and its signal handlers.
            main.close()
            main.settings_dict = own_settings
            connections.unbind()
            _restore_handlers(before)

    def _run(self) -> int:
        self.start()
        last = time.monotonic()
        done_before = {q: 0 for q in self.schedulers}
        progress = (0, time.monotonic())  # (steps completed, when that count last changed): --max-wait
        code, why = 0, None
        while not self._stop.wait(min(self.s.POLL_INTERVAL, 1.0)):
            dead = self.dead_threads()
            if dead:
                # Without its flusher nothing commits, without a feeder its queue is
                # never claimed — while the heartbeat keeps every held row leased. Stop,
                # so the rows are handed back and whatever runs this process restarts it.
                logger.error("worker %s: the %s thread died (see the traceback above); stopping, exit code 1",
                             self.token, " and ".join(dead))
                code, why = 1, f"the {' and '.join(dead)} thread died"
                break
            now = time.monotonic()
            if now - last >= self.config.throughput_every:
                rates = {q: (s.completed - done_before[q]) / (now - last) for q, s in self.schedulers.items()}
                if any(rates.values()):
                    logger.info("throughput: %s", throughput_text(rates))
                done_before = {q: s.completed for q, s in self.schedulers.items()}
                last = now
            if self.config.parent_pid is not None and os.getppid() != self.config.parent_pid:
                logger.warning("parent process %s is gone; draining and stopping", self.config.parent_pid)
                why = f"parent process {self.config.parent_pid} is gone"
                break
            if self.config.burst:
                done_now = sum(s.completed for s in self.schedulers.values())
                if done_now != progress[0] or any(not s.idle() for s in self.schedulers.values()):
                    progress = (done_now, now)
                try:
                    waited = now - progress[1]
                    if self.is_idle() or (self.config.max_wait is not None and waited >= self.config.max_wait):
                        logger.info("burst mode: nothing left that this worker can run in queues %s "
                                    "(no executing rows, no runnable ones it can admit%s); stopping",
                                    ", ".join(self.schedulers),
                                    "" if waited < (self.config.max_wait or float("inf"))
                                    else f"; no progress for --max-wait {self.config.max_wait:g} s")
                        self._warn_of_stranded_rows()  # what it leaves behind, if anything
                        if self.log_leftovers():
                            code = EXIT_LEFT_WORK
                        why = BURST_DONE
                        break
                except Exception as exc:
                    logger.warning("idle check failed: %s", exc)
                    db.connection(self.using).close()
        why = self._log_stopping(why)
        deadline = time.monotonic() + self.s.DRAIN_TIMEOUT + SHUTDOWN_GRACE
        guard = ShutdownGuard(deadline, self.token)
        self.stop(deadline)
        guard.cancel()
        if self.config.burst and not code and why != BURST_DONE:
            code = self._stopped_burst_code(why)
        return code

    def dead_threads(self) -> list[str]:
        """The engine threads a worker cannot go on without that have died: the flusher and
        the queues' feeders (an exception the loop did not expect)."""
        dead = [] if self.flusher.alive() else ["flusher"]
        return dead + [f"feeder {q}" for q, s in self.schedulers.items() if not s._thread.is_alive()]


def run_several(configs: list[WorkerConfig], prepare: dict | None = None) -> int:
    """Run one Supervisor per config (each on its own database, `config.using`) in this
    process until SIGTERM/SIGINT; return the first non-zero exit code, else 0.

    Each database gets the whole set of roles (schedulers, flusher, heartbeat, timer and
    cron, reaper, GC, listener, limiter) on its own connections: leases, timers and
    limits are per database, as the rows are. When one supervisor stops with an error
    (a dead engine thread) the others are stopped too, so whatever runs this process
    restarts all of it. In burst mode each stops once its own database is idle, and the
    call returns when all have: one that leaves rows it cannot run (EXIT_LEFT_WORK)
    stops only itself. The exit code is an error's (1) before EXIT_LEFT_WORK.

    `prepare` (alias -> callable): what must happen, in that worker's thread, before the
    worker of a database starts — `rundurable` waits there for a database that was down
    at start-up, so that it holds up no other. Called with the worker's stop request
    (`wait(seconds) -> bool`); it returns None for the worker to start, else the exit
    code to end with instead (non-zero stops the others, as an error does).
    """
    sups = [Supervisor(c) for c in configs]
    codes: list = [None] * len(sups)

    def stop_all(signum=None, frame=None, *, reason=None):
        for sup in sups:
            sup.request_stop(signum, reason=reason)

    def run(i):
        try:
            before = (prepare or {}).get(sups[i].using)
            codes[i] = before(sups[i]._stop) if before is not None else None
            if codes[i] is None:
                codes[i] = sups[i].run(install_signals=False)
        except Exception:
            logger.exception("worker for database %r failed", database_alias(sups[i].using))
            codes[i] = 1
        if codes[i] and codes[i] != EXIT_LEFT_WORK:
            stop_all(reason=f"the worker for database {database_alias(sups[i].using)!r} stopped with an error")

    before = _install_stop_handlers(stop_all)
    threads = [threading.Thread(target=run, args=(i,), name=f"gd-db-{database_alias(s.using)}")
               for i, s in enumerate(sups)]
    for t in threads:
        t.start()
    # Join with a timeout: the main thread must stay able to take the signals.
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(0.2)
    finally:
        _restore_handlers(before)
    return next((c for c in codes if c and c != EXIT_LEFT_WORK), EXIT_LEFT_WORK if EXIT_LEFT_WORK in codes else 0)


def _install_stop_handlers(handler) -> dict:
    """SIGTERM and SIGINT call `handler` (which must take no lock); return the handlers
    they had, for `_restore_handlers`."""
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_handlers(before: dict | None):
    for sig, handler in (before or {}).items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
