"""Internal: claim, release, heartbeat and start-up reclaim of rows (SPEC §4.2, §4.9)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import IntegrityError

from .. import db, sql, telemetry
from ..codec import loads
from ..machine import ChildRow, Signal

logger = logging.getLogger("gen_durable.pick")

CLAIM_ATTEMPTS = 3  # a K=1 arbiter race retries the claim (behaviours PICK-09)


@dataclass
class Claimed:
    """One claimed row, enriched with its inbox and children as of the pick."""

    id: int
    fsm: str
    fsm_version: int
    step: str
    state: object
    attempt: int
    awaits: list | None
    queue: str
    priority: int
    eligible_at: float  # epoch seconds (orders the batch)
    concurrency_key: str | None
    concurrency_shard: int | None
    rate_limit: str | None
    weight: float
    correlation_key: str | None
    parent_id: int | None
    worker: str
    inbox: list = field(default_factory=list)
    children: list = field(default_factory=list)
    slot: object = None
    raw_state: str | None = None  # the state as committed (JSON text): an inline continuation
    #                               that keeps the state starts from it, not from a mutated ctx.state


def pick(queue: str, limit: int, worker: str, ttl: float, *, gates=(), using=None) -> list[Claimed]:
    """Claim up to `limit` runnable rows of `queue` for `worker`, leased for `ttl` seconds.

    Statements: 1 when nothing is claimed, 3 otherwise (claim, inboxes, children) —
    SPEC §4.2, §8. A unique violation on the K=1 arbiter (another process claimed the
    same key) aborts the claim; it is retried up to 3 times, each retry emitting
    `concurrency.contended`, and then gives up with an empty batch.
    """
    params = {"queue": queue, "limit": limit, "worker": worker, "ttl": float(ttl), "gates": db.pg_array(gates)}
    rows = None
    for attempt in range(CLAIM_ATTEMPTS):
        try:
            rows = db.fetchall(sql.PICK, params, using)
            break
        except IntegrityError as exc:
            if "gen_durable_concurrency_active" not in str(exc):
                raise
            if attempt + 1 < CLAIM_ATTEMPTS:
                telemetry.emit("concurrency.contended", {"count": 1}, {"queue": queue})
    if not rows:
        return []
    jobs = [Claimed(*r, worker=worker) for r in rows]
    for j in jobs:
        j.raw_state, j.state = j.state, loads(j.state)
    jobs.sort(key=lambda j: (j.priority, j.eligible_at, j.id))
    try:
        enrich(jobs, using)
    except BaseException:
        # Never leave a claimed batch executing until the reaper (behaviours PICK-14).
        try:
            release([j.id for j in jobs], worker, using)
        except Exception:
            logger.exception("could not release a claimed batch after a failed enrichment")
        raise
    return jobs


def enrich(jobs: list[Claimed], using=None) -> None:
    """Attach inboxes and children to a claimed batch: two statements for any batch size."""
    ids = [j.id for j in jobs]
    by_id = {j.id: j for j in jobs}
    for target_id, sid, name, payload, at in db.fetchall(sql.LOAD_SIGNALS, {"ids": db.pg_array(ids)}, using):
        by_id[target_id].inbox.append(Signal(sid, name, loads(payload), at))
    for parent_id, cid, fsm, status, state, result, last_error in db.fetchall(sql.LOAD_CHILDREN, {"ids": db.pg_array(ids)}, using):
        by_id[parent_id].children.append(ChildRow(cid, fsm, status, loads(state), loads(result), last_error))


def release(ids, worker: str, using=None) -> list[int]:
    """Return claimed, unstarted rows to runnable (no attempt bump). Statements: 1."""
    if not ids:
        return []
    return [r[0] for r in db.fetchall(sql.RELEASE, {"ids": db.pg_array(ids), "worker": worker}, using)]


def heartbeat(ids, worker: str, ttl: float, using=None) -> list[int]:
    """Extend the lease of `ids` held by `worker` to now() + ttl. Statements: 1."""
    if not ids:
        return []
    return [r[0] for r in db.fetchall(sql.HEARTBEAT, {"ids": db.pg_array(ids), "worker": worker, "ttl": float(ttl)}, using)]


def reclaim(queue: str, prefix: str, margin: float, using=None) -> list[int]:
    """Release claims of `queue` under `prefix` whose lease decayed below `margin` seconds."""
    rows = db.fetchall(sql.RECLAIM, {"queue": queue, "prefix": prefix, "margin": float(margin)}, using)
    return [r[0] for r in rows]
