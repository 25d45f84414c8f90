"""`settings.GEN_DURABLE` → a frozen `Settings` (docs/design.md#settings).

Read it with `get_settings()`; the value is cached and reset when Django's
`setting_changed` signal fires (so `override_settings` works in tests). Validation
lives in checks.py; `get_settings()` itself only merges defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

DEFAULTS: dict[str, Any] = {
    "DATABASE": "default",
    # Where a machine's or queue's instances live when a call passes no using=:
    # {"MACHINES": {name: alias}, "QUEUES": {queue: alias}} (a machine's entry wins);
    # anything unrouted lives on DATABASE (docs/scaling.md).
    "DATABASES": {},
    "QUEUES": {"default": 10},
    # Queues this deployment's workers do not run but other deployments do: insert and
    # pause_queue accept them (names, or fnmatch patterns such as "tenant-*"; "*" accepts
    # any name). Every other queue must be a key of QUEUES or a registered machine's queue.
    "EXTRA_QUEUES": (),
    "RATE_LIMITS": {},
    "CONCURRENCY_LIMITS": {},
    "LIMITER": "postgres",
    "LEASE_TTL": 60,
    # None: LEASE_TTL / 3, so a lease outlives two missed renewals whatever LEASE_TTL is.
    "HEARTBEAT_INTERVAL": None,
    "POLL_INTERVAL": 1,
    "MAX_POLL_INTERVAL": 5,
    "NOTIFY": "postgres",
    # None: sized from the measured step rate (docs/guide.md, "Tuning throughput"); an int: fixed.
    "PREFETCH": None,
    "MIN_DEMAND": None,
    # MAX_BATCH: outcomes per group commit, as many as the adaptive claim-ahead buffers at most.
    "FLUSH": {"MAX_BATCH": 500, "MAX_DELAY": 0.005, "MAX_BYTES": 8 * 1024 * 1024},
    "REAPER": {"INTERVAL": 30},
    "GC": {"INTERVAL": 60, "RETENTION": 86400, "BATCH": 10000},
    # The timeline of each instance (gen_durable_history, the admin's detail page): one
    # entry per attempt that committed, written after its commit (one statement for many
    # flushes); the GC sweep deletes entries older than RETENTION seconds and all but an
    # instance's newest MAX_PER_INSTANCE (docs/guide.md "Instance history").
    "HISTORY": {"ENABLED": True, "RETENTION": 86400, "MAX_PER_INSTANCE": 100},
    "DRAIN_TIMEOUT": 5,
    # An inline chain (steps continuing in the same worker) yields back to the pick after
    # MAX_STEPS steps or MAX_SECONDS seconds, whichever comes first.
    "INLINE": {"MAX_STEPS": 100, "MAX_SECONDS": 10},
    # Seconds a step may run when it sets no timeout of its own (None: unbounded);
    # past it the step is abandoned as a StepTimeout (docs/guide.md "Time").
    "MAX_STEP_SECONDS": 3600,
    # Seconds after which a step still running is reported once: a WARNING on
    # gen_durable.worker and a `step.slow` event (None: never). It keeps running.
    "SLOW_STEP_SECONDS": 300,
    # Cron schedules: name -> {"cron", "machine", "state", "timezone", "catch_up"}
    # (gen_durable/schedules.py, docs/guide.md "Time").
    "SCHEDULES": {},
    # gd.insert_async's buffered producer (gen_durable/producer.py): rows per insert_all,
    # seconds a row may wait for its batch, rows queued at most, an optional dotted path
    # to on_error(error, specs).
    "PRODUCER": {"MAX_BATCH": 1000, "MAX_DELAY": 0.1, "MAX_BUFFER": 10000, "ON_ERROR": None},
    # Not in the settings table of docs/guide.md: the largest encoded state/result/payload accepted (docs/design.md#reliability-bars).
    "MAX_PAYLOAD_BYTES": 1_048_576,
    # OpenTelemetry spans and metrics (gen_durable/integrations/otel.py; needs the `otel` extra):
    # False, True, or {"TRACES": bool, "METRICS": bool}.
    "OPENTELEMETRY": False,
    # Bounds on the worker's own statements (seconds; docs/reliability.md). A flush that
    # waits LOCK_TIMEOUT on a row someone else locked is retried without that row.
    "LOCK_TIMEOUT": 5,
    "STATEMENT_TIMEOUT": 30,
    # None: direct connections to Postgres. "transaction": behind a transaction-mode
    # pooler (PgBouncer) — no prepared statements, no LISTEN (polling), no session settings.
    "POOLER": None,
}

# Keys whose dict values merge over the defaults (a partial FLUSH keeps MAX_DELAY).
NESTED = ("FLUSH", "REAPER", "GC", "HISTORY", "INLINE", "PRODUCER")


@dataclass(frozen=True)
class Settings:
    DATABASE: str
    DATABASES: dict
    QUEUES: dict
    EXTRA_QUEUES: Any
    RATE_LIMITS: dict
    CONCURRENCY_LIMITS: dict
    LIMITER: Any
    LEASE_TTL: float
    HEARTBEAT_INTERVAL: float
    POLL_INTERVAL: float
    MAX_POLL_INTERVAL: float
    NOTIFY: str
    PREFETCH: int | None
    MIN_DEMAND: int | None
    FLUSH: dict
    REAPER: Any
    GC: Any
    HISTORY: Any
    DRAIN_TIMEOUT: float
    INLINE: dict
    MAX_STEP_SECONDS: Any
    SLOW_STEP_SECONDS: Any
    SCHEDULES: Any
    PRODUCER: dict
    MAX_PAYLOAD_BYTES: int
    OPENTELEMETRY: Any
    LOCK_TIMEOUT: float
    STATEMENT_TIMEOUT: float
    POOLER: Any
    unknown: tuple = field(default=())


def user_settings() -> dict:
    value = getattr(django_settings, "GEN_DURABLE", None) or {}
    return dict(value) if isinstance(value, dict) else {}


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Return the merged, frozen settings (defaults under `settings.GEN_DURABLE`)."""
    raw = user_settings()
    merged = {}
    for key, default in DEFAULTS.items():
        value = raw.get(key, default)
        if key in NESTED and isinstance(value, dict):
            value = {**default, **value}
        merged[key] = value
    if merged["HEARTBEAT_INTERVAL"] is None:
        merged["HEARTBEAT_INTERVAL"] = derived_heartbeat(merged["LEASE_TTL"])
    unknown = tuple(sorted(k for k in raw if k not in DEFAULTS))
    return Settings(**merged, unknown=unknown)


