"""`manage.py rundurable`: run gen_durable workers (docs/design.md#worker)."""

from __future__ import annotations

import argparse
import difflib
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DEFAULT_DB_ALIAS

from gen_durable.conf import get_settings
from gen_durable.worker.supervisor import EXIT_LEFT_WORK, SHUTDOWN_GRACE


# Supervision of `--processes N` children (seconds): first back-off and its cap, the run
# time after which a child counts as stable (its slot's back-off resets), and how many
# rapid deaths in a row of one slot stop the host with a non-zero exit.
RESTART_BACKOFF = (1.0, 30.0)
STABLE_AFTER = 60.0
MAX_RAPID_DEATHS = 5
# A child that cannot bind its metrics port (taken while it was restarted) runs on without
# its endpoint and tries the port again: first wait and its cap (seconds).
METRICS_RETRY = (1.0, 30.0)


# Start-up against a database that is down: first wait and its cap (seconds).
CONNECT_BACKOFF = (0.5, 30.0)
# What the server answers when the settings, not its state, are wrong: waiting would
# never end (psycopg gives no SQLSTATE for a refused connection, so the message decides).
PERMANENT = ("does not exist", "password authentication failed", "no pg_hba.conf entry")


def _configure_logging(verbosity):
    level = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}[verbosity]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
    logging.getLogger("gen_durable").setLevel(level)


def _connect_once(alias: str) -> str | None:
    """Open a connection to `alias`: None when it opened, else why not (closed again).
    CommandError when the server answers that the settings are wrong (PERMANENT)."""
    from django.db import OperationalError, connections

    conn = connections[alias]
    try:
        conn.ensure_connection()
        return None
    except OperationalError as exc:
        conn.close()
        reason = " ".join(str(exc).split()) or type(exc).__name__
        if any(p in reason for p in PERMANENT):
            raise CommandError(f"database {alias!r}: {reason[:300]} — not retrying: create the database "
                               "(createdb, CREATE DATABASE) or fix DATABASES (NAME, USER, PASSWORD)") from None
        return reason[:300]


def wait_for_database(alias: str, stop=None, *, failed: int = 0) -> int | None:
    """Return once a connection to `alias` opens; until then retry with a capped back-off
    (CONNECT_BACKOFF), one warning line per failed attempt. Returns the attempts made, or
    None when `stop` (a StopRequest, or anything with `wait(seconds) -> bool`) was set
    while it waited. `failed`: attempts the caller made already (the first new one comes
    after the back-off they earned). With `stop`, the caller says when it is up.

    Only a failure to connect is retried (the server is down, starting, refusing or
    unreachable); SIGTERM/SIGINT end the wait as they end the process. A server that
    answers that the database or role does not exist, or refuses the credentials,
    raises CommandError at once (exit code 1): the settings are wrong, not the server.
    """
    log = logging.getLogger("gen_durable.worker")
    attempt, delay = failed, min(CONNECT_BACKOFF[0] * 2 ** max(failed - 1, 0), CONNECT_BACKOFF[1])
    while True:
        if attempt:
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):
                return None
            delay = min(delay * 2, CONNECT_BACKOFF[1])
        attempt += 1
        reason = _connect_once(alias)
        if reason is None:
            if attempt > 1 and stop is None:
                log.info("database %r is up after %d attempts; starting", alias, attempt)
            return attempt
        log.warning("database %r unavailable (attempt %d: %s); retrying in %.1fs", alias, attempt, reason, delay)


class _Deadline:
    """A stop request (`wait(seconds) -> bool`) that also ends `seconds` from now."""

    def __init__(self, stop, seconds: float):
        self.stop, self.deadline = stop, time.monotonic() + seconds

    def wait(self, seconds: float) -> bool:
        left = self.deadline - time.monotonic()
        return left <= 0 or self.stop.wait(min(seconds, left)) or time.monotonic() >= self.deadline


class Late(list):
    """The aliases `wait_for_any_database` found down, and how many attempts it made."""

    def __init__(self, aliases=(), attempts: int = 0):
        super().__init__(aliases)
        self.attempts = attempts


