"""Helpers shared by the tests that open a second database session."""

import threading
from collections import Counter
from pathlib import Path

from django.db import connection

from gen_durable import db as gd_db


class ConnectionThread(threading.Thread):
    """Run `fn` on its own Django connection; join_result() re-raises its error."""

    def __init__(self, fn):
        super().__init__(daemon=True)
        self.fn, self.result, self.error = fn, None, None

    def run(self):
        try:
            self.result = self.fn()
        except BaseException as exc:  # re-raised in the test thread
            self.error = exc
        finally:
            connection.close()

    def join_result(self, timeout=30):
        self.join(timeout)
        assert not self.is_alive(), "thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result


class PausingDb:
    """gen_durable.db as flusher.flush sees it, with a hook run before (or after) chosen statements.

    A seam between two statements of the real flush transaction — every statement still
    goes to the database (no cursor is mocked).
    """

    def __init__(self, hooks, after=False):
        self.hooks, self.after = hooks, after

    def __getattr__(self, name):
        return getattr(gd_db, name)

    def fetchall(self, text, params=None, using=None):
        hook = self.hooks.get(text)
        if hook is not None and not self.after:
            hook()
        rows = gd_db.fetchall(text, params, using)
        if hook is not None and self.after:
            hook()
        return rows


def log_lines(path):
    """(id, attempt, what, pid) per line of a step log (the fault machines' and Recorder's)."""
    path = Path(path)
    if not path.exists():
        return []
    fields = (line.split() for line in path.read_text().splitlines())
    return [(int(i), int(a), w, int(p)) for i, a, w, p in (f for f in fields if len(f) == 4)]


def tally(path, what):
    """How many `what` lines ("start", "end"…) each id has in the step log."""
    return Counter(i for i, _, w, _ in log_lines(path) if w == what)


def record_rechecks(monkeypatch) -> list:
    """Record the ids of every buffered-row re-check (`still_owned`) the scheduler runs,
    one sorted list per statement, while still running it."""
    from gen_durable.worker import scheduler

    calls = []
    real = scheduler.still_owned

    def counting(jobs, worker, using=None):
        calls.append(sorted(j.id for j in jobs))
        return real(jobs, worker, using)

    monkeypatch.setattr(scheduler, "still_owned", counting)
    return calls


def sessions(application_name):
    """Sessions of this test database with that application_name (pg_stat_activity)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name = %s", [application_name])
        return cur.fetchone()[0]


def role_name(sup, role, queue):
    """The application_name of `role`'s connection in worker `sup`."""
    part = {"feeder": f"feeder {queue}", "listener": "listener gen_durable"}.get(role, role)
    return f"gen_durable {part} {sup.token}"
