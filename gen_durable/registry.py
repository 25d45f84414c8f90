"""Machine registry: (name, version) → class.

Machines register themselves when their class is created. A row's `fsm` is resolved
only against classes already imported — never by importing a module named in the
database. `durable.py` modules of installed apps are imported by `apps.ready()`.
"""

from __future__ import annotations

import threading

from django.core.exceptions import ImproperlyConfigured

from .exceptions import UnknownMachine

_lock = threading.Lock()
_machines: dict[tuple[str, int], type] = {}
_known: tuple | None = None  # (fsms, versions, steps) of every registered step, rebuilt on register


def register(cls) -> None:
    key = (cls.name, cls.version)
    with _lock:
        old = _machines.get(key)
        if old is not None and old is not cls:
            same_place = (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__)
            if not same_place:
                raise ImproperlyConfigured(
                    f"gen_durable machine {cls.name!r} version {cls.version} is defined twice: "
                    f"{old.__module__}.{old.__qualname__} and {cls.__module__}.{cls.__qualname__}; "
                    "give one a distinct `name` or `version`"
                )
        _machines[key] = cls
        global _known
        _known = None


def get(name: str, version: int = 1):
    """Return the machine class registered as (name, version); raise UnknownMachine."""
    try:
        return _machines[(name, version)]
    except KeyError:
        raise UnknownMachine(name, version) from None


def latest(name: str):
    """Return the highest registered version of `name`; raise UnknownMachine."""
    versions = [v for (n, v) in _machines if n == name]
    if not versions:
        import difflib

        close = difflib.get_close_matches(name, sorted({n for (n, _) in _machines}), n=1) if isinstance(name, str) else []
        raise UnknownMachine(name, close=close[0] if close else None)
    return _machines[(name, max(versions))]


def all_machines() -> dict:
    return dict(_machines)


def async_only(queue: str) -> bool:
    """Whether every registered machine routed to `queue` has only `async def` steps (and
    at least one machine is). Such a queue's steps run on the worker's event loop, not on
    step threads: its concurrency needs neither threads nor connections
    (docs/reliability.md, "Connections")."""
    import inspect

    machines = [cls for cls in _machines.values() if getattr(cls, "queue", None) == queue]
    return bool(machines) and all(
        cls.steps and all(inspect.iscoroutinefunction(getattr(cls, attr)) for attr in cls.steps.values())
        for cls in machines)


# Step threads of an async-only queue: sync work that still reaches it (a row inserted with
# `queue=` from a sync machine) runs on this many threads, one after another.
ASYNC_QUEUE_THREADS = 1


def step_threads(queue: str, concurrency: int) -> int:
    """Most step threads (each may hold a database connection) a queue of `concurrency` starts."""
    return min(concurrency, ASYNC_QUEUE_THREADS) if async_only(queue) else concurrency


def step_names(cls) -> set:
    """The step names a row of `cls` may be parked under: its steps and their aliases."""
    return set(cls.steps) | set(getattr(cls, "step_aliases", {}) or {})


def knows(name: str, version: int, step: str) -> bool:
    """Whether this process can run a row of (name, version) parked at `step`.

    False during a rolling deploy for a row only the other release defines: such a row
    is handed back untouched, never failed (docs/guide.md, "Deploying")."""
    cls = _machines.get((name, version))
    return cls is not None and (step in cls.steps or step in (getattr(cls, "step_aliases", None) or ()))


def known_steps() -> tuple[list, list, list]:
    """Every (name, version, step) this process runs, as three parallel lists (the
    columns of sql/adopt_known.sql)."""
    global _known
    known = _known
    if known is None:
        rows = sorted((name, version, step) for (name, version), cls in list(_machines.items())
                      for step in step_names(cls))
        known = _known = ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return known
