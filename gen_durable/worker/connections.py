"""Internal: the worker's own database connections (docs/reliability.md, "Connections").

Every thread of a worker has its own Django connection. `bind(role)` gives the calling
thread's connection the engine's options before it connects:

- TCP keepalives, `tcp_user_timeout` and `connect_timeout` (libpq options), so a peer
  that vanished (a dead NAT entry, a failed-over host) is noticed by the kernel;
- `application_name` "gen_durable <role>" (visible in pg_stat_activity);
- for the engine's roles, `lock_timeout` / `statement_timeout` (GEN_DURABLE LOCK_TIMEOUT,
  STATEMENT_TIMEOUT) and, for the feeder, `synchronous_commit = off`. Connected directly,
  these are startup options of a connection no one else uses. Behind a transaction-mode
  pooler (GEN_DURABLE POOLER = "transaction") a server connection is shared, so each
  engine statement runs in a transaction that sets them with SET LOCAL instead: nothing
  outlives its own transaction.

A role thread also gets a `Watch`: every engine statement is bounded client-side by
STATEMENT_TIMEOUT + WATCHDOG_MARGIN seconds. A statement that gets no answer by then is on
a half-open connection (the server's own statement_timeout would have answered): the
`Watchdog` shuts its socket down, the statement fails as a lost connection, and the role
reconnects and goes on.

Step threads get keepalives and a connection that stays open between steps whatever
CONN_MAX_AGE says for web requests (Scheduler releases it after STEP_IDLE_RELEASE s idle).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from contextlib import contextmanager

from django.db import transaction
from psycopg.pq import ConnStatus

from .. import db, registry
from ..conf import database_alias, get_settings

logger = logging.getLogger("gen_durable.connections")

# libpq TCP options (user OPTIONS of the same name win). An idle connection whose peer
# is gone is noticed after KEEPALIVES_IDLE + KEEPALIVES_INTERVAL × KEEPALIVES_COUNT
# = 10 + 5 × 3 = 25 s; data unacknowledged for TCP_USER_TIMEOUT ms fails the socket.
TCP_OPTIONS = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 25_000,
    "connect_timeout": 10,
}
WATCHDOG_MARGIN = 2.0  # seconds past STATEMENT_TIMEOUT before a silent connection is cut
WATCHDOG_TICK = 0.25
CHECK_BOUND = 5.0  # seconds a liveness round trip (the listener's SELECT 1) may take


def _ms(seconds: float) -> int:
    return max(int(round(seconds * 1000)), 1)


def pooled() -> bool:
    return get_settings().POOLER == "transaction"


def engine_options(role: str, *, base: dict, statements: bool, relaxed_commit: bool = False,
                   tag: str | None = None, timeout: float | None = None) -> dict:
    """The OPTIONS of a connection for `role` (a copy of `base`, the alias's OPTIONS).

    `tag` (the worker's token) joins the application_name, so an operator can tell the
    connections of one worker process from another's. `timeout` (seconds) replaces
    LOCK_TIMEOUT and STATEMENT_TIMEOUT, and bounds the connect too (libpq's floor: 2 s).
    """
    s = get_settings()
    lock_timeout = s.LOCK_TIMEOUT if timeout is None else timeout
    statement_timeout = s.STATEMENT_TIMEOUT if timeout is None else timeout
    opts = dict(base or {})
    for key, value in TCP_OPTIONS.items():
        opts.setdefault(key, value)
    if timeout is not None:
        opts["connect_timeout"] = max(2, math.ceil(timeout))
    opts.setdefault("application_name", f"gen_durable {role}" + (f" {tag}" if tag else ""))
    if pooled():
        # A transaction pooler cannot carry prepared statements nor startup options.
        opts.pop("server_side_binding", None)
        opts["prepare_threshold"] = None
    elif statements:
        extra = [f"-c lock_timeout={_ms(lock_timeout)}", f"-c statement_timeout={_ms(statement_timeout)}"]
        if relaxed_commit:
            extra.append("-c synchronous_commit=off")
        opts["options"] = " ".join(x for x in [opts.get("options"), *extra] if x)
    return opts


def bind(role: str, using=None, *, statements: bool = True, relaxed_commit: bool = False,
         persistent: bool = False, tag: str | None = None, timeout: float | None = None):
    """Give this thread's connection for `using` the engine's options for `role`.

    `statements`: the thread runs engine statements (timeouts, client-side watch).
    `relaxed_commit`: its commits need not wait for the WAL flush (the feeder's claims).
    `persistent`: keep the connection open across uses whatever CONN_MAX_AGE says.
    `timeout`: seconds that bound the connect and every statement (`engine_options`), the
    watchdog's cut included, in place of STATEMENT_TIMEOUT.
    Returns the Django connection.
    """
    conn = db.connection(using)
    if conn.connection is not None:
        conn.close()
    settings_dict = dict(conn.settings_dict)
    settings_dict["OPTIONS"] = engine_options(role, base=settings_dict.get("OPTIONS"), statements=statements,
                                              relaxed_commit=relaxed_commit, tag=tag, timeout=timeout)
    if persistent:
        settings_dict["CONN_MAX_AGE"] = None
    conn.settings_dict = settings_dict  # this thread's wrapper only; the alias's dict is untouched
    if statements:
        db.engine_thread.watch = Watch(role, relaxed_commit=relaxed_commit)
        if timeout is not None:
            db.engine_thread.watch.until = time.monotonic() + timeout
    return conn


def unbind():
    db.engine_thread.watch = None


def bounded_call(using, seconds: float, fn, *, role: str = "gauges"):
    """Return `fn()`, whose statements use this thread's connection for `using`, within
    about `seconds`: the connection opens with the engine's TCP options and a
    connect_timeout of `seconds` (libpq's floor: 2 s), and the watchdog cuts a statement
    still unanswered at the deadline (a lock, a silent server). For an occasional
    reader (the queue gauges' collecting thread): the connection is closed afterwards
    and the thread's own settings and watch are put back. Raises what `fn` raises
    (a cut statement: an OperationalError).
    """
    conn = db.connection(using)
    saved_settings, saved_watch = conn.settings_dict, db.engine_thread.watch
    bind(role, using, statements=True, timeout=seconds)
    try:
        return fn()
    finally:
        conn.close()
        conn.settings_dict = saved_settings
        db.engine_thread.watch = saved_watch


def local_settings(using=None) -> list:
    """The SET LOCALs an engine transaction needs behind a transaction pooler (else [])."""
    if not pooled():
        return []
    s = get_settings()
    return [("lock_timeout", f"{_ms(s.LOCK_TIMEOUT)}ms"), ("statement_timeout", f"{_ms(s.STATEMENT_TIMEOUT)}ms")]


def _set_local(conn, pairs):
    sql = "SELECT " + ", ".join(f"set_config('{name}', %s, true)" for name, _ in pairs)
    with conn.cursor() as cur:
        cur.execute(sql, [value for _, value in pairs])


class Watch:
    """A role thread's engine statements: deadline-watched, SET LOCAL behind a pooler."""

    def __init__(self, role, *, relaxed_commit=False):
        self.role = role
        self.relaxed_commit = relaxed_commit
        self.depth = 0
        # A monotonic instant no statement of this thread may outlive (the shutdown's
        # deadline, `Supervisor.stop`); None: only the per-statement bound.
        self.until = None

    def bound(self) -> float:
        bound = get_settings().STATEMENT_TIMEOUT + WATCHDOG_MARGIN
        if self.until is not None:
            bound = min(bound, max(self.until - time.monotonic(), WATCHDOG_TICK))
        return bound

    @contextmanager
    def statement(self, using=None, *, wrap=True):
        """Around one statement (or, nested, a whole transaction: its COMMIT too)."""
        conn = db.connection(using)
        self.depth += 1
        WATCHDOG.arm(conn, self.bound(), self.role)
        try:
            if wrap and self.depth == 1 and pooled() and not conn.in_atomic_block:
                with transaction.atomic(using=database_alias(using)):
                    self._set_local(conn)
                    yield
            else:
                yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                WATCHDOG.disarm()
            else:
                WATCHDOG.arm(conn, self.bound(), self.role)

    def _set_local(self, conn):
        pairs = local_settings()
        if self.relaxed_commit:
            pairs.append(("synchronous_commit", "off"))
        _set_local(conn, pairs)


def untouched(using=None) -> bool:
    """Whether this thread's connection is open and the server has not closed it since
    its last answer. A server that closed it (pg_terminate_backend, idle_session_timeout,
    a shutdown) sent an error and its end of the stream: libpq's non-blocking read of
    what arrived (PQconsumeInput) fails on it. No round trip, and the GIL stays held
    (a select() would give it up, and under load waiting to take it back costs more
    than the read)."""
    conn = db.connection(using).connection
    if conn is None or conn.closed:
        return False
    pgconn = conn.pgconn
    try:
        # The first read takes what arrived — from a closing server, its error message;
        # the next one then meets the end of the stream, and fails.
        pgconn.consume_input()
        pgconn.consume_input()
    except Exception:  # psycopg.OperationalError: the server closed it
        return False
    return pgconn.status == ConnStatus.OK


@contextmanager
def engine_transaction(using=None):
    """`transaction.atomic` for the worker's multi-statement transactions (the flush).

    Behind a transaction pooler the timeouts are set with SET LOCAL as its first
    statement; on a role thread the COMMIT is watched like any statement.
    """
    watch = db.engine_thread.watch
    conn = db.connection(using)
    if watch is None:
        with transaction.atomic(using=database_alias(using)):
            if pooled():
                _set_local(conn, local_settings())
            yield
        return
    with watch.statement(using, wrap=False):
        with transaction.atomic(using=database_alias(using)):
            if pooled():
                watch._set_local(conn)
            yield


class Watchdog:
    """One daemon thread per process cutting engine connections that stopped answering."""

    def __init__(self):
        self._lock = threading.Lock()
        self._armed: dict = {}  # thread id -> (deadline, Django connection, role)
        self._thread = None
        self.cuts = 0

    def arm(self, conn, seconds, role):
        with self._lock:
            self._armed[threading.get_ident()] = (time.monotonic() + seconds, conn, role, seconds)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="gd-watchdog", daemon=True)
                self._thread.start()

    def disarm(self):
        with self._lock:
            self._armed.pop(threading.get_ident(), None)

    def _loop(self):
        while True:
            time.sleep(WATCHDOG_TICK)
            now = time.monotonic()
            with self._lock:
                late = [(k, v) for k, v in self._armed.items() if v[0] <= now]
                for k, _ in late:
                    self._armed.pop(k, None)
            for _, (_, conn, role, seconds) in late:
                self._cut(conn, role, seconds)

    def _cut(self, conn, role, seconds):
        raw = getattr(conn, "connection", None)
        if raw is None:
            return
        try:
            fd = raw.fileno()
            sock = socket.socket(fileno=os.dup(fd))
        except Exception:
            return
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()
        self.cuts += 1
        logger.error("gen_durable %s: no answer from the database for %.1fs (half-open connection?); "
                     "closing it — the statement fails and the connection is replaced", role, seconds)


WATCHDOG = Watchdog()


# --- the connection budget ---------------------------------------------------------------

def connection_need(queues: dict, *, processes: int = 1, reaper: bool = True, gc: bool = True,
                    listener: bool | None = None, gauges: bool = False) -> dict:
    """Connections a `rundurable` host holds at most: a dict of parts and the "total".

    Per process: Σ step threads (a queue's concurrency; one thread for a queue whose
    machines are all `async def`, `registry.step_threads`) + two for every async step (Django's shared sync thread and
    the engine's own, `aio.engine_call`) + one feeder per
    queue + flusher + heartbeat + timer + reaper + listener (not behind a pooler, not with
    NOTIFY 'none') + the main thread (+ one for the queue gauges' statement when metrics
    are collected: `gauges`, a short-lived connection of the collecting thread); the first
    process adds the GC.
    """
    s = get_settings()
    if listener is None:
        listener = s.NOTIFY == "postgres" and not pooled()
    per_process = {
        "step threads": sum(registry.step_threads(q, c) for q, c in queues.items()),
        "async steps": 2,  # Django's shared sync thread, and the engine's own (aio.engine_call)
        "feeders": len(queues),
        "flusher": 1,
        "heartbeat": 1,
        "timer": 1,
        "reaper": int(bool(reaper and s.REAPER)),
        "listener": int(bool(listener and queues)),
        "main": 1,
    }
    if gauges:
        per_process["metrics scrape"] = 1
    each = sum(per_process.values())
    maintenance = int(bool(gc and s.GC))
    return {"per process": per_process, "processes": processes, "maintenance": maintenance,
            "total": each * processes + maintenance}


class ConnectionBudgetError(Exception):
    """The worker's connection need cannot fit the server's max_connections."""


def server_limit(using=None) -> dict:
    """max_connections, the slots reserved for superusers (and, PG16+, reserved roles), usable."""
    rows = db.fetchall(
        "SELECT name, setting::int FROM pg_settings "
        "WHERE name IN ('max_connections', 'superuser_reserved_connections', 'reserved_connections')",
        None, using)
    values = dict(rows)
    reserved = values.get("superuser_reserved_connections", 0) + values.get("reserved_connections", 0)
    return {"max_connections": values["max_connections"], "reserved": reserved,
            "usable": values["max_connections"] - reserved}


def _role_count(role: str, n: int) -> str:
    """`14 step threads`, `1 step thread`, `1 for async steps`, `2 feeders (one per queue)`."""
    if role == "async steps":
        return f"{n} for async steps"
    name = role[:-1] if n == 1 and role.endswith("s") else {"main": "main thread"}.get(role, role)
    return f"{n} {name} (one per queue)" if role == "feeders" else f"{n} {name}"


def check_budget(need: dict, using=None) -> str:
    """Raise ConnectionBudgetError when `need` cannot fit the server; return the log line."""
    per = need["per process"]
    parts = " + ".join(_role_count(k, v) for k, v in per.items() if v)
    line = (f"gen_durable needs up to {need['total']} database connections: {need['processes']} process(es) × "
            f"({parts}) + {need['maintenance']} GC")
    if pooled():
        return line + " (client connections of the pooler; its pool size bounds the server's)"
    limit = server_limit(using)
    line += (f"; the server allows {limit['usable']} (max_connections {limit['max_connections']} "
             f"- {limit['reserved']} reserved)")
    if need["total"] > limit["usable"]:
        raise ConnectionBudgetError(
            line + ". Lower queue concurrency or --processes, or raise max_connections "
                   "(web processes need connections too).")
    return line