def wait_for_any_database(aliases: list[str], max_wait: float | None = None) -> Late | None:
    """Return once a connection to at least one of `aliases` opens: the aliases still
    down then, in order (their workers wait for them in the background: `handle`).
    None when `max_wait` seconds (`rundurable --burst --max-wait`) passed with every one
    still down.

    One alias: `wait_for_database` (returns []). Several: every alias is tried each
    round, one warning line per one that failed, rounds spaced by CONNECT_BACKOFF — one
    server down must not keep the others' rows waiting. CommandError as for
    `wait_for_database`, for any alias, on the first round it answers. `.attempts` of
    the list: the rounds made (a late alias's wait goes on from there).
    """
    log = logging.getLogger("gen_durable.worker")
    deadline = None if max_wait is None else time.monotonic() + max_wait
    if len(aliases) == 1:
        if deadline is None:
            wait_for_database(aliases[0])
            return Late()
        attempts = wait_for_database(aliases[0], stop=_Deadline(threading.Event(), max_wait))
        if attempts is None:
            return None
        if attempts > 1:
            log.info("database %r is up after %d attempts; starting", aliases[0], attempts)
        return Late()
    attempt, delay = 0, CONNECT_BACKOFF[0]
    while True:
        attempt += 1
        down = []
        for alias in aliases:
            reason = _connect_once(alias)
            if reason is not None:
                down.append(alias)
                log.warning("database %r unavailable (attempt %d: %s)%s", alias, attempt, reason,
                            "" if len(down) < len(aliases) else f"; no database is up, retrying in {delay:.1f}s")
        if len(down) < len(aliases):
            if down:
                one = len(down) == 1
                log.warning("starting the workers of %s; %s %s down: %s worker starts once it is up (retrying "
                            "in the background)", ", ".join(repr(a) for a in aliases if a not in down),
                            ", ".join(map(repr, down)), "is" if one else "are", "its" if one else "each one's")
            elif attempt > 1:
                log.info("databases %s are up after %d attempts; starting", ", ".join(map(repr, aliases)), attempt)
            return Late(down, attempt)
        if deadline is not None and time.monotonic() + delay >= deadline:
            time.sleep(max(deadline - time.monotonic(), 0))
            if all(_connect_once(alias) is not None for alias in aliases):
                return None
            continue  # one came up at the last moment: the next round starts it
        time.sleep(delay)
        delay = min(delay * 2, CONNECT_BACKOFF[1])


def queue_spec(value: str) -> tuple[str, int | None]:
    """argparse type for --queue NAME[=CONCURRENCY]."""
    name, _, conc = value.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"--queue needs a name, got {value!r}")
    if conc:
        try:
            n = int(conc)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--queue {name}=N needs an integer N, got {conc!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"--queue {name}=N needs N >= 1, got {n}")
        return name, n
    return name, None


