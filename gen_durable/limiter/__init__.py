"""Admission of configured limits (SPEC §4.6 gates, §4.7 rate limits).

One interface, called by the engine at four points (seed internals "The pick"):
  admit(entries)  after a claim: which claimed rows may run now
  credit(slots)   after a committed outcome: give held gate slots back
  renew(slots)    on each heartbeat: keep lease-native slots (Redis) alive
  reconcile()     in each GC sweep: heal counters from the executing rows
Until the limiter issue lands, `NullLimiter` admits everything, and an unconfigured
concurrency key is K=1 (the unique arbiter, in-band) whatever the backend.
"""

from .base import Admission, Limiter, NullLimiter  # noqa: F401


def get_limiter(using=None) -> "Limiter":
    """Return the limiter for the current settings (the null limiter for now)."""
    return NullLimiter()
