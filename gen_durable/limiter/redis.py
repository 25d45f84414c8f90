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
Configuration (limits, burst, rates) comes from the worker's settings with each call.
`shards` does not apply: one script call is atomic on a single Redis node.
"""

from __future__ import annotations

import itertools

import redis as redis_py  # the `redis` extra

from .base import Decision, Limiter

ADMIT = r"""
local ng, nr, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local p = 4
local free = {}
for i = 1, ng do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  free[i] = tonumber(ARGV[p]) - redis.call('ZCARD', KEYS[i])
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
for e = 1, n do
  local id, g, r, w = ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])
  p = p + 4
  local gok = (g == 0) or (free[g] >= 1)
  local rok = (r == 0) or ((not blocked[r]) and tokens[r] >= w - 1e-9)
  if gok and rok then
    if g > 0 then
      free[g] = free[g] - 1
      redis.call('ZADD', KEYS[g], now + lease, id)
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

RENEW = r"""
local lease = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local renewed = 0
for i = 1, #KEYS do
  renewed = renewed + redis.call('ZADD', KEYS[i], 'XX', 'GT', 'CH', now + lease, ARGV[i + 1])
  if redis.call('PTTL', KEYS[i]) < lease + 1000 and redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], lease + 1000)
  end
end
return renewed
"""


class RedisLimiter(Limiter):
    name = "redis"
    transactional = False

    def __init__(self, url: str, prefix: str = "gen_durable:", lease_ttl: float = 60.0, limits=None,
                 client=None):
        super().__init__(limits)
        self.client = client if client is not None else redis_py.Redis.from_url(url)
        self.prefix = prefix
        self.lease_ms = int(lease_ttl * 1000)
        self._admit = self.client.register_script(ADMIT)
        self._renew = self.client.register_script(RENEW)
        self._credit = self.client.register_script(CREDIT)
        self._seq = itertools.count(1)  # admissions of this process: members never repeat

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
        args = [len(gates), len(rates), self.lease_ms]
        args += [gate_cfg[k].limit for k in gates]
        for k in rates:
            args += [repr(float(rate_cfg[k].burst)), repr(float(rate_cfg[k].rate))]
        args.append(len(entries))
        members = {e.job.id: f"{e.job.id}@{e.job.worker}#{next(self._seq)}" for e in entries}
        for e in entries:
            args += [members[e.job.id], gi.get(e.gate_key, 0) if e.gate else 0,
                     ri.get(e.rate_key, 0) if e.rate else 0, repr(float(e.weight))]
        out = self._admit(keys=[self.gate_key(k) for k in gates] + [self.rate_key(k) for k in rates], args=args)
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
            self._renew(keys=[self.gate_key(k) for k, _ in slots], args=[self.lease_ms] + [i for _, i in slots])

    def reconcile(self) -> dict:
        """Nothing to heal: a dead worker's slots expire with their lease, idle buckets with their TTL."""
        return {"buckets": 0, "gates": 0}
