"""Helpers for testing user code against gen_durable (docs/guide.md).

`drain()` runs everything runnable in the calling thread through the production pick,
executor and flush code, so it works inside pytest-django's transactional tests (its
statements join the test's transaction). It is not the engine: one step at a time,
no reaper, no heartbeats.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter

from . import db, sql
from .conf import get_settings
from .worker.claims import adopt_known, pick
from .worker.executor import execute
from .worker.flusher import flush

_QUEUES_DUE = (
    "SELECT DISTINCT queue FROM gen_durable WHERE status = 'runnable' AND eligible_at <= now() "
    "AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)"
)
_COLLAPSE = (
    "UPDATE gen_durable SET eligible_at = now() WHERE status = 'runnable' AND eligible_at > now() "
    "AND unknown_since IS NULL AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)"
)

KIND_NAMES = {"next": "next", "retry": "retry", "await": "await", "schedule": "schedule_children",
              "done": "done", "stop": "stop"}


class DrainLimitExceeded(AssertionError):
    """drain() would run more than max_steps steps."""


def drain(queue: str | None = None, *, with_scheduled: bool = True, max_steps: int = 1000,
          using: str | None = None) -> Counter:
    """Run runnable instances until none is left; return a Counter of outcome kinds.

    Args:
        queue: only this queue (default: every queue).
        with_scheduled: also run rows scheduled in the future (delays and backoff collapse).
        max_steps: raise DrainLimitExceeded instead of running more steps than this.
    Returns: Counter with "steps" and one key per outcome kind (next, retry, await,
        schedule_children, done, stop), plus "stale" for outcomes that lost their claim.
    A row whose machine, version or step this process does not know is handed back
    untouched, as by a worker (docs/guide.md, "Deploying"), and not counted.
    """
    tally: Counter = Counter()
    worker = f"drain:{uuid.uuid4().hex[:8]}"
    ttl = get_settings().LEASE_TTL
    from .limiter import get_limiter

    limiter = get_limiter(using)
    gates = limiter.gate_names()
    while True:
        # Rows a worker that did not know them handed back (docs/guide.md, "Deploying"):
        # runnable again when this process knows them, as a worker's scheduler does.
        for q in sorted({r[0] for r in db.fetchall(sql.UNKNOWN_WAITING, {}, using)}):
            if queue is None or q == queue:
                adopt_known(q, 1_000_000, using)
        if with_scheduled:
            db.execute(_COLLAPSE, {"queue": queue}, using)
        queues = [r[0] for r in db.fetchall(_QUEUES_DUE, {"queue": queue}, using)]
        ran = 0
        for q in sorted(queues):
            jobs = pick(q, 100, worker, ttl, gates=gates, using=using, limiter=limiter)
            for i, job in enumerate(jobs):
                if tally["steps"] >= max_steps:
                    from .worker.claims import release_jobs

                    # The batch runs in pick order, not id order: release the rest by position.
                    release_jobs(jobs[i:], worker, limiter, using)
                    raise DrainLimitExceeded(f"drain() stopped at max_steps={max_steps}; raise it or "
                                             "look for a machine that never terminates")
                entry = execute(job)
                result = flush([entry], using, limiter)
                tally["steps"] += 1
                tally["stale" if result.stale else KIND_NAMES[entry.kind]] += 1
                ran += 1
        if not ran:
            # Async steps reached the database through asgiref's shared sync thread: close
            # its connection, or the test database could not be dropped at the session's end.
            from .worker import aio

            aio.close_sync_thread_connections()
            return tally


def stop_result_watchers() -> None:
    """Close the connections `gd.await_result` LISTENs on (one per database, opened by
    the first call that had to wait). Call it at the end of a test session, before the
    test database is dropped: an open one makes the drop fail ("database ... is being
    accessed by other users"). With pytest-django:

        @pytest.fixture(scope="session", autouse=True)
        def _gd_watchers(django_db_setup):
            yield
            stop_result_watchers()

    A later await_result starts them again."""
    from .results import ResultWatcher

    ResultWatcher.shutdown()


def fire_timeouts(using: str | None = None) -> int:
    """Fire every armed Await deadline now, whatever time is left; return how many."""
    rows = db.fetchall(sql.EXPIRE_AWAITS, {"force": True, "limit": 1_000_000}, using)
    return len(rows)


def durable(target, using: str | None = None) -> dict | None:
    """The row as a dict; a string target resolves to the latest row with that correlation key."""
    from .models import Instance

    qs = Instance.objects.using(using or get_settings().DATABASE)
    row = (qs.filter(id=target) if isinstance(target, int) else
           qs.filter(correlation_key=target).order_by("-id")).first()
    if row is None:
        return None
    return {f: getattr(row, f) for f in ("id", "fsm", "step", "status", "state", "result", "last_error",
                                          "attempt", "awaits", "queue")}


def _describe(target, row):
    return (f"gen_durable instance {target!r}: status={row['status']} step={row['step']} "
            f"attempt={row['attempt']} last_error={row['last_error']!r}")


def _row(target, using):
    row = durable(target, using)
    if row is None:
        raise AssertionError(f"no gen_durable instance {target!r}")
    return row


def assert_status(target, status: str, using=None) -> dict:
    """Assert the instance's status; the message shows step, attempt and last_error."""
    row = _row(target, using)
    assert row["status"] == status, f"expected {status}, got " + _describe(target, row)
    return row


def assert_awaiting(target, names, using=None) -> dict:
    """Assert the instance is parked awaiting (at least) `names`."""
    names = [names] if isinstance(names, str) else list(names)
    row = assert_status(target, "awaiting_signal", using)
    missing = set(names) - set(row["awaits"] or ())
    assert not missing, f"{target!r} awaits {row['awaits']}, not {sorted(missing)}"
    return row


_ANY = object()


def assert_done(target, result=_ANY, using=None) -> dict:
    """Assert the instance is done (and, when given, that its result equals `result`)."""
    row = assert_status(target, "done", using)
    if result is not _ANY:
        assert row["result"] == result, f"{target!r} result {row['result']!r} != {result!r}"
    return row


def assert_failed(target, error=_ANY, using=None) -> dict:
    """Assert the instance failed; `error` is a substring or a compiled regex of last_error."""
    row = assert_status(target, "failed", using)
    if error is not _ANY:
        text = row["last_error"] or ""
        ok = error.search(text) if isinstance(error, re.Pattern) else error in text
        assert ok, f"{target!r} last_error {text!r} does not match {error!r}"
    return row
