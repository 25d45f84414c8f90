"""The limiter interface, the admission logic both backends share, and the null limiter."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from .. import telemetry
from .config import Gate, Limits, RateLimit, get_limits, name_of

logger = logging.getLogger("gen_durable.limiter")

STALL = 60.0          # seconds: re-offer interval of a row that cannot be admitted as things are
MAX_DEFER = 3600.0    # seconds: no denied row is pushed further than this (config may change)
EPSILON = 1e-9        # token arithmetic tolerance


@dataclass
class Admission:
    """Result of `admit`.

    admitted: id -> slot (the opaque gate slot to credit later, None for a rate-only row).
    denied: ids in admission order.
    retry_in: id -> seconds until the row can next be admitted (its new eligible_at).
    """

    admitted: dict = field(default_factory=dict)
    denied: list = field(default_factory=list)
    retry_in: dict = field(default_factory=dict)


@dataclass
class Entry:
    """One row offered for admission, with its resolved limits."""

    job: object
    gate_key: str | None   # the gate counter (the gate's name, or the row's key when per="key")
    gate: Gate | None
    rate_key: str | None
    rate: RateLimit | None
    weight: float


@dataclass
class Decision:
    """What a backend decided: admitted ids with slots, tokens left per rate key."""

    admitted: dict
    tokens_left: dict = field(default_factory=dict)
    rate_denied: set = field(default_factory=set)  # ids denied (also) for want of tokens


class Limiter:
    """Admission of configured limits; see the package docstring for when each method runs.

    Subclasses implement `_decide`, `credit`, `renew`, `reconcile` and `slot_for`.
    """

    name = "base"
    _limits = None
    _horizon_lock = threading.Lock()  # per instance after __init__; shared by subclasses that skip it
    # True: credit() joins the caller's transaction (the flush that ends a row's step),
    # so the counters and the executing rows change together (see docs/guide.md, Limits).
    transactional = False

    def __init__(self, limits: Limits | None = None):
        self._limits = limits
        self._horizon: dict = {}  # ("rate"|"conc", key) -> monotonic instant of the last re-offer scheduled
        self._horizon_lock = threading.Lock()
        self._unknown_logged: dict = {}

    @property
    def limits(self) -> Limits:
        return self._limits if self._limits is not None else get_limits()

    def gate_names(self) -> list[str]:
        """Configured gate names: their keys bypass K=1 and are admitted by `admit`."""
        return sorted(self.limits.gates)

    def needs_admission(self, job) -> bool:
        """Whether a claimed row carries a rate limit, or a configured gate key without a slot."""
        return job.rate_limit is not None or (
            job.concurrency_key is not None and getattr(job, "slot", None) is None
            and self.limits.gate_for(job.concurrency_key) is not None)

    # --- admission ---------------------------------------------------------------
    def admit(self, jobs, queue: str) -> Admission:
        """Decide which of `jobs` (claimed rows, executing under one worker) may run now.

        jobs: objects with id, worker, concurrency_key, rate_limit, weight, fsm, step;
            their order is the admission order (most urgent first). A single
            already-claimed row works the same way; a row that already holds a slot
            (`job.slot`) of its gate keeps it and is admitted for its rate limit only.
        Returns an Admission; admitted gate slots are debited and (Postgres) stamped on
        the rows. Denied rows are left executing: the caller requeues them, with
        eligible_at = now + retry_in[id] so they leave the head of the queue.
        Rows with neither a configured gate nor a rate limit are admitted with slot None.
        """
        result = Admission()
        limits = self.limits
        entries: list[Entry] = []
        held = {}
        for job in jobs:
            gate = limits.gate_for(job.concurrency_key)
            rate = limits.rate_for(job.rate_limit)
            if gate is not None and getattr(job, "slot", None) is not None:
                # Already holds its slot (an inline continuation keeping its key): only
                # the rate limit is admitted, and the slot stays with the row.
                held[job.id] = job.slot
                gate = None
            if job.rate_limit is not None and (rate is None or job.weight > rate.burst + EPSILON):
                self._unadmittable(job, rate, queue)
                result.denied.append(job.id)
                result.retry_in[job.id] = STALL
                continue
            if gate is None and rate is None:
                result.admitted[job.id] = held.get(job.id)
                continue
            entries.append(Entry(job, gate.bucket(job.concurrency_key) if gate else None, gate,
                                 job.rate_limit if rate else None, rate, float(job.weight)))
        if not entries:
            return result
        decision = self._decide(entries, queue)
        result.admitted.update({i: held.get(i, slot) if slot is None else slot
                                for i, slot in decision.admitted.items()})
        denied = [e for e in entries if e.job.id not in decision.admitted]
        result.denied += [e.job.id for e in denied]
        result.retry_in.update(self._delays(denied, decision))
        self._throttle_events(entries, decision, queue)
        return result

    def _decide(self, entries: list[Entry], queue: str) -> Decision:  # pragma: no cover - abstract
        raise NotImplementedError

    def _unadmittable(self, job, rate, queue):
        name = name_of(job.rate_limit)
        if rate is None:
            telemetry.emit("rate_limit.unknown", {"count": 1},
                           {"key": job.rate_limit, "name": name, "fsm": job.fsm, "step": job.step})
            why = (f"rate limit {name!r} is not in GEN_DURABLE['RATE_LIMITS']; rows naming it stay runnable "
                   f"and are re-offered every {STALL:g}s until it is configured")
        else:
            why = (f"weight {job.weight:g} exceeds the burst {rate.burst:g} of rate limit {name!r}; "
                   "such a row can never be admitted (split the step or raise the burst)")
        now = time.monotonic()
        if "_unknown_logged" not in self.__dict__:
            self._unknown_logged = {}
        if now - self._unknown_logged.get(why, -STALL) >= STALL:  # one line per cause per minute
            self._unknown_logged[why] = now
            logger.warning("queue %s: %s#%s (key %r): %s", queue, job.fsm, job.id, job.rate_limit, why)

    def _delays(self, denied: list[Entry], decision: Decision) -> dict:
        """Seconds until each denied row can next be admitted, spread over time.

        Rate: the k-th denied row of a key waits until the bucket has refilled the
        cumulative weight ahead of it (including rows already deferred by earlier picks
        of this process: a per-key horizon), so a deep throttled backlog comes back at
        the refill rate instead of sitting at the head of the queue. Gate: the k-th denied
        row of a key comes back after retry × (1 + k // limit) seconds. Capped at MAX_DEFER.
        """
        now = time.monotonic()
        out = {}
        if "_horizon" not in self.__dict__:
            self._horizon = {}
        with self._horizon_lock:
            if len(self._horizon) > 10_000:
                self._horizon = {k: v for k, v in self._horizon.items() if v > now}
            tokens = dict(decision.tokens_left)
            gate_rank: dict = {}
            for e in denied:
                delay = 0.0
                if e.rate is not None:
                    key = ("rate", e.rate_key)
                    if e.rate.rate <= 0:
                        delay = STALL
                    else:
                        start = self._horizon.get(key, now)
                        if start <= now:
                            start, avail = now, tokens.get(e.rate_key, 0.0)
                        else:
                            avail = 0.0
                        deficit = e.weight - avail
                        tokens[e.rate_key] = max(avail - e.weight, 0.0)
                        at = start + max(deficit, 0.0) / e.rate.rate
                        self._horizon[key] = at
                        delay = at - now
                if e.gate is not None:
                    # When a slot frees is unknown: re-offer `limit` rows per `retry` seconds,
                    # in order. No horizon: a re-denied row must not push the others further.
                    k = gate_rank.get(e.gate_key, 0)
                    gate_rank[e.gate_key] = k + 1
                    delay = max(delay, e.gate.retry * (1 + k // e.gate.limit))
                out[e.job.id] = min(delay, MAX_DEFER)
        return out

    def _throttle_events(self, entries, decision, queue):
        gates, rates = {}, {}
        for e in entries:
            ok = e.job.id in decision.admitted
            if e.gate is not None:
                w = gates.setdefault(e.gate_key, [0, 0])
                w[0] += 1
                w[1] += ok
            if e.rate is not None:
                w = rates.setdefault(e.rate_key, [0, 0])
                w[0] += 1
                w[1] += ok
        for key, (wanted, admitted) in gates.items():
            if admitted < wanted:
                telemetry.emit("concurrency.throttled", {"wanted": wanted, "admitted": admitted},
                               {"key": key, "queue": queue})
        for key, (wanted, granted) in rates.items():
            if granted < wanted:
                telemetry.emit("rate_limit.throttled", {"wanted": wanted, "granted": granted},
                               {"key": key, "queue": queue})

    # --- the rest of the interface ------------------------------------------------
    def slot_for(self, id_: int, key: str | None, shard: int | None, worker: str | None = None):
        """The slot a row holds, from its id, concurrency_key, concurrency_shard and claimant
        (`locked_by` as the row was taken out of executing); None: none."""
        return None

    def credit(self, slots) -> None:
        """Give gate slots back (after a committed outcome, a cancel, a reap or a release)."""
        return None

    def credit_or_log(self, slots) -> None:
        """`credit`, for a call outside any transaction whose caller must go on (the flush
        after its COMMIT, the pick after its claim): a failure is logged, not raised, since
        an uncredited slot comes back when its lease lapses."""
        if not slots:
            return
        try:
            self.credit(slots)
        except Exception:
            logger.exception("limiter credit failed; the slots come back when their leases lapse")

    def renew(self, slots) -> None:
        """Keep held slots alive (each heartbeat); only lease-native backends need it."""
        return None

    def reconcile(self) -> dict:
        """Heal counters from the executing rows and sweep idle buckets (each GC sweep)."""
        return {"buckets": 0, "gates": 0}

    def sync_config(self) -> None:
        """Record the configured limits where operators can see them (worker start-up)."""
        return None


class NullLimiter(Limiter):
    """Admits everything and holds no slots (the interface's identity element)."""

    name = "null"

    def admit(self, jobs, queue: str) -> Admission:
        return Admission(admitted={j.id: None for j in jobs})

    def needs_admission(self, job) -> bool:
        return False