def bounded_int(low: int, high: int | None, what: str):
    """An argparse type: an integer in [low, high] (high None: no upper bound)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}") from None
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"expected {what}, got {n}")
        return n

    return parse


positive_int = bounded_int(1, None, "a positive integer")
port_number = bounded_int(1, 65535, "a TCP port (1-65535)")  # --metrics-port


def positive_float(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not n > 0 or n == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value}")
    return n


def bind_hint(exc: OSError, address: str, port: int) -> str:
    """What to do about a failed bind of the metrics endpoint, by its errno: the address,
    the port or the privilege is the problem, never a guess at the wrong one."""
    import errno
    import socket

    if isinstance(exc, socket.gaierror):
        return f"{address} is not a host name or address this host can resolve"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{address} is not an address of this host (127.0.0.1, 0.0.0.0 or one of its interfaces)"
    if exc.errno == errno.EADDRINUSE:
        return "another process on this host has the port? pick a free one with --metrics-port"
    if exc.errno == errno.EACCES:
        return (f"port {port} is privileged (below 1024) or not allowed to this user: pick one above 1023 "
                "with --metrics-port")
    return "check --metrics-address and --metrics-port"


def _reload_worker_process(processes, burst, database, metrics_port) -> bool:
    """`--reload`: True in a worker process that the restart loop started (it runs the
    worker and watches the files: `_run_reloading`). In the process the user started,
    run the loop — a worker process, again each time one exits to reload — and return
    False once one exits otherwise (its status, if not 0, is raised as a CommandError).
    CommandError for the options --reload cannot serve."""
    from django.utils import autoreload

    refused = [name for name, given in (("--processes", processes > 1), ("--burst", burst),
                                        ("several --database", len(database or ()) > 1),
                                        ("--metrics-port", metrics_port is not None)) if given]
    if refused:
        raise CommandError(f"--reload runs one worker process for one database, restarted when a file "
                           f"changes (for development): not with {' or '.join(refused)}")
    if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true":
        return True
    # runserver's scheme (Django's get_child_arguments and DJANGO_AUTORELOAD_ENV), but
    # SIGINT and SIGTERM are passed on to the worker process and waited for: it drains
    # (runserver's loop would kill it 0.25 s after a Ctrl-C, leaving its rows to the reaper).
    env = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    worker = None

    def pass_on(signum, frame):
        if worker is not None and worker.poll() is None:
            worker.send_signal(signum)

    before = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            worker = subprocess.Popen(autoreload.get_child_arguments(), env=env, close_fds=False)
            code = worker.wait()
            if code != 3:  # 3: exited to reload
                break
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    if code:
        raise CommandError(f"the worker process exited with status {code}", returncode=code if code > 0 else 1)
    return False


def _run_reloading(sup) -> int:
    """Run `sup` in a thread while this (main) thread watches the project's files with
    Django's autoreloader. A change drains the worker (buffered rows released, running
    steps get DRAIN_TIMEOUT, the rest handed back) before the process exits to be
    restarted; so do SIGTERM and SIGINT, which end it. A worker that stops by itself
    (a role died) ends the process with its exit code."""
    from django.utils import autoreload

    reloader = autoreload.get_reloader()
    codes = []

    def work():
        try:
            codes.append(sup.run(install_signals=False))
        finally:
            reloader.stop()  # a worker that stopped by itself ends the process, no reload

    thread = threading.Thread(target=work, name="gen_durable-worker", daemon=True)

    def drain(reason: str) -> None:
        sup.request_stop(reason=reason)
        thread.join(sup.s.DRAIN_TIMEOUT + SHUTDOWN_GRACE)

    def changed(sender, file_path, **kwargs):
        # Django's file_changed signal, sent before it reloads (a receiver returning a
        # true value would stop the reload): drain first, then let it exit.
        drain(f"{file_path} changed: reloading")

    def stop(signum, frame):
        sup.request_stop(signum)

    autoreload.file_changed.connect(changed, weak=False)
    before = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    logging.getLogger("gen_durable.worker").info("watching for file changes with %s: the worker restarts when "
                                                 "one changes (--reload)", type(reloader).__name__)
    thread.start()
    try:
        while not reloader.should_stop:
            reloader.run(thread)  # returns when the worker stopped; exits (status 3) on a change
    finally:
        autoreload.file_changed.disconnect(changed)
        for s, handler in before.items():
            signal.signal(s, handler)
    thread.join(sup.s.DRAIN_TIMEOUT + SHUTDOWN_GRACE)
    return codes[0] if codes else 1


class Command(BaseCommand):
    help = "Run gen_durable workers: schedulers for the configured queues, flusher, heartbeat, reaper and GC."
    requires_system_checks = "__all__"
    requires_migrations_checks = True

    def add_arguments(self, parser):
        parser.add_argument("--queue", action="append", type=queue_spec, dest="queue", default=None,
                            metavar="NAME[=N]", help="Queue to run (repeatable), with optional concurrency; "
                                                     "default: GEN_DURABLE['QUEUES'].")
        parser.add_argument("--processes", type=positive_int, default=1,
                            help="Worker processes (use one per core).")
        parser.add_argument("--no-reaper", action="store_true", help="Run no reaper in this process.")
        parser.add_argument("--no-gc", action="store_true", help="Run no GC in this process.")
        parser.add_argument("--burst", action="store_true",
                            help="Run what it can, then exit: 0 once no row of these queues is runnable or "
                                 f"executing; {EXIT_LEFT_WORK} when it leaves rows it cannot run (a paused "
                                 "queue, a machine this release does not know, an unconfigured rate limit, "
                                 "or, past --max-wait, rows the limiter keeps deferring) or when stopped "
                                 "(SIGTERM/SIGINT) with rows left, each named with its reason. Rows parked "
                                 "on a signal or children are not waited for.")
        parser.add_argument("--max-wait", type=positive_float, default=None, metavar="SECONDS",
                            help="With --burst: stop once no step completed for this many seconds while rows "
                                 "remain (due later, deferred by the limiter, the limiter unreachable), or a "
                                 "database that was down at start-up is still down (all of them: nothing runs); "
                                 f"exits {EXIT_LEFT_WORK} naming them. Default: wait for them.")
        parser.add_argument("--database", action="append", dest="database", default=None, metavar="ALIAS",
                            help="Database alias to serve (repeatable: one process serves each named "
                                 "database, with its own schedulers, leases, timers, GC, listener and "
                                 "limits); default: GEN_DURABLE['DATABASE'].")
        parser.add_argument("--metrics-port", type=port_number, default=None, metavar="PORT",
                            help="Serve this worker's metrics for Prometheus at http://ADDRESS:PORT/metrics "
                                 "(needs the prometheus extra); with --processes N, child i serves PORT+i "
                                 "(docs/observability.md, \"Prometheus\").")
        parser.add_argument("--metrics-address", default=None, metavar="ADDRESS",
                            help="Address the metrics endpoint listens on (default 127.0.0.1; 0.0.0.0 for "
                                 "every interface). Needs --metrics-port.")
        parser.add_argument("--reload", action="store_true",
                            help="For development: restart the worker when a Python file changes, as "
                                 "runserver does (Django's autoreloader). The running worker drains first: "
                                 "buffered rows are released, running steps get DRAIN_TIMEOUT. One process "
                                 "and one database; not with --processes, --burst or --metrics-port.")
        parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
        # pids of dead predecessors of a restarted child, whose claims it takes back at once
        parser.add_argument("--predecessors", default="", help=argparse.SUPPRESS)
        # the supervising parent's pid (read before Django set up: it may be gone by then)
        parser.add_argument("--parent", type=int, default=None, help=argparse.SUPPRESS)
        # aliases the supervising parent could not check (down when it started): a child
        # runs their migration check once each is up
        parser.add_argument("--unchecked", default="", help=argparse.SUPPRESS)

    def execute(self, *args, **options):
        """Wait for the database (capped back-off, one log line per attempt), then run the
        system and migration checks and the workers as usual. With several --database
        aliases, wait until one is up: the others' workers wait for theirs in the
        background (`_late`)."""
        _configure_logging(options.get("verbosity", 1))
        if options.get("parent") is not None and not options.get("predecessors"):
            # A child of `--processes N`, first of its slot: its parent ran the system and
            # migration checks on these settings and this code a moment ago (and refuses to
            # start on an error). A restarted child (a predecessor died) runs them again:
            # the code on disk may have changed since.
            options["skip_checks"] = True
            self.requires_migrations_checks = False
        self._wait_for_databases(options.get("database"), options.get("burst"), options.get("max_wait"))
        if DEFAULT_DB_ALIAS in self._late and self.requires_migrations_checks:
            # Django's own note on unapplied migrations reads 'default'; gen_durable's
            # migrations on it are checked (and required) once it is up.
            self.requires_migrations_checks = False
            logging.getLogger("gen_durable.worker").info(
                "database 'default' is down: Django's unapplied-migrations note is skipped")
        return super().execute(*args, **options)

    def check_migrations(self):
        """Django's note on unapplied migrations, which reads 'default' whatever --database
        says: a 'default' that cannot be reached (a worker serving only other databases)
        costs a warning line, not the start-up (gen_durable's own migrations are required
        on every served database: `_require_migrations`)."""
        from django.db import OperationalError

        try:
            super().check_migrations()
        except OperationalError as exc:
            logging.getLogger("gen_durable.worker").warning(
                "could not read the migrations applied on database 'default' (%s); Django's unapplied-migrations "
                "note is skipped", " ".join(str(exc).split())[:300])

    def _wait_for_databases(self, database, burst=False, max_wait=None):
        """Wait until one of the served databases is up; `self._late`: those still down.
        With --burst --max-wait, CommandError (exit status 3, as for rows a burst leaves)
        when none came up within `max_wait` seconds."""
        aliases = self._aliases(database)
        bound = max_wait if burst else None
        late = wait_for_any_database(aliases, max_wait=bound)
        if late is None:
            what = f"database {aliases[0]!r} is" if len(aliases) == 1 else \
                f"databases {', '.join(map(repr, aliases))} are"
            raise CommandError(f"burst mode: {what} still down after --max-wait {bound:g} s; nothing was run",
                               returncode=EXIT_LEFT_WORK)
        self._late = late

    @staticmethod
    def _aliases(database) -> list[str]:
        """The --database aliases (default: GEN_DURABLE['DATABASE']), each once, in order;
        CommandError for one DATABASES lacks."""
        from django.db import connections

        aliases = list(dict.fromkeys(database or [get_settings().DATABASE]))
        unknown = [a for a in aliases if a not in connections.settings]
        if unknown:
            raise CommandError(f"--database {', '.join(map(repr, unknown))}: not in DATABASES "
                               f"(aliases: {sorted(connections.settings)})")
        return aliases

    def handle(self, *, queue, processes, no_reaper, no_gc, burst, child, predecessors, parent, verbosity,
               database, max_wait=None, metrics_port=None, metrics_address=None, unchecked="", reload=False,
               **options):
        if max_wait is not None and not burst:
            raise CommandError("--max-wait needs --burst (a worker without it runs until stopped)")
        if reload:
            reloading = _reload_worker_process(processes, burst, database, metrics_port)
            if not reloading:  # the watching parent: it ran the worker processes until stopped
                return
            parent = os.getppid()  # the worker drains and stops if its reloader dies
            predecessors = ""
        if metrics_address is not None and metrics_port is None:
            raise CommandError("--metrics-address needs --metrics-port (the port to serve the metrics on)")
        if metrics_port is not None:
            # A child's port was checked by its parent (and its own bind fails loudly).
            self._check_metrics(metrics_port, metrics_address, processes, bind=child is None)
        _configure_logging(verbosity)
        settings = get_settings()
        aliases = self._aliases(database)
        queues = dict(settings.QUEUES)
        if queue:
            queues = {name: (n or settings.QUEUES.get(name) or 10) for name, n in queue}
        late = [a for a in getattr(self, "_late", ()) if a in aliases]  # down at start-up
        # The start-up checks run on the databases that are up; one that is down is
        # checked once it is up, by whichever process then starts its worker.
        unchecked = late if child is None else [a for a in unchecked.split(",") if a in aliases]
        checked = [a for a in aliases if a not in unchecked]
        gauges = metrics_port is not None or self._otel_gauges()
        if child is None:
            for alias in checked:
                self._require_migrations(alias)
            self._note_unserved_routes(aliases)
        if queue and child is None:
            self._check_queues([name for name, _ in queue], burst, checked)
        if child is None:
            self._check_connection_budget(queues, processes, checked, reaper=not no_reaper, gc=not no_gc,
                                          gauges=gauges)
        if processes > 1 and child is None:
            if metrics_port is not None:
                log = logging.getLogger("gen_durable.worker")
                for i in range(processes):
                    log.info("child %d will serve Prometheus metrics on port %d", i, metrics_port + i)
            return self._supervise(processes, burst=burst, child_options=dict(
                queue=queue, processes=processes, no_reaper=no_reaper, no_gc=no_gc, burst=burst,
                verbosity=verbosity, database=database, max_wait=max_wait, metrics_port=metrics_port,
                metrics_address=metrics_address, unchecked=",".join(unchecked), **options))
        from gen_durable.worker.supervisor import Supervisor, WorkerConfig, run_several

        # The reaper runs in every process: the others' rows depend on it, and a process
        # can die. GC (nobody waits on it) runs in the first, which is restarted if it dies.
        first = child in (None, 0)
        configs = [WorkerConfig(queues=queues, reaper=not no_reaper, gc=not no_gc and first, burst=burst,
                                max_wait=max_wait, parent_pid=parent, using=alias,
                                predecessors=tuple(int(p) for p in predecessors.split(",") if p))
                   for alias in aliases]
        if (handler := self._otel_handler()) is not None:
            handler.serve_databases(aliases)  # its queue gauges: every served database
        served = None
        if metrics_port is not None and child is None:
            served = self._serve_metrics(metrics_port, metrics_address, aliases, child)
        elif metrics_port is not None:
            # The parent checked every port before the first start; a restarted child may
            # find its port taken meanwhile. Observability never stops job processing: it
            # logs the error and runs on, binding again later (docs/observability.md).
            served = ChildMetrics(lambda: self._serve_metrics(metrics_port + child, metrics_address, aliases,
                                                              child), metrics_port + child, child)
        # The workers of databases that were down start in their own threads once up.
        failed = max(getattr(getattr(self, "_late", None), "attempts", 0), 1)
        budget = dict(queues=queues, processes=processes, reaper=not no_reaper, gc=not no_gc, gauges=gauges)
        prepare = {alias: self._late_start(alias, wait=failed if alias in late else 0,
                                           check=budget if alias in unchecked else None,
                                           burst=burst, max_wait=max_wait)
                   for alias in aliases if alias in late or alias in unchecked}
        try:
            if reload:
                code = _run_reloading(Supervisor(configs[0]))
            else:
                code = Supervisor(configs[0]).run() if len(configs) == 1 else run_several(configs, prepare)
        finally:
            if served is not None:
                served.close()
        if code == EXIT_LEFT_WORK:
            if parent is not None:
                # A child of --processes: the log line above says what was left, and its
                # parent reports the exit status once for every child.
                raise SystemExit(EXIT_LEFT_WORK)
            raise CommandError("burst: rows were left that this worker did not run (see the log line above: why)",
                               returncode=EXIT_LEFT_WORK)
        if code:
            raise CommandError(f"worker exited with {code}")

    def _late_start(self, alias: str, *, wait: int, check: dict | None, burst: bool = False,
                    max_wait: float | None = None):
        """The start of the worker of database `alias`, which was down when this process
        started (or its parent did): run in that worker's thread (`run_several`), it
        waits until a connection opens (`wait`: the attempts made already; 0: none
        needed; stoppable), runs the start-up checks the others had (`check`: the
        connection budget's arguments — gen_durable's migrations, then the budget,
        counted for this alias alone, --processes included) and returns None for the
        worker to start; 0 if the worker was asked to stop meanwhile, 1 after logging a
        check that failed (which stops every worker of this process: the settings or the
        schema are wrong). A `burst` never ran that database's rows: stopped before it
        came up, or still down after `max_wait` seconds (which bounds this wait as it
        bounds a burst without progress), it returns EXIT_LEFT_WORK."""

        def start(stop):
            log = logging.getLogger("gen_durable.worker")
            waiting = stop if not (burst and max_wait is not None) else _Deadline(stop, max_wait)
            try:
                attempts = wait_for_database(alias, stop=waiting, failed=wait) if wait else None
                if wait and attempts is None:
                    if not burst:
                        log.info("database %r: asked to stop before it came up; its worker never started", alias)
                        return 0
                    log.warning("burst mode: database %r %s; its rows were not run (exit status %d)", alias,
                                f"is still down after --max-wait {max_wait:g} s" if waiting is not stop
                                and not stop.is_set() else "was stopped before it came up", EXIT_LEFT_WORK)
                    return EXIT_LEFT_WORK
                if check is not None:
                    self._require_migrations(alias)
                    self._check_connection_budget(aliases=[alias], **check)
            except CommandError as exc:
                log.error("database %r cannot be served: %s", alias, exc)
                return 1
            log.info("database %r is up%s: starting its worker", alias,
                     f" after {attempts} attempts" if attempts else "")
            return None

        return start

    def _fork_child(self, i: int, options: dict) -> ForkedChild | None:
        """Fork child `i` of `--processes N`: it runs `handle(child=i, parent=<this pid>)`
        with this command's options, as the command line `--child=i --parent=<pid>` would,
        and leaves with the exit status Django gives a command (1, or a CommandError's
        returncode). None when the fork fails (the caller starts a new interpreter).

        The child keeps this process's set-up (settings, apps, the registry, the checks
        it ran) and nothing of its state that must not be shared: every database
        connection and cache client is closed before the fork, so each process opens its
        own; buffered log records are written out first, so none is copied into the
        child to be written twice. SIGTERM and SIGINT are blocked across the fork: the
        child puts them back to their defaults (for its worker to take over) before it
        can receive one, and one sent to this process meanwhile is delivered once the
        fork returned. The child flushes and closes its log handlers before it leaves
        (logging.shutdown), and runs none of the exit functions it inherited: those are
        the parent's (a pid file, a temporary directory) and run when the parent exits.
        """
        from django.core.cache import caches
        from django.db import connections

        parent = os.getpid()
        connections.close_all()
        caches.close_all()
        _flush_output(self)
        stops = {signal.SIGTERM, signal.SIGINT}
        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
        try:
            pid = os.fork()
        except OSError as exc:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            logging.getLogger("gen_durable.worker").warning("could not fork child %d (%s); starting it as a "
                                                            "new process", i, exc)
            return None
        if pid:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            return ForkedChild(pid)
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
            self._wait_for_databases(options.get("database"), options.get("burst"), options.get("max_wait"))
            self.handle(**options, child=i, parent=parent, predecessors="")
            code = 0
        except CommandError as exc:
            self.stderr.write(f"{type(exc).__name__}: {exc}")
            code = exc.returncode
        except SystemExit as exc:
            code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            logging.getLogger("gen_durable.worker").exception("worker child %d failed", i)
        finally:
            try:
                logging.shutdown()  # a buffering handler writes out this child's records
            finally:
                _flush_output(self)
                os._exit(code)

    def _check_metrics(self, port, address, processes, *, bind=True):
        """Refuse --metrics-port before any worker starts when it cannot work: the
        prometheus extra is missing, a port of PORT..PORT+N-1 is past 65535, or one is
        already bound (another rundurable on this host?)."""
        import socket

        try:
            from gen_durable.integrations.prometheus import DEFAULT_ADDRESS, worker_exporter_available
        except ImportError as exc:
            raise CommandError(f"--metrics-port: {exc}") from None
        problem = worker_exporter_available()
        if problem:
            raise CommandError(f"--metrics-port: {problem}")
        address = address or DEFAULT_ADDRESS
        last = port + processes - 1
        if last > 65535:
            raise CommandError(f"--metrics-port {port} with --processes {processes}: the children serve ports "
                               f"{port}-{last}, past 65535")
        for p in range(port, last + 1) if bind else ():
            try:
                family = socket.getaddrinfo(address, p, type=socket.SOCK_STREAM)[0][0]
                socket.create_server((address, p), family=family).close()
            except OSError as exc:
                raise CommandError(f"--metrics-port: cannot serve metrics on {address}:{p}: "
                                   f"{exc.strerror or exc} ({bind_hint(exc, address, p)})") from None

    def _serve_metrics(self, port, address, using, child):
        from gen_durable.integrations.prometheus import DEFAULT_ADDRESS, serve_worker_metrics

        try:
            served = serve_worker_metrics(port, address or DEFAULT_ADDRESS, using=using)
        except (ImportError, OSError, RuntimeError, ValueError) as exc:
            raise CommandError(f"--metrics-port: {exc}") from None
        logging.getLogger("gen_durable.worker").info(
            "serving Prometheus metrics at %s%s", served.url, "" if child is None else f" (child {child})")
        return served

    def _note_unserved_routes(self, aliases):
        """Log the databases GEN_DURABLE['DATABASES'] routes to that this host does not
        serve: their rows wait for a `rundurable --database ALIAS` elsewhere."""
        routes = get_settings().DATABASES if isinstance(get_settings().DATABASES, dict) else {}
        routed = {alias for section in ("MACHINES", "QUEUES") if isinstance(routes.get(section), dict)
                  for alias in routes[section].values() if isinstance(alias, str)}
        unserved = sorted(routed - set(aliases))
        if unserved:
            logging.getLogger("gen_durable.worker").info(
                "GEN_DURABLE['DATABASES'] routes work to %s, which this host does not serve (serving %s); "
                "run `rundurable --database ALIAS` for each somewhere", ", ".join(unserved), ", ".join(aliases))

    def _require_migrations(self, alias: str):
        """Refuse to start while gen_durable's own migrations are unapplied: every pick,
        timer and sweep would fail on a missing table, forever (Django's own migration
        check only prints a note)."""
        from django.db import connections
        from django.db.migrations.executor import MigrationExecutor

        executor = MigrationExecutor(connections[alias])
        plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        pending = [migration.name for migration, _backwards in plan if migration.app_label == "gen_durable"]
        if pending:
            raise CommandError(f"gen_durable's migrations are not applied on database {alias!r} "
                               f"({', '.join(pending)}): run `python manage.py migrate` first")

    def _check_queues(self, names, burst: bool, aliases=(None,)):
        """Warn about a --queue that nothing uses (a typo runs an idle worker); refuse it
        with --burst, which would otherwise exit 0 as if the work were done."""
        from gen_durable import db, registry

        declared = {cls.queue for cls in registry.all_machines().values()}
        unused = []
        for name in names:
            if name in declared:
                continue
            # One probe of the pick index: rows inserted with queue= still count.
            runnable = any(db.fetchone("SELECT EXISTS (SELECT 1 FROM gen_durable WHERE queue = %(q)s "
                                       "AND status = 'runnable')", {"q": name}, alias)[0] for alias in aliases)
            if not runnable:
                unused.append(name)
        if not unused:
            return
        configured = set(get_settings().QUEUES)
        message = (f"--queue {', '.join(map(repr, unused))}: no registered machine uses "
                   f"{'this queue' if len(unused) == 1 else 'these queues'} and no runnable instance is in it "
                   f"(machines use {sorted(declared)}; configured: {sorted(configured)})")
        # A typo is the usual cause: suggest the closest queue a machine uses or the settings name.
        known = sorted(declared | configured)
        close = {name: difflib.get_close_matches(name, [k for k in known if k != name], n=1) for name in unused}
        close = {name: match[0] for name, match in close.items() if match}
        if len(unused) == 1 and close:
            message += f"; did you mean {close[unused[0]]!r}?"
        elif close:
            message += "; did you mean " + ", ".join(f"{m!r} for {n!r}" for n, m in close.items()) + "?"
        if burst:
            raise CommandError(message + "; refusing --burst, which would exit 0 with nothing done")
        self.stderr.write(f"Warning: {message}")

    @staticmethod
    def _otel_handler():
        """OPENTELEMETRY's handler in this process, or None."""
        otel = sys.modules.get("gen_durable.integrations.otel")  # imported only when it is on
        return getattr(otel, "_installed", None)

    def _otel_gauges(self) -> bool:
        """Whether OPENTELEMETRY's handler observes the queue gauges in this process."""
        handler = self._otel_handler()
        return bool(handler is not None and handler.metrics)

    def _check_connection_budget(self, queues, processes, aliases=(None,), *, reaper, gc, gauges=False):
        """Log the host's connection need; refuse one a server's max_connections cannot hold.

        Counted per server (HOST, PORT): aliases on one server share its max_connections,
        so their needs add up there."""
        from django.db import DatabaseError

        from gen_durable import db
        from gen_durable.worker.connections import ConnectionBudgetError, check_budget, connection_need

        servers: dict = {}
        for alias in aliases:
            where = db.connection(alias).settings_dict
            servers.setdefault((where.get("HOST") or "", str(where.get("PORT") or "")), []).append(alias)
        log = logging.getLogger("gen_durable.worker")
        for on_server in servers.values():
            need = connection_need(queues, processes=processes, reaper=reaper, gc=gc, gauges=gauges)
            if len(on_server) > 1:  # each alias runs the whole set of roles on its own connections
                need = dict(need, processes=need["processes"] * len(on_server),
                            maintenance=need["maintenance"] * len(on_server), total=need["total"] * len(on_server))
            try:
                line = check_budget(need, on_server[0])
                log.info(line if len(on_server) == 1 else f"{line} [databases {', '.join(on_server)}, one server]")
            except ConnectionBudgetError as exc:
                if len(on_server) > 1:
                    raise CommandError(f"{exc} (databases {', '.join(on_server)} share one server: their "
                                       "connections add up)") from None
                raise CommandError(str(exc)) from None
            except DatabaseError as exc:  # not reachable yet: the worker's start-up deals with it
                log.warning("could not read the server's max_connections (%s); connection need: %d", exc,
                            need["total"])
            finally:
                for alias in on_server:
                    db.connection(alias).close()

    def _supervise(self, processes: int, burst: bool = False, child_options: dict | None = None):
        """Run `processes` children and keep them running until SIGTERM/SIGINT.

        Each slot's first child is forked from this process, which has set Django up
        and run the checks, so it starts at once instead of loading the project again
        (`_fork_child`; child_options: this command's options, which it runs with). A
        restarted child is a new interpreter running this command line: the code on disk
        may have changed since, and it runs the checks again. So is every child when
        this process cannot fork safely (another thread is running, or no os.fork).

        A child that dies (non-zero exit or a signal) is restarted after a back-off
        (RESTART_BACKOFF, doubling to its cap; reset once a child ran STABLE_AFTER
        seconds) and told its predecessor's pid, so it takes that process's claims back
        at once. A slot that dies MAX_RAPID_DEATHS times in a row, each within
        STABLE_AFTER of its start, stops the host: every child is stopped and the command
        exits non-zero. A child exiting 0 (burst mode, done) is not restarted. Children
        watch this process and drain and exit when it is gone.
        """
        log = logging.getLogger("gen_durable.worker")
        base, skip = [], False
        for a in sys.argv:  # this command line less --processes (and its value)
            if skip:
                skip = False
                continue
            if a == "--processes":
                skip = True
                continue
            if a.startswith("--processes="):
                continue
            base.append(a)
        slots = [{"proc": None, "started": 0.0, "rapid": 0, "due": 0.0, "dead": [], "done": False}
                 for _ in range(processes)]
        stopping = []

        def spawn(i):
            slot = slots[i]
            if stopping:  # SIGTERM/SIGINT came while the first children started: no more
                slot["done"] = True
                return
            extra = [f"--predecessors={','.join(map(str, slot['dead']))}"] if slot["dead"] else []
            forked = None
            if not slot["dead"] and child_options is not None and _can_fork():
                forked = self._fork_child(i, child_options)
            if child_options and child_options.get("unchecked"):
                extra.append(f"--unchecked={child_options['unchecked']}")
            slot["proc"] = forked or subprocess.Popen([sys.executable] + base + [f"--child={i}",
                                                                                 f"--parent={os.getpid()}"] + extra)
            log.info("child %d is process %d (%s)", i, slot["proc"].pid,
                     "forked from this one, Django set up" if forked else "a new interpreter")
            if stopping:  # a stop that came while it started: forward() did not know it yet
                slot["proc"].send_signal(stopping[-1])
            # Keep the dead pids: a replacement may itself die before its start-up reclaim
            # ran, and the next one must still take every predecessor's claims back.
            # Extra pids cost nothing (their claims are already gone); keep the last few.
            slot["started"], slot["dead"] = time.monotonic(), slot["dead"][-MAX_RAPID_DEATHS:]

        def forward(signum, frame):
            stopping.append(signum)
            for slot in slots:
                if slot["proc"] is not None and slot["proc"].poll() is None:
                    slot["proc"].send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        for i in range(processes):
            spawn(i)
        codes, gave_up = [], None
        while True:
            now = time.monotonic()
            for i, slot in enumerate(slots):
                proc = slot["proc"]
                if proc is None or proc.poll() is None:
                    if proc is None and not slot["done"]:
                        if stopping:
                            slot["done"] = True  # was waiting for its restart
                        elif now >= slot["due"]:
                            spawn(i)
                    continue
                slot["proc"], code = None, proc.returncode
                # A burst child done (rows left: named). Without --burst an exit status of
                # EXIT_LEFT_WORK is a crash like any other (a step may os._exit(3)).
                if stopping or code == 0 or (burst and code == EXIT_LEFT_WORK):
                    slot["done"] = True
                    # A child told to stop before its worker took the signal over ends by
                    # the signal itself: it held nothing yet, and that is a clean stop.
                    codes.append(0 if stopping and code in (-signal.SIGTERM, -signal.SIGINT) else code)
                    continue
                how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
                slot["rapid"] = slot["rapid"] + 1 if now - slot["started"] < STABLE_AFTER else 1
                slot["dead"].append(proc.pid)
                if slot["rapid"] >= MAX_RAPID_DEATHS:
                    gave_up = (i, proc.pid, how)
                    break
                delay = min(RESTART_BACKOFF[0] * 2 ** (slot["rapid"] - 1), RESTART_BACKOFF[1])
                slot["due"] = now + delay
                log.error("worker process %s (child %d) %s; restarting it in %.0fs (its claims are "
                          "taken back at once)", proc.pid, i, how, delay)
            if gave_up is not None:
                i, pid, how = gave_up
                log.error("worker process %s (child %d) %s: %d deaths in a row, each within %.0fs of "
                          "its start; stopping every worker", pid, i, how, MAX_RAPID_DEATHS, STABLE_AFTER)
                forward(signal.SIGTERM, None)
                for slot in slots:
                    if slot["proc"] is not None:
                        slot["proc"].wait()
                raise CommandError(f"worker child {i} keeps dying ({how}); gave up after {MAX_RAPID_DEATHS} "
                                   "rapid restarts")
            if all(slot["done"] for slot in slots):
                break
            time.sleep(0.2)
        bad = [c for c in codes if c and c != EXIT_LEFT_WORK]
        if bad:
            raise CommandError(f"{len(bad)} worker process(es) exited non-zero: {codes}")
        if EXIT_LEFT_WORK in codes:
            raise CommandError("burst: rows were left that the workers did not run (see the log: why)",
                               returncode=EXIT_LEFT_WORK)


