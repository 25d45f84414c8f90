"""Admission of configured limits: concurrency gates and token-bucket rate limits.

One interface (`Limiter`), two backends: `PostgresLimiter` (default; counters are rows of
gen_durable_buckets) and `RedisLimiter` (LIMITER={"BACKEND": "redis", ...}). The engine
calls it at four points:

  admit(jobs, queue) -> Admission
      After a claim (worker/claims.py `pick`): which claimed rows may run now. `jobs` are
      claimed rows (executing, held by one worker) in admission order, most urgent first;
      a list of one already-claimed row works the same way (e.g. to admit a row's next
      step after an inline transition commits). Admitted rows get an opaque slot to
      credit later (None for rate-only rows); denied rows are NOT touched: the caller
      requeues them with eligible_at = now + Admission.retry_in[id] (claims.defer, or
      the normal outcome path). Constant cost per call: Postgres one transaction of two
      statements, Redis one script round-trip, whatever the number of rows.
  credit(slots)
      After rows leave executing: committed outcomes (Next, Retry, Await, Done, Stop,
      ScheduleChildren), cancel, reap, release. Postgres (`transactional = True`) must be
      called inside the transaction that moves the rows; Redis after it.
  renew(slots)
      Each heartbeat, for the slots of the rows a worker holds (Redis slots are leases).
  reconcile() -> {"buckets": n, "gates": n}
      Each GC sweep: Postgres recomputes gate counters from the executing rows (after a
      kill -9) and sweeps idle rate buckets; Redis has nothing to heal.

An unconfigured concurrency key is K=1 whatever the backend: the unique arbiter index,
in the claim itself. See docs/guide.md, "Limits", for the user-facing rules.
"""

from __future__ import annotations

from ..conf import get_settings
from .base import Admission, Limiter, NullLimiter  # noqa: F401
from .config import Gate, Limits, RateLimit, get_limits, name_of  # noqa: F401

_cache: dict = {}


def get_limiter(using=None) -> Limiter:
    """The limiter of the current settings for database alias `using` (one per process).

    Raises ImportError (with the fix) when LIMITER selects Redis and `redis` is missing.
    """
    settings = get_settings()
    key = (id(settings), using)
    limiter = _cache.get(key)
    if limiter is None or limiter._settings is not settings:
        limiter = _build(settings, using)
        limiter._settings = settings
        _cache.clear()
        _cache[key] = limiter
    return limiter


def unknown_rate_limits(using=None) -> list[tuple[str, int, int]]:
    """(name, rows, lowest id) of each rate-limit name that runnable or executing rows
    carry but RATE_LIMITS lacks, most rows first, at most 20 (one statement)."""
    from .. import db, sql

    names = sorted(get_limits().rates)
    return [tuple(r) for r in db.fetchall(sql.UNKNOWN_RATE_LIMITS, {"names": db.pg_array(names)}, using)]


def _build(settings, using) -> Limiter:
    lim = settings.LIMITER
    if isinstance(lim, dict) and lim.get("BACKEND") == "redis":
        try:
            from .redis import RedisLimiter
        except ImportError as exc:  # pragma: no cover - depends on the environment
            from ..conf import install_hint

            raise ImportError(f"GEN_DURABLE['LIMITER'] selects Redis: {install_hint('redis')}") from exc
        return RedisLimiter(lim["URL"], prefix=lim.get("PREFIX", "gen_durable:"), lease_ttl=settings.LEASE_TTL,
                            using=using)
    from .postgres import PostgresLimiter

    return PostgresLimiter(using)
