"""The Redis limiter (`LIMITER={"BACKEND": "redis", "URL": ..., "PREFIX": ...}`, the `redis` extra).

Admission of a batch is one round-trip: a server-side Lua script decides and debits
atomically, with the Redis server's clock. Keys (all under PREFIX):
  <prefix>conc:<key>  a sorted set per gate counter (the gate's name, or the row's key
                      when the gate is per="key"): member = "<row id>@<worker>#<n>" (one
                      per admission), score = lease expiry (ms). Admission first drops
                      expired members, so the slots of a dead worker free themselves after
                      one lease; the heartbeat renews the scores of the slots a worker holds
                      (`renew`), and credit removes the member. The set expires a lease
                      after its last write.
Credits land after the outcome commits, so the row may already be claimed and admitted
again (by another worker, or this one) when the credit arrives: a member names its
admission, never just the row, so a late credit removes only the slot it gives back. A
reap, cancel or reclaim knows the row's claimant, not the admission: its credit removes
every member "<row id>@<claimant>#…" (the claimant's holdings of that row, all ended).
  <prefix>rate:<key>  a hash {tokens, stamp} per rate key; a missing hash is a full
                      bucket. It expires once it would have refilled (burst / rate + 1 s);
                      a zero-rate bucket never refills and never expires.
  <prefix>epoch       a hash {seq, until}, no expiry: seq rises with every admission that
                      takes a slot, until ends a recovery. Missing (with rows holding
                      slots in Postgres) or lower than a worker has seen: Redis lost its
                      data, and no gated row is admitted for one lease while the holders'
                      renewals re-add their slots (docs/reliability.md "Limiter data loss").
Configuration (limits, burst, rates) comes from the worker's settings with each call.
The client has socket/connect timeouts (REDIS_OPTIONS; the URL's query string wins).
`shards` does not apply: one script call is atomic on a single Redis node.
"""

from __future__ import annotations

import itertools
import logging
import time

import redis as redis_py  # the `redis` extra

logger = logging.getLogger("gen_durable.limiter")

# Seconds: a Redis that does not answer within this fails the call (connect or command).
REDIS_OPTIONS = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, "socket_keepalive": True}

from .base import Decision, Limiter

# Every script starts with this: the epoch (a hash {seq, until} under <prefix>epoch, no
# TTL). Missing: Redis lost its data (or is new) — ADMIT asks the caller, who asks
# Postgres whether any row holds a slot (ARGV init '1': yes, '0': no); RENEW's caller
# holds slots, so it is a yes. seq below what this worker has seen: an older copy of the
# data (a restored snapshot, a failed-over replica). Either way, with holders, gated
# admission stops until `until` (one lease): every live holder's heartbeat re-adds its
# slots meanwhile (RENEW upserts while recovering).
EPOCH = r"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ek, seen, init, lease = KEYS[#KEYS], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local e = redis.call('HMGET', ek, 'seq', 'until')
local seq, untl, started = tonumber(e[1]), tonumber(e[2]) or 0, 0
if seq == nil then
  if init == '' then return {'missing'} end
  seq = seen
  if init == '1' then untl, started = now + lease, 1 end
  redis.call('HSET', ek, 'seq', seq, 'until', untl)
elseif seq < seen then
  seq, untl, started = seen, now + lease, 1
  redis.call('HSET', ek, 'seq', seq, 'until', untl)
end
local recovering = untl > now
"""

ADMIT = EPOCH + r"""
local ng, nr = tonumber(ARGV[4]), tonumber(ARGV[5])
local p = 6
local free = {}
for i = 1, ng do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  free[i] = tonumber(ARGV[p]) - redis.call('ZCARD', KEYS[i])
  if recovering then free[i] = 0 end
  p = p + 1
end
local tokens, burst, rate, blocked, used = {}, {}, {}, {}, {}
for j = 1, nr do
  burst[j], rate[j] = tonumber(ARGV[p]), tonumber(ARGV[p + 1])
  p = p + 2
  local h = redis.call('HMGET', KEYS[ng + j], 'tokens', 'stamp')
  if h[1] then
    local elapsed = math.max(0, now - tonumber(h[2])) / 1000
    tokens[j] = math.min(burst[j], tonumber(h[1]) + elapsed * rate[j])
  else
    tokens[j] = burst[j]
  end
  blocked[j] = false