def _can_fork() -> bool:
    """Whether this process may fork a worker child: only while it runs one thread. A
    fork copies only the calling thread, so a lock another thread held (logging, an
    exporter's queue) would stay held in the child for ever. Counted by the operating
    system where it can tell (/proc/self/task lists the threads a C extension started
    too, which `threading` does not know), else by `threading`."""
    if not hasattr(os, "fork"):
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return threading.active_count() == 1


def _flush_output(command) -> None:
    """Write out what this process buffered: its streams and every logging handler."""
    handlers = list(logging.getLogger().handlers)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        handlers.extend(getattr(logger, "handlers", ()))
    for stream in (sys.stdout, sys.stderr, command.stdout, command.stderr, *handlers):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a handler that cannot flush loses its buffer, not the worker
            pass


class ForkedChild:
    """A `--processes` child forked by `Command._fork_child`, seen as the supervisor sees
    a subprocess.Popen: pid, poll(), wait(), send_signal() and returncode (negative: the
    signal that killed it).

    As Popen does, a poll() that finds another in progress (the supervisor's signal
    handler forwarding a signal while the loop reaps) returns None instead of reaping the
    child twice, and a child that something else reaped counts as dead with status 255.
    """

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None
        self._reaping = threading.Lock()

    def poll(self):
        if self.returncode is not None or not self._reaping.acquire(blocking=False):
            return self.returncode
        try:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            self.returncode = 255
        finally:
            self._reaping.release()
        return self.returncode

    def wait(self):
        while self.poll() is None:
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum):
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass


class ChildMetrics:
    """The metrics endpoint of a `--processes` child: served now if its port binds, else
    an error logged and the bind tried again in a thread (METRICS_RETRY back-off) while
    the worker runs on. close() stops the retries and the endpoint."""

    def __init__(self, serve, port: int, child: int):
        self._serve, self._port, self._child = serve, port, child
        self._stop, self._lock, self.served = threading.Event(), threading.Lock(), None
        try:
            self.served = serve()
        except CommandError as exc:
            logging.getLogger("gen_durable.worker").error(
                "child %d cannot serve its metrics on port %d (%s); it keeps running jobs without them and "
                "tries the port again in %.0fs, then up to every %.0fs", child, port, exc, *METRICS_RETRY)
            threading.Thread(target=self._retry, name=f"gen_durable-metrics-{port}", daemon=True).start()

    def _retry(self):
        delay = METRICS_RETRY[0]
        while not self._stop.wait(delay):
            try:
                served = self._serve()
            except CommandError:
                delay = min(delay * 2, METRICS_RETRY[1])
                continue
            with self._lock:
                if self._stop.is_set():
                    served.close()
                else:
                    self.served = served
            return

    def close(self):
        with self._lock:
            self._stop.set()
            if self.served is not None:
                self.served.close()
