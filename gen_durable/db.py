"""Internal: run named statements on Django's connection for an alias.

Statements go through `connections[alias].cursor()` so they join the caller's
`transaction.atomic()`, are counted by Django's query capture, and — with
OPTIONS server_side_binding + prepare_threshold — are prepared once per connection.
"""

from __future__ import annotations

import logging
import threading

from django.db import ProgrammingError, connections
from django.db.backends.signals import connection_created
from psycopg.pq import TransactionStatus

from .conf import database_alias

logger = logging.getLogger("gen_durable.db")

class _EngineThread(threading.local):
    """Per-thread engine state, with class defaults so every thread reads them as plain
    attributes (a getattr default on a missing thread-local attribute raises and catches
    AttributeError: ~1 µs, several times a step).

    watch: set on the worker's own threads (gen_durable.worker.connections.bind), a Watch
    that bounds each engine statement client-side and, behind a transaction pooler, wraps
    it in a transaction carrying the engine's SET LOCALs; None everywhere else (web
    requests, step code): statements then run exactly as the caller's connection runs
    them. opened: a step thread's connections (`mark_step_thread`). replaced: how many
    wrappers `discard_dangling` replaced on this thread.
    """

    watch = None
    opened = None
    replaced = 0


engine_thread = _EngineThread()


def connection(using: str | None = None):
    return connections[database_alias(using)]


def fetchall(sql: str, params=None, using: str | None = None) -> list[tuple]:
    watch = engine_thread.watch
    if watch is not None:
        with watch.statement(using):
            return _fetchall(sql, params, using)
    return _fetchall(sql, params, using)


def _fetchall(sql, params, using):
    try:
        with connection(using).cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []
    except ProgrammingError as exc:
        _not_migrated(exc, using)
        raise


# undefined_table, undefined_object (the status type), undefined_column (a later migration)
_MISSING = {"42P01", "42704", "42703"}


def _not_migrated(exc, using):
    """Raise NotMigrated for an error that says one of our tables, types or columns is missing."""
    if _sqlstate(exc) in _MISSING and "gen_durable" in str(exc):
        from .exceptions import NotMigrated

        raise NotMigrated(database_alias(using), str(exc).strip().splitlines()[0]) from exc


def fetchone(sql: str, params=None, using: str | None = None):
    rows = fetchall(sql, params, using)
    return rows[0] if rows else None


def execute(sql: str, params=None, using: str | None = None) -> int:
    watch = engine_thread.watch
    if watch is not None:
        with watch.statement(using):
            return _execute(sql, params, using)
    return _execute(sql, params, using)


def _execute(sql, params, using):
    try:
        with connection(using).cursor() as cur:
            cur.execute(sql, params)
            return cur.rowcount
    except ProgrammingError as exc:
        _not_migrated(exc, using)
        raise


def _text_element(v) -> str:
    return "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pg_array(values) -> str:
    """Render a batch column as a Postgres array literal ('{1,"a b",NULL}').

    Hot-path batches travel as typed arrays through unnest (docs/design.md#model). psycopg dumps a
    Python list element by element in Python (~120 µs per 50-element array here);
    rendering the literal ourselves and letting the statement's cast (`::bigint[]`,
    `::text[]`…) parse it server-side costs a fraction of that (a flush's columns that
    vary, the id arrays of the other batch statements). Elements: None, bool, int,
    float, str, datetime (ISO 8601).
    Homogeneous int, float, bool and str columns (ids, weights, flags, names, JSON
    texts) take a fast path: the str one escapes the whole column in three C-level
    replaces instead of per element.
    """
    values = values if type(values) is list else list(values)
    kinds = set(map(type, values))
    if len(kinds) == 1 and len(values) > 1 and values.count(values[0]) == len(values):
        # One repeated value (the state of rows of one shape, a NULL column): rendered once.
        return "{" + ",".join([pg_array(values[:1])[1:-1]] * len(values)) + "}"
    kinds.discard(type(None))
    if kinds == {int} or not kinds:
        if None in values:
            return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"
        return "{" + ",".join(map(str, values)) + "}"
    if kinds == {float} and None not in values:  # weights, delays
        return "{" + ",".join(map(float.__repr__, values)) + "}"
    if kinds == {bool} and None not in values:  # flags
        return "{" + ",".join(["t" if v else "f" for v in values]) + "}"
    if kinds == {str}:
        if None not in values:
            joined = _SEP.join(values)
            if joined.count(_SEP) == len(values) - 1:  # no element holds the separator
                return '{"' + joined.replace("\\", "\\\\").replace('"', '\\"').replace(_SEP, '","') + '"}'
        return "{" + ",".join(map(_text_element, values)) + "}"
    out = []
    for v in values:
        if v is None:
            out.append("NULL")
        elif v is True:
            out.append("t")
        elif v is False:
            out.append("f")
        elif isinstance(v, int):
            out.append(str(int(v)))  # int(): an IntEnum's str/repr is its name
        elif isinstance(v, float):
            out.append(repr(float(v)))
        elif isinstance(v, str):
            out.append(_text_element(v))
        else:  # datetime and friends
            out.append('"' + v.isoformat() + '"')
    return "{" + ",".join(out) + "}"