end
local n = tonumber(ARGV[p])
p = p + 1
local out = {}
local added = false
for e = 1, n do
  local id, g, r, w = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])
  p = p + 4
  local gok = (g == 0) or (free[g] >= 1)
  local rok = (r == 0) or ((not blocked[r]) and tokens[r] >= w - 1e-9)
  if gok and rok then
    if g > 0 then
      free[g] = free[g] - 1
      redis.call('ZADD', KEYS[g], now + lease, id)
      added = true
    end
    if r > 0 then
      tokens[r] = math.max(0, tokens[r] - w)
      used[r] = true
    end
    out[e] = 1
  else
    if r > 0 and not rok then blocked[r] = true end
    out[e] = 0
  end
end
for i = 1, ng do
  if redis.call('PTTL', KEYS[i]) < lease + 1000 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], lease + 1000)
  end
end
for j = 1, nr do
  if used[j] then
    redis.call('HSET', KEYS[ng + j], 'tokens', string.format('%.17g', tokens[j]), 'stamp', now)
    if rate[j] > 0 then
      redis.call('PEXPIRE', KEYS[ng + j], math.ceil(burst[j] / rate[j] * 1000) + 1000)
    else
      redis.call('PERSIST', KEYS[ng + j])
    end
  end
  out[n + j] = string.format('%.17g', tokens[j])
end
if added then seq = redis.call('HINCRBY', ek, 'seq', 1) end
out[n + nr + 1] = seq
out[n + nr + 2] = started
out[n + nr + 3] = recovering and (untl - now) or 0
return out
"""

CREDIT = r"""
local removed = 0
for i = 1, #KEYS do
  local m = ARGV[i]
  if string.sub(m, -1) == '#' then
    for _, x in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
      if string.sub(x, 1, #m) == m then removed = removed + redis.call('ZREM', KEYS[i], x) end
    end
  else
    removed = removed + redis.call('ZREM', KEYS[i], m)
  end
end
return removed
"""

RENEW = EPOCH + r"""
local renewed = 0
for i = 1, #KEYS - 1 do
  -- Recovering: re-add a slot the data loss took (a member credited meanwhile comes
  -- back for at most a lease: fewer admissions, never more). Else renew only.
  if recovering then
    renewed = renewed + redis.call('ZADD', KEYS[i], 'GT', 'CH', now + lease, ARGV[i + 3])
  else
    renewed = renewed + redis.call('ZADD', KEYS[i], 'XX', 'GT', 'CH', now + lease, ARGV[i + 3])
  end
  if redis.call('PTTL', KEYS[i]) < lease + 1000 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], lease + 1000)
  end
