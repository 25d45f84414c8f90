"""The Postgres limiter: counters are rows of gen_durable_buckets (the default backend).

Admission of a claimed batch is one short transaction of two statements whatever the
batch size: limiter_lock (lock the needed shards, SKIP LOCKED) and limiter_debit
(debit, mint cold shards already debited, stamp the drawn shard on admitted rows). The
decision itself is made here, in Python, from the locked counters.

Gate slots are credited inside the transaction that takes the row out of executing,
so the reconciler (GC) can recompute every counter from the executing rows.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict

from django.db import IntegrityError, transaction

from .. import db, sql, telemetry
from ..conf import database_alias
from .base import EPSILON, Decision, Limiter
from .config import name_of

logger = logging.getLogger("gen_durable.limiter")

ADMIT_ATTEMPTS = 3  # a racing cold mint or an overdraft fenced by the CHECK retries the admission


class _RowsLost(Exception):
    """Rolls an admission back: some admitted gated rows are no longer executing."""


class PostgresLimiter(Limiter):
    name = "postgres"
    transactional = True

    def __init__(self, using=None, limits=None):
        super().__init__(limits)
        self.using = using

    # --- admission ---------------------------------------------------------------
    def _decide(self, entries, queue):
        wanted = sorted({("conc", e.gate_key) for e in entries if e.gate is not None}
                        | {("rate", e.rate_key) for e in entries if e.rate is not None})
        params = {"kind": db.pg_array([k for k, _ in wanted]), "key": db.pg_array([k for _, k in wanted])}
        worker = entries[0].job.worker
        lost: set = set()  # gated rows that left executing since their claim: never admitted
        for attempt in range(ADMIT_ATTEMPTS):
            live = [e for e in entries if e.job.id not in lost]
            if not live:
                return Decision(admitted={})
            try:
                with transaction.atomic(using=database_alias(self.using)):
                    rows = db.fetchall(sql.LIMITER_LOCK, params, self.using)
                    decision, writes = self._plan(live, rows, worker)
                    if writes is not None:
                        stamped = set(db.fetchone(sql.LIMITER_DEBIT, writes, self.using)[4])
                        gone = {i for i, s in decision.admitted.items() if s is not None} - stamped
                        if gone:
                            # Cancelled or reaped after the claim: their slots would be
                            # debited with nothing to credit them. Undo, admit without them.
                            lost |= gone
                            raise _RowsLost
                return decision
            except _RowsLost:
                continue
            except IntegrityError as exc:
                text = str(exc)
                if "gen_durable_buckets_kind_key_shard" in text:
                    event = "rate_limit.contended"
                elif "gen_durable_buckets_available" in text:
                    event = "concurrency.contended"
                else:
                    raise
                if attempt + 1 < ADMIT_ATTEMPTS:
                    telemetry.emit(event, {"count": 1}, {"queue": queue})
        logger.info("queue %s: admission contended %d times; the batch is re-offered", queue, ADMIT_ATTEMPTS)
        return Decision(admitted={}, tokens_left={}, rate_denied={e.job.id for e in entries})

    def _plan(self, entries, rows, worker):
        """Decide from the locked counters; return (Decision, limiter_debit params or None)."""
        seen: dict = defaultdict(dict)  # (kind, key) -> shard -> available now (0 when held elsewhere)
        for kind, key, shard, capacity, available, elapsed in rows:
            if available is None:
                seen[(kind, key)].setdefault(shard, 0.0)
                continue
            if kind == "rate":
                rate = self.limits.rate_for(key)
                if rate is not None:
                    available = min(rate.shard_capacity, available + elapsed * rate.shard_rate)
            # A row can come back twice from a locked join under contention: keep the minimum.
            prev = seen[(kind, key)].get(shard)
            seen[(kind, key)][shard] = available if prev is None else min(prev, available)
        shards: dict = {}  # (kind, key) -> [shard, available, cold]
        for e in entries:
            if e.gate is not None and ("conc", e.gate_key) not in shards:
                have = seen.get(("conc", e.gate_key), {})
                shards[("conc", e.gate_key)] = [
                    [s, float(have[s]) if s in have else float(e.gate.shard_capacity(s)), s not in have]
                    for s in range(e.gate.shards)]
            if e.rate is not None and ("rate", e.rate_key) not in shards:
                have = seen.get(("rate", e.rate_key), {})
                shards[("rate", e.rate_key)] = [
                    [s, float(have[s]) if s in have else e.rate.shard_capacity, s not in have]
                    for s in range(e.rate.shards)]
        free = {k: sum(a for _, a, _ in v) for k, v in shards.items()}
        admitted, blocked, rate_denied = [], set(), set()
        for e in entries:
            g_ok = e.gate is None or free[("conc", e.gate_key)] >= 1 - EPSILON
            r_ok = e.rate is None or (e.rate_key not in blocked and free[("rate", e.rate_key)] >= e.weight - EPSILON)
            if g_ok and r_ok:
                admitted.append(e)
                if e.gate is not None:
                    free[("conc", e.gate_key)] -= 1
                if e.rate is not None:
                    free[("rate", e.rate_key)] -= e.weight
            elif e.rate is not None and not r_ok:
                blocked.add(e.rate_key)  # a strict prefix: a fat head is not overtaken on its key
                rate_denied.add(e.job.id)
        slots, taken = {}, Counter()
        for (kind, key), lst in shards.items():
            order = sorted(lst, key=lambda x: (-x[1], x[0]))
            if kind == "conc":
                rows_ = [e for e in admitted if e.gate_key == key]
                i = 0
                for s, avail, _ in order:
                    n = min(int(avail + EPSILON), len(rows_) - i)
                    for e in rows_[i:i + n]:
                        slots[e.job.id] = (key, s)
                    taken[(kind, key, s)] += n
                    i += n
            else:
                need = sum(e.weight for e in admitted if e.rate_key == key)
                for s, avail, _ in order:
                    t = min(avail, need)
                    if t > 0:
                        taken[(kind, key, s)] += t
                        need -= t
        decision = Decision(admitted={e.job.id: slots.get(e.job.id) for e in admitted},
                            tokens_left={k: max(v, 0.0) for (kind, k), v in free.items() if kind == "rate"},
                            rate_denied=rate_denied)
        cold = {(kind, key, s) for (kind, key), lst in shards.items() for s, _, c in lst if c}
        writes = [(kind, key, s, t) for (kind, key, s), t in sorted(taken.items()) if t > 0]
        if not writes:
            return decision, None
        cols = defaultdict(list)
        for kind, key, s, t in writes:
            if kind == "conc":
                gate = self.limits.gate_for(key)
                cap, rate = float(gate.shard_capacity(s)), 0.0
            else:
                r = self.limits.rate_for(key)
                cap, rate = r.shard_capacity, r.shard_rate
            for col, v in (("kind", kind), ("key", key), ("shard", s), ("capacity", cap), ("rate", rate),
                           ("taken", float(t)), ("mint", (kind, key, s) in cold)):
                cols[col].append(v)
        stamped = sorted((i, s[1]) for i, s in decision.admitted.items() if s is not None)
        params = {c: db.pg_array(v) for c, v in cols.items()}
        params.update(ids=db.pg_array([i for i, _ in stamped]), shards=db.pg_array([s for _, s in stamped]),
                      worker=worker)
        return decision, params

    # --- slots ---------------------------------------------------------------------
    def slot_for(self, id_, key, shard, worker=None):
        if key is None or shard is None or shard < 0:
            return None
        return (self.limits.gate_bucket(key), shard)

    def credit(self, slots) -> None:
        """Give slots back: one statement. Call it inside the transaction that ends the rows' steps."""
        counts = Counter(s for s in slots if s is not None)
        if not counts:
            return
        keys = sorted(counts)
        db.fetchall(sql.LIMITER_CREDIT, {"key": db.pg_array([k for k, _ in keys]),
                                         "shard": db.pg_array([s for _, s in keys]),
                                         "n": db.pg_array([counts[k] for k in keys])}, self.using)

    # --- maintenance -------------------------------------------------------------
    def reconcile(self) -> dict:
        """Sweep idle rate buckets; heal gate counters from the executing rows.

        Statements: 1 (rate sweep) + a transaction of 2–3 (lock, count, heal).
        Returns {"buckets": rate buckets deleted, "gates": gate shards healed or deleted}.
        """
        limits = self.limits
        names = sorted(limits.rates)
        swept = db.fetchall(sql.SWEEP_RATE_BUCKETS, {
            "name": db.pg_array(names), "rate": db.pg_array([limits.rates[n].shard_rate for n in names])}, self.using)
        gates = 0
        with transaction.atomic(using=database_alias(self.using)):
            locked = db.fetchall(sql.RECONCILE_LOCK, None, self.using)
            if locked:
                names = sorted({name_of(r[1]) for r in locked})
                running = Counter()
                for k, s, n in db.fetchall(sql.RECONCILE_COUNT, {"names": db.pg_array(names)}, self.using):
                    running[(limits.gate_bucket(k), s)] += n
                ids, caps, avails, drop = [], [], [], []
                for id_, key, shard, capacity, available in locked:
                    gate = limits.gate_for(key)
                    n = running.get((key, shard), 0)
                    if gate is not None and shard < gate.shards:
                        capacity = float(gate.shard_capacity(shard))
                    healed = max(0.0, capacity - n)
                    # Nothing runs on it and it is full (or no longer configured): a missing
                    # shard is admitted as full, so the row can go.
                    if n == 0 and (healed == capacity or gate is None or shard >= gate.shards):
                        drop.append(id_)
                    else:
                        ids.append(id_)
                        caps.append(capacity)
                        avails.append(healed)
                row = db.fetchone(sql.RECONCILE_HEAL, {
                    "id": db.pg_array(ids), "capacity": db.pg_array(caps), "available": db.pg_array(avails),
                    "drop": db.pg_array(sorted(drop))}, self.using)
                gates = row[0] + row[1]
        return {"buckets": len(swept), "gates": gates}

    def sync_config(self) -> None:
        limits = self.limits
        rows = sorted([("rate", r.name, r.rate, r.burst, r.shards) for r in limits.rates.values()]
                      + [("conc", g.name, None, float(g.limit), g.shards) for g in limits.gates.values()])
        if not rows:
            return
        cols = list(zip(*rows))
        db.execute(sql.SYNC_LIMITS, {k: db.pg_array(list(v)) for k, v in
                                     zip(("kind", "name", "rate", "capacity", "shards"), cols)}, self.using)
