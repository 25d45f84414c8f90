"""The configured limits, parsed once from GEN_DURABLE (RATE_LIMITS, CONCURRENCY_LIMITS).

Settings are validated by system checks (checks.py, E007); this module only turns
valid entries into values the backends use. Rates are tokens per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured

from ..conf import get_settings

MAX_GATE_LIMIT = 2**53  # counters are float8: exact integers up to here
DEFAULT_GATE_RETRY = 0.25  # seconds: a denied gated row is re-offered after this, spaced per `limit` rows


@dataclass(frozen=True)
class RateLimit:
    """A token bucket: `burst` tokens at most, refilled at `rate` tokens per second."""

    name: str
    rate: float
    burst: float
    shards: int

    @property
    def shard_capacity(self) -> float:
        return self.burst / self.shards

    @property
    def shard_rate(self) -> float:
        return self.rate / self.shards


GATE_SCOPES = ("name", "key")


@dataclass(frozen=True)
class Gate:
    """A concurrency gate: at most `limit` rows execute at once per counter.

    per="name" (the default): one counter for the name — every key `name` or
    `name:<anything>` shares the `limit` slots. per="key": a counter per key — `name:a`
    and `name:b` each get `limit` slots (a per-tenant cap, say).
    """

    name: str
    limit: int
    shards: int
    retry: float
    per: str = "name"

    def bucket(self, key: str) -> str:
        """The counter a row of concurrency key `key` draws its slot from."""
        return self.name if self.per == "name" else key

    def shard_capacity(self, shard: int) -> int:
        """Slots of `shard`: the limit split as evenly as possible (the first shards take the remainder)."""
        base, extra = divmod(self.limit, self.shards)
        return base + (1 if shard < extra else 0)


@dataclass(frozen=True)
class Limits:
    rates: dict   # name -> RateLimit
    gates: dict   # name -> Gate

    def rate_for(self, key: str | None) -> RateLimit | None:
        """The RateLimit of a row's `rate_limit` ("name" or "name:partition"), or None."""
        return None if key is None else self.rates.get(name_of(key))

    def gate_for(self, key: str | None) -> Gate | None:
        """The Gate of a row's `concurrency_key` (or of a counter's key), or None."""
        return None if key is None else self.gates.get(name_of(key))

    def gate_bucket(self, key: str | None) -> str | None:
        """The gate counter a row of concurrency key `key` holds its slot in (None: no gate).

        A key whose gate is no longer configured keeps its own counter, so a slot taken
        before a configuration change is still given back somewhere the reconciler heals.
        """
        if key is None:
            return None
        gate = self.gate_for(key)
        return key if gate is None else gate.bucket(key)

    def describe(self) -> str:
        parts = [f"rate {r.name}: {r.rate:g}/s burst {r.burst:g}" + (f" shards {r.shards}" if r.shards > 1 else "")
                 for r in self.rates.values()]
        parts += [f"gate {g.name}: limit {g.limit} per {g.per}" + (f" shards {g.shards}" if g.shards > 1 else "")
                  for g in self.gates.values()]
        return "; ".join(parts) or "none"


def valid_limit_name(name) -> bool:
    """A limit name matches keys `name` and `name:<anything>`: a non-empty str without ':'."""
    return isinstance(name, str) and bool(name) and ":" not in name


def name_of(key: str) -> str:
    """The limit name of a key: the part before the first ':'."""
    return key.split(":", 1)[0]


def parse(rate_limits: dict, concurrency_limits: dict) -> Limits:
    """Parse RATE_LIMITS and CONCURRENCY_LIMITS.

    Raises ImproperlyConfigured naming the entry when one is malformed (system check
    gen_durable.E007 reports the details; `rundurable` never starts with one).
    """
    rates, gates = {}, {}
    try:
        for name, cfg in (rate_limits or {}).items():
            where = f"GEN_DURABLE['RATE_LIMITS'][{name!r}]"
            if not valid_limit_name(name):
                raise ValueError("a limit name is a non-empty str without ':'")
            allowed, period = float(cfg["allowed"]), float(cfg["period"])
            burst = float(cfg.get("burst", allowed))
            if not all(map(finite, (allowed, period, burst))):
                raise ValueError("'allowed', 'period' and 'burst' must be finite")
            rates[name] = RateLimit(name=name, rate=allowed / period, burst=burst, shards=int(cfg.get("shards", 1)))
        for name, cfg in (concurrency_limits or {}).items():
            where = f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}]"
            if not valid_limit_name(name):
                raise ValueError("a limit name is a non-empty str without ':'")
            limit = int(cfg["limit"])
            shards = int(cfg.get("shards", 1))
            if not 1 <= limit <= MAX_GATE_LIMIT:
                raise ValueError(f"'limit' must be 1..2**53, not {limit}")
            if not 1 <= shards <= limit:
                raise ValueError(f"'shards' must be 1..limit ({limit}), not {shards}")
            per = cfg.get("per", "name")
            if per not in GATE_SCOPES:
                raise ValueError(f"'per' must be one of {GATE_SCOPES}, not {per!r}")
            gates[name] = Gate(name=name, limit=limit, shards=shards,
                               retry=float(cfg.get("retry", DEFAULT_GATE_RETRY)), per=per)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as exc:
        raise ImproperlyConfigured(f"{where} is malformed ({type(exc).__name__}: {exc}); "
                                   "run `manage.py check` for details") from exc
    return Limits(rates=rates, gates=gates)


_cache: list = [None, None]  # [settings object, its Limits]: reparsed when the settings change


def get_limits() -> Limits:
    """The Limits of the current settings (cached with them)."""
    settings = get_settings()
    if _cache[0] is not settings:
        _cache[1] = parse(settings.RATE_LIMITS, settings.CONCURRENCY_LIMITS)
        _cache[0] = settings
    return _cache[1]


def finite(x: float) -> bool:
    return not (math.isinf(x) or math.isnan(x))