_SEP = "\x1f"  # joins a str column before escaping it whole (checked absent from the elements)


def batch_column(values: list) -> tuple[str | None, object]:
    """One column of a batch statement as (array literal, None), or (None, value) when
    every element is the same value of the same type — the statement then reads the one
    value (`COALESCE(r.col, %(col_1)s)`) instead of parsing an array of copies
    (insert_all.sql: ~0.2 s of 0.9 s server time for 100k rows of one machine)."""
    if values and values.count(values[0]) == len(values) and len(set(map(type, values))) == 1:
        return None, values[0]
    return pg_array(values), None


# --- error classification ----------------------------------------------------------

# SQLSTATEs after which the session is gone or unusable: class 08 (connection
# exception), the server shutting down or refusing sessions (57P01-57P03), no
# connection slot (53300), and a session that landed on a read-only standby (25006,
# after a failover). Everything else — data (22), integrity (23), program limits (54),
# syntax/rules (42), … — is a property of the statement and its values: the same
# connection is fine for other statements.
# 57P05 is idle_session_timeout and 25P03 an idle-in-transaction kill: the server closed
# the session.
CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "57P05", "53300", "25006", "25P03"})


def _sqlstate(exc: BaseException) -> str | None:
    seen = 0
    while exc is not None and seen < 8:  # Django wraps the driver's error as __cause__
        state = getattr(exc, "sqlstate", None)
        if state:
            return state
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def is_connection_error(exc: BaseException) -> bool:
    """True when `exc` means the database session is lost or unusable; False for errors
    that belong to a statement or its values (data, integrity, limits, syntax…).

    The one classification the engine uses wherever it decides between "reconnect and
    try again later" and "this statement's data is bad" (the flusher's per-outcome
    retry, reconnect decisions). Rules: an error carrying a SQLSTATE is a connection
    error iff its class is 08 or it is one of CONNECTION_SQLSTATES; a driver error
    without a SQLSTATE (the socket broke, the connection is closed) is one iff it is an
    OperationalError or InterfaceError; any other exception is not.
    """
    from django.db import InterfaceError, OperationalError
    import psycopg

    state = _sqlstate(exc)
    if state is not None:
        return state.startswith("08") or state in CONNECTION_SQLSTATES
    return isinstance(exc, (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError))


# SQLSTATEs that say "try the same thing again": serialization failure, deadlock,
# lock not available (lock_timeout), statement cancelled (statement_timeout).
# Also prepared statements a transaction pooler lost or duplicated (26000, 42P05): the
# statement is fine, the session it landed on did not have (or already had) its plan.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57014", "26000", "42P05"})


def is_key_conflict(exc: BaseException) -> bool:
    """True for a unique violation (23505) on the correlation guard: another row holds
    the key in a status this row's move would reserve it in."""
    seen = 0
    while exc is not None and seen < 8:
        if getattr(exc, "sqlstate", None) == "23505":
            diag = getattr(exc, "diag", None)
            return getattr(diag, "constraint_name", None) == "gen_durable_correlation"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def is_lock_timeout(exc: BaseException) -> bool:
    """True for lock_timeout (55P03): a row stayed locked by another session too long."""
    return _sqlstate(exc) == "55P03"