end
return {renewed, seq, started, recovering and (untl - now) or 0}
"""

# Worker start-up: create the epoch if it is missing (ARGV init as for ADMIT).
SYNC = EPOCH + r"""
return {seq, started, recovering and (untl - now) or 0}
"""


class RedisLimiter(Limiter):
    name = "redis"
    transactional = False

    def __init__(self, url: str, prefix: str = "gen_durable:", lease_ttl: float = 60.0, limits=None,
                 client=None, using=None):
        super().__init__(limits)
        # Bounded like the worker's database connections: a Redis that stopped answering
        # fails the call (the limited rows wait, LIMITER_RETRY) instead of hanging the
        # feeder or the heartbeat. Options in the URL's query string win.
        self.client = client if client is not None else redis_py.Redis.from_url(url, **REDIS_OPTIONS)
        self.prefix = prefix
        self.using = using
        self.lease_ms = int(lease_ttl * 1000)
        self._admit = self.client.register_script(ADMIT)
        self._renew = self.client.register_script(RENEW)
        self._credit = self.client.register_script(CREDIT)
        self._sync = self.client.register_script(SYNC)
        self._seq = itertools.count(1)  # admissions of this process: members never repeat
        self._seen = 0  # the highest epoch seq this process has read (an older copy reads lower)
        self._recovery_logged = 0.0

    @property
    def epoch_key(self) -> str:
        return f"{self.prefix}epoch"

    def _holders(self, ids=()) -> bool:
        """Whether rows other than `ids` execute with a gate slot claimed or held (Postgres)."""
        from .. import db, sql

        return bool(db.fetchone(sql.GATE_HOLDERS, {"ids": db.pg_array(sorted(ids))}, self.using)[0])

    def _epoch(self, seq, started, left_ms):
        self._seen = max(self._seen, int(seq))
        if int(started) or (int(left_ms) > 0 and time.monotonic() - self._recovery_logged >= 10):
            self._recovery_logged = time.monotonic()
            logger.warning("Redis limiter %s: gate slots were lost (Redis lost its data, or an older copy of it "
                           "answers); no gated row is admitted for %.1fs while the running holders' heartbeats "
                           "re-assert their slots", self.prefix, int(left_ms) / 1000)
        return int(left_ms) > 0

    def sync_config(self) -> None:
        """At start-up: create the epoch when it is missing — recovering when rows hold slots."""
        out = self._sync(keys=[self.epoch_key], args=[self._seen, "", self.lease_ms])
        if out and out[0] == b"missing":
            out = self._sync(keys=[self.epoch_key], args=[self._seen, "1" if self._holders() else "0",
                                                           self.lease_ms])
        self._epoch(*out)

    def gate_key(self, key: str) -> str:
        return f"{self.prefix}conc:{key}"

    def rate_key(self, key: str) -> str:
        return f"{self.prefix}rate:{key}"

    def _decide(self, entries, queue):
        gates = sorted({e.gate_key for e in entries if e.gate is not None})
        rates = sorted({e.rate_key for e in entries if e.rate is not None})
        gi = {k: i + 1 for i, k in enumerate(gates)}
        ri = {k: i + 1 for i, k in enumerate(rates)}
        gate_cfg = {e.gate_key: e.gate for e in entries if e.gate is not None}
        rate_cfg = {e.rate_key: e.rate for e in entries if e.rate is not None}
        args = [len(gates), len(rates)]
        args += [gate_cfg[k].limit for k in gates]
        for k in rates:
            args += [repr(float(rate_cfg[k].burst)), repr(float(rate_cfg[k].rate))]
        args.append(len(entries))
        members = {e.job.id: f"{e.job.id}@{e.job.worker}#{next(self._seq)}" for e in entries}
        for e in entries:
            args += [members[e.job.id], gi.get(e.gate_key, 0) if e.gate else 0,
                     ri.get(e.rate_key, 0) if e.rate else 0, repr(float(e.weight))]
        keys = [self.gate_key(k) for k in gates] + [self.rate_key(k) for k in rates] + [self.epoch_key]
        out = self._admit(keys=keys, args=[self._seen, "", self.lease_ms] + args)
        if out and out[0] == b"missing":
            holders = self._holders(e.job.id for e in entries)
            out = self._admit(keys=keys, args=[self._seen, "1" if holders else "0", self.lease_ms] + args)
        self._epoch(*out[-3:])
        out = out[:-3]
        flags, left = out[:len(entries)], out[len(entries):]
        admitted = {e.job.id: ((e.gate_key, members[e.job.id]) if e.gate is not None else None)
                    for e, ok in zip(entries, flags) if int(ok)}
        tokens = {k: float(v) for k, v in zip(rates, left)}
        return Decision(admitted=admitted, tokens_left=tokens)

    def slot_for(self, id_, key, shard, worker=None):
        """Every admission of row `id_` by `worker` (a member prefix; see the module docstring)."""
        if key is None or shard is None:
            return None
        return (self.limits.gate_bucket(key), f"{id_}@{worker}#")

    def credit(self, slots) -> None:
        """Remove the slots' members: one round-trip (a script) for any number."""
        slots = sorted(s for s in slots if s is not None)
        if slots:
            self._credit(keys=[self.gate_key(k) for k, _ in slots], args=[m for _, m in slots])

    def renew(self, slots) -> None:
        """Raise held slots' expiry to now + lease (never lower): one round-trip."""
        slots = [s for s in slots if s is not None]
        if slots:
            # This process holds slots: if the epoch is missing, the loss started a recovery.
            renewed, *epoch = self._renew(keys=[self.gate_key(k) for k, _ in slots] + [self.epoch_key],
                                          args=[self._seen, "1", self.lease_ms] + [i for _, i in slots])
            self._epoch(*epoch)

    def reconcile(self) -> dict:
        """Nothing to heal: a dead worker's slots expire with their lease, idle buckets with their TTL."""
        return {"buckets": 0, "gates": 0}