def derived_heartbeat(lease):
    """The heartbeat interval (seconds) when HEARTBEAT_INTERVAL is unset: LEASE_TTL / 3.

    A bad LEASE_TTL is passed through (the system check reports it).
    """
    if isinstance(lease, (int, float)) and not isinstance(lease, bool) and lease > 0:
        return lease / 3
    return lease


def history_enabled(settings: Settings | None = None) -> bool:
    """Whether the worker writes timeline entries (HISTORY['ENABLED'] is True; a bad
    HISTORY is check E110, and writes nothing until fixed)."""
    value = (settings or get_settings()).HISTORY
    return isinstance(value, dict) and value.get("ENABLED") is True


def database_alias(using: str | None = None) -> str:
    return using or get_settings().DATABASE


def routed_alias(fsm: str, queue: str) -> str | None:
    """The alias GEN_DURABLE['DATABASES'] gives machine `fsm` (its registered name) or,
    failing that, `queue`; None when neither is routed (then DATABASE applies)."""
    routes = get_settings().DATABASES
    if not routes or not isinstance(routes, dict):
        return None
    return (routes.get("MACHINES") or {}).get(fsm) or (routes.get("QUEUES") or {}).get(queue)


@receiver(setting_changed)
def _reset(setting, **kwargs):
    if setting in ("GEN_DURABLE", "DATABASES"):
        get_settings.cache_clear()


def install_hint(extra: str) -> str:
    """How to install the optional dependencies `extra` (an extra of pyproject.toml) names,
    in both forms a user may need: from a checkout, and from a package index."""
    return (f'install the {extra} extra (pip install -e "/path/to/gen_durable[{extra}]" from a checkout, '
            f'pip install "gen-durable[{extra}]" from a package index)')