def is_transient_error(exc: BaseException) -> bool:
    """True for a connection error or a statement that may succeed when retried as is."""
    return is_connection_error(exc) or _sqlstate(exc) in TRANSIENT_SQLSTATES


# --- the connection state user code leaves behind ------------------------------------


_OPEN_TRANSACTION = frozenset((int(TransactionStatus.INTRANS), int(TransactionStatus.INERROR)))


def _dangling(conn) -> bool:
    """Whether `conn` is inside a transaction its owner never finished."""
    if conn.in_atomic_block or conn.closed_in_transaction:
        return True
    raw = conn.connection
    if raw is None:
        return False
    if not conn.autocommit:  # transaction.set_autocommit(False) left behind
        return True
    try:
        # libpq's status as a plain int (ConnectionInfo.transaction_status builds an enum
        # on every read; this runs after every step).
        return raw.pgconn.transaction_status in _OPEN_TRANSACTION
    except Exception:  # a broken connection: close_old_connections() deals with it
        return False


def thread_is_clean() -> bool:
    """True when none of this thread's open connections is inside a transaction.

    The engine's step threads start every step clean; `drain()` inside a test's
    `transaction.atomic()` does not, and is then left alone by `discard_dangling`.
    A step thread (`engine_thread.opened` set, see `mark_step_thread`) ends every job
    with `discard_dangling`, so it is clean by construction and the scan of its
    connections (~4 µs per step through Django's connection handler) is skipped.
    """
    if engine_thread.opened is not None:
        return True
    return not any(_dangling(c) for c in connections.all(initialized_only=True))


def mark_step_thread() -> None:
    """Call on a step thread before its first step: from now on it tracks the connections
    it opens (`thread_connections`) and counts as clean before each step — the step
    loop ends every job with `discard_dangling`."""
    engine_thread.opened = []


def _track_connection(sender, connection, **kwargs):
    """`connection_created` receiver: a step thread (`engine_thread.opened`) keeps the
    connections it opens, so after each step it looks at those (usually one) instead of
    walking every alias through Django's connection handler (~3 µs a walk, two walks
    per step). Only a connection that was opened can hold a transaction or an error."""
    opened = engine_thread.opened
    if opened is not None and not any(c is connection for c in opened):
        opened.append(connection)


connection_created.connect(_track_connection, dispatch_uid="gen_durable.db.track_connection")


def thread_connections() -> list:
    """This thread's connections that may be open: on a step thread the ones it opened,
    elsewhere every initialized one."""
    opened = engine_thread.opened
    return connections.all(initialized_only=True) if opened is None else list(opened)


def replaced_connections() -> int:
    """How many connection wrappers `discard_dangling` has replaced on this thread (a
    step thread re-applies its options to a new wrapper only after one was)."""
    return engine_thread.replaced


def discard_dangling(where) -> list[str]:
    """Restore this thread's connections after user code (a step, `handle()`).

    A connection left inside an atomic block, a raw `BEGIN`, a failed transaction or
    with autocommit off is closed — which rolls its transaction back on the server —
    and forgotten, so the next statement of this thread opens a fresh one instead of
    writing into a transaction nobody will commit (or failing with "connection is
    closed"). Logs a warning naming `where` (machine and step: a str, or an object
    whose str() is rendered only for that warning). Returns the aliases
    discarded. Call only when the thread was clean before the user code ran.
    """
    discarded = []
    for conn in thread_connections():
        if not _dangling(conn):
            continue
        discarded.append(conn.alias)
        logger.warning("%s left a transaction open on database %r; it was rolled back and the "
                       "connection discarded (its writes since the transaction began are lost)",
                       where, conn.alias)
        try:
            conn.close()  # closes the socket: the server rolls the transaction back
        except Exception:
            logger.debug("closing the dangling connection %r failed", conn.alias, exc_info=True)
        del connections[conn.alias]  # the wrapper's atomic state is gone with it
        engine_thread.replaced = replaced_connections() + 1
        opened = engine_thread.opened
        if opened is not None:
            opened[:] = [c for c in opened if c is not conn]
    return discarded
