"""Internal: claim, release, heartbeat and start-up reclaim of rows (docs/design.md#pick, docs/design.md#leases)."""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from django.db import IntegrityError, transaction

from .. import db, registry, sql, telemetry
from ..codec import loads
from ..conf import database_alias
from ..exceptions import UnknownMachine
from ..machine import ChildRow, Signal

logger = logging.getLogger("gen_durable.pick")

CLAIM_ATTEMPTS = 3  # a K=1 arbiter race retries the claim


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
    claim: int  # the row's claim counter as this pick set it: the flush guard's token
    worker: str
    inbox: list = field(default_factory=list)
    children: list = field(default_factory=list)
    slot: object = None
    raw_state: str | None = None  # the state as committed (JSON text): an inline continuation
    #                               that keeps the state starts from it, not from a mutated ctx.state
    prefetched: bool = False  # claimed beyond the free slots: re-checked before it starts
    database: str | None = None  # the alias it was claimed from: its children must live there too
    checked: float | None = None  # monotonic time of the last re-check that found it still ours
    rechecked: bool = False  # its freshness came from a batch re-check (counted when it starts)
    pending: object = None  # threading.Event of a re-check in flight that covers it (`Scheduler._owned`)
    lost: bool = False  # a re-check found it cancelled or reaped: it must not start
    session: int = 0  # the claiming connection's session number (`Scheduler`): a claim made on
    #                   an earlier session may have been lost with a server crash


def pick(queue: str, limit: int, worker: str, ttl: float, *, gates=(), using=None, limiter=None,
         window: int | None = None, stats: dict | None = None, held: dict | None = None) -> list[Claimed]:
    """Claim up to `limit` runnable rows of `queue` for `worker`, leased for `ttl` seconds.

    Statements: 1 when nothing is claimed, else 1 to 3: the claim, then the inboxes and
    the children of the rows whose code can see them (`enrich`) —
    docs/design.md#pick, docs/design.md#performance-contract. A unique violation on the K=1 arbiter (another process claimed the
    same key) aborts the claim; it is retried up to 3 times, each retry emitting
    `concurrency.contended`, and then gives up with an empty batch.

    limiter: admits the claimed rows that carry a configured gate or a rate limit
        (`gates` must be its gate_names()); adds the limiter's constant cost, plus one
        statement (defer) when it denies rows: they go back to runnable with eligible_at
        at the instant they can next be admitted, so they leave the head of the queue.
    window: claim up to this many rows (> limit) to move a throttled head out of the way
        in one pick; rows beyond `limit` that are not admitted limited rows go back with
        their eligible_at (in the same defer statement). stats: filled with {"denied": n, "claimed": n}.
    held: {id: claim} of claims `worker` still holds that a server crash may have undone
        (made on a connection that has since been lost). A claim commits without waiting
        for the WAL flush, so after a crash such a row is runnable again with its older
        counter; claiming it again would hand out the same counter twice, and the
        earlier run's late outcome would pass the flush guard. Claimed again, it gets a
        counter above the held one (docs/design.md#leases, "Claims across a crash").
    """
    scan = max(limit, window or 0)
    params = {"queue": queue, "limit": scan, "worker": worker, "ttl": float(ttl), "gates": db.pg_array(gates),
              "held_ids": None, "held_claims": None}
    if held:
        params["held_ids"], params["held_claims"] = db.pg_array(list(held)), db.pg_array(list(held.values()))
    rows = None
    for attempt in range(CLAIM_ATTEMPTS):
        try:
            rows = db.fetchall(sql.PICK, params, using)
            break
        except IntegrityError as exc:
            if "gen_durable_correlation" in str(exc):
                # A racing claim took the other row of a key reserved only while
                # executing; the retry's probe sees it and leaves this row waiting.
                continue
            if "gen_durable_concurrency_active" not in str(exc):
                raise
            if attempt + 1 < CLAIM_ATTEMPTS:
                telemetry.emit("concurrency.contended", {"count": 1}, {"queue": queue})
    if not rows:
        return []
    alias = database_alias(using)
    jobs = [Claimed(*r, worker=worker, database=alias) for r in rows]
    for j in jobs:
        j.raw_state, j.state = j.state, loads(j.state)
    jobs.sort(key=lambda j: (j.priority, j.eligible_at, j.id))
    claimed = jobs
    try:
        # A row of a machine, version or step this process does not know (a rolling
        # deploy: the other release defines it) goes back untouched before the limiter
        # or the loads see it: no attempt, no error, no tokens (docs/guide.md, "Deploying").
        if not all(registry.knows(j.fsm, j.fsm_version, j.step) for j in jobs):
            foreign = [j for j in jobs if not registry.knows(j.fsm, j.fsm_version, j.step)]
            jobs = [j for j in jobs if registry.knows(j.fsm, j.fsm_version, j.step)]
            claimed = jobs
            left = hand_back_all(foreign, worker, using)
            if stats is not None:
                stats["unknown"] = len(foreign)
                stats["unhanded"] = left  # still ours: the scheduler retries and heartbeats them
            elif left:
                logger.warning("%d row(s) of a machine this worker does not know could not be handed back "
                               "(locked by another session): their lease returns them", len(left))
            if not jobs:
                return []
        if limiter is not None:
            jobs = admit_claimed(jobs, queue, worker, limiter, limit, stats, using)
        elif len(jobs) > limit:
            release(jobs[limit:], worker, using)
            jobs = jobs[:limit]
        if jobs:
            enrich(jobs, using)
    except BaseException:
        # Never leave a claimed batch executing until the reaper.
        try:
            release_jobs(claimed, worker, limiter, using)
        except Exception:
            logger.exception("could not release a claimed batch after a failed admission or enrichment")
        raise
    return jobs


def admit_claimed(jobs, queue, worker, limiter, limit, stats=None, using=None) -> list[Claimed]:
    """Admit the limited rows of a claimed batch; requeue the denied, keep at most `limit`.

    Admitted limited rows are always kept (their tokens or slots are spent); rows beyond
    `limit` otherwise are released with their eligible_at unchanged.
    """
    limited = [j for j in jobs if limiter.needs_admission(j)]
    denied: dict = {}
    if limited:
        try:
            adm = limiter.admit(limited, queue)
        except Exception as exc:
            if limiter.transactional:
                raise  # the Postgres limiter fails with the database: the pick fails as a whole
            # An out-of-band limiter (Redis) that cannot be reached must not stop the rows
            # that need no admission: only the limited rows wait, and try again later.
            _limiter_unavailable(limiter, queue, len(limited), exc)
            adm = None
            denied = {j.id: LIMITER_RETRY for j in limited}
        if adm is not None:
            for j in limited:
                if j.id in adm.admitted:
                    j.slot = adm.admitted[j.id]
            denied = {i: adm.retry_in.get(i, 0.0) for i in adm.denied}
    keep, extra = [], []
    admitted_limited = {j.id for j in limited if j.id not in denied}
    for j in jobs:
        if j.id in denied:
            continue
        (keep if len(keep) < limit or j.id in admitted_limited else extra).append(j)
    back = {**denied, **{j.id: None for j in extra}}  # extras keep their place in the queue
    if back:
        ids = sorted(back)
        defer(ids, [back[i] for i in ids], worker, using)
    if stats is not None:
        stats["denied"] = len(denied)
        stats["claimed"] = len(jobs)
    return keep


LIMITER_RETRY = 1.0           # seconds: rows the limiter could not admit (unreachable) wait this long
LIMITER_LOG_INTERVAL = 60.0   # seconds between log lines while the limiter stays unreachable
_limiter_logged: dict = {}


def _limiter_unavailable(limiter, queue, count, exc):
    telemetry.emit("limiter.unavailable", {"count": count}, {"queue": queue, "backend": limiter.name})
    now = time.monotonic()
    if now - _limiter_logged.get(queue, -LIMITER_LOG_INTERVAL) >= LIMITER_LOG_INTERVAL:
        _limiter_logged[queue] = now
        logger.warning("queue %s: the %s limiter is unreachable (%s); %d rows with limits wait (retried every "
                       "%gs), rows without limits run", queue, limiter.name, exc, count, LIMITER_RETRY)


def defer(ids, delays, worker: str, using=None) -> list[int]:
    """Requeue claimed rows with eligible_at = now() + delay (seconds, per row; None keeps it). Statements: 1."""
    if not ids:
        return []
    return [r[0] for r in db.fetchall(sql.DEFER, {"ids": db.pg_array(ids),
                                                   "delay": db.pg_array([None if d is None else float(d) for d in delays]),
                                                   "worker": worker}, using)]


def release_jobs(jobs, worker: str, limiter=None, using=None) -> list[int]:
    """Release claimed rows and credit the gate slots of those released.

    With a transactional limiter (Postgres) both happen in one transaction.
    """
    if not jobs:
        return []
    slots = {j.id: j.slot for j in jobs if j.slot is not None}
    if limiter is None or not slots:
        return release(jobs, worker, using)
    if limiter.transactional:
        with transaction.atomic(using=database_alias(using)):
            released = release(jobs, worker, using)
            limiter.credit([slots[i] for i in released if i in slots])
        return released
    released = release(jobs, worker, using)
    limiter.credit([slots[i] for i in released if i in slots])
    return released


def enrich(jobs: list[Claimed], using=None) -> None:
    """Attach inboxes and children to a claimed batch: at most two statements for any
    batch size, and none for the rows whose code sees neither (`Machine._gd_inputs`: a
    Job whose perform takes no ctx, a Django task) — they get empty lists."""
    reads: dict = {}
    inbox_ids, parent_ids = [], []
    for job in jobs:
        kinds = reads.get((job.fsm, job.fsm_version))
        if kinds is None:
            try:
                kinds = registry.get(job.fsm, job.fsm_version)._gd_inputs
            except UnknownMachine:  # not reached (pick hands these back); load everything
                kinds = ("inbox", "children")
            reads[(job.fsm, job.fsm_version)] = kinds
        if "inbox" in kinds:
            inbox_ids.append(job.id)
        if "children" in kinds:
            parent_ids.append(job.id)
    inputs = load_inputs(inbox_ids, parent_ids, using)
    for job in jobs:
        job.inbox, job.children = inputs.get(job.id) or ([], [])


def load_inputs(inbox_ids, parent_ids, using=None) -> dict:
    """id -> (inbox signals, children rows) of the ids that have any (an id that is
    absent has neither): the inboxes of `inbox_ids` and the children of `parent_ids`,
    one statement for each list that is not empty. Most rows of a batch have neither,
    so no pair of empty lists is built for them."""
    out: dict = {}
    if inbox_ids:
        param = {"ids": db.pg_array(inbox_ids)}
        for target_id, sid, name, payload, at in db.fetchall(sql.LOAD_SIGNALS, param, using):
            out.setdefault(target_id, ([], []))[0].append(Signal(sid, name, loads(payload), at))
    if parent_ids:
        for parent_id, kids in load_children(parent_ids, using).items():
            out.setdefault(parent_id, ([], []))[1].extend(kids)
    return out


def load_children(ids, using=None) -> dict:
    """parent id -> its children rows, in id order, for the `ids` that have any: one statement."""
    out: dict = {}
    for parent_id, cid, fsm, status, state, result, last_error in db.fetchall(
            sql.LOAD_CHILDREN, {"ids": db.pg_array(ids)}, using):
        out.setdefault(parent_id, []).append(ChildRow(cid, fsm, status, loads(state), loads(result), last_error))
    return out


# release.sql waiting for row locks instead of skipping them (shutdown's last pass).
RELEASE_WAITING = sql.RELEASE.replace("FOR NO KEY UPDATE OF g SKIP LOCKED", "FOR NO KEY UPDATE OF g")
assert RELEASE_WAITING != sql.RELEASE


def release(jobs, worker: str, using=None, wait: float | None = None) -> list[int]:
    """Return claimed, unstarted rows (`jobs`: claims, with their id and claim counter)
    to runnable, no attempt bump; a row claimed again since stays with its newer claim.
    Returns the ids released. Statements: 1 (3 with `wait`).

    wait: None skips rows another session holds locked (SKIP LOCKED: the caller tries
    again); seconds waits up to that long for them (lock_timeout), in id order — at
    shutdown, for a row a `gd.signal` inside a long transaction holds, which would else
    stay leased and come back with an attempt spent. A lock held past it releases
    nothing of this batch (returns [])."""
    if not jobs:
        return []
    params = {"ids": db.pg_array([j.id for j in jobs]), "claims": db.pg_array([j.claim for j in jobs]),
              "worker": worker}
    if wait is None:
        return [r[0] for r in db.fetchall(sql.RELEASE, params, using)]
    from django.db import OperationalError

    try:
        with transaction.atomic(using=database_alias(using)):
            db.fetchone("SELECT set_config('lock_timeout', %s, true)", [f"{max(int(wait * 1000), 1)}ms"], using)
            return [r[0] for r in db.fetchall(RELEASE_WAITING, params, using)]
    except OperationalError as exc:
        if db._sqlstate(exc) != "55P03":  # lock_not_available: held past `wait`
            raise
        return []


_unknown_logged: set = set()


def hand_back(jobs, worker: str, using=None) -> list[int]:
    """Hand back claimed rows this process cannot run (hand_back.sql): runnable, attempt
    and last_error untouched, marked `unknown_since` for a worker that knows them. Logs
    once per (machine, version) per process. Statements: 1."""
    jobs = sorted(jobs, key=lambda j: j.id)
    ids = [r[0] for r in db.fetchall(sql.HAND_BACK, {"ids": db.pg_array([j.id for j in jobs]),
                                                      "claims": db.pg_array([j.claim for j in jobs]),
                                                      "worker": worker}, using)]
    for j in jobs:
        what = (j.fsm, j.fsm_version)
        if what not in _unknown_logged:
            _unknown_logged.add(what)
            logger.warning("%s v%s (step %r, e.g. id %s): this worker does not know %s; its rows are handed "
                           "back untouched (no attempt, no error) and wait for a worker that knows it "
                           "(a rolling deploy? docs/guide.md, \"Deploying\")", j.fsm, j.fsm_version, j.step,
                           j.id, unknown_what(j.fsm, j.fsm_version, j.step))
    telemetry.emit("pick.unknown", {"count": len(ids)}, {"queue": jobs[0].queue if jobs else None})
    return ids


HAND_BACK_ATTEMPTS = 3  # passes over rows locked for a moment (a gd.signal's statement)


def hand_back_all(jobs, worker: str, using=None, attempts: int = HAND_BACK_ATTEMPTS) -> list:
    """`hand_back` `jobs`, again for those it skipped (hand_back.sql passes over a row
    another session holds locked, and one whose key a runnable row holds), up to
    `attempts` passes 20 ms apart. Returns the claims still held: left executing under
    this worker's lease, they must be heartbeated and handed back later (else the
    reaper would return them with an attempt spent on a step nobody ran)."""
    left = list(jobs)
    for n in range(attempts):
        if n:
            time.sleep(0.02)
        back = set(hand_back(left, worker, using))
        left = [j for j in left if j.id not in back]
        if not left:
            break
    return left


def unknown_what(fsm: str, version: int, step: str) -> str:
    """What of (fsm, version, step) this process lacks, in words."""
    versions = sorted(v for (n, v) in registry.all_machines() if n == fsm)
    if not versions:
        return ("that machine (a worker imports the durable.py, and tasks.py for a Django task, of the apps in "
                "INSTALLED_APPS: is the app missing, is the class in a module no durable.py imports, "
                "or is this an older release?)")
    if version not in versions:
        return f"that version (it has {', '.join(f'v{v}' for v in versions)})"
    return f"that step (steps: {', '.join(sorted(registry.step_names(registry.get(fsm, version))))})"


def adopt_known(queue: str, limit: int, using=None) -> list[int]:
    """Make rows of `queue` that another worker handed back, and that this process knows,
    eligible again (adopt_known.sql); return their ids. Statements: 1."""
    fsms, versions, steps = registry.known_steps()
    if not fsms:
        return []
    return [r[0] for r in db.fetchall(sql.ADOPT_KNOWN, {"queue": queue, "fsms": db.pg_array(fsms),
                                                         "versions": db.pg_array(versions),
                                                         "steps": db.pg_array(steps), "limit": int(limit)}, using)]


def still_owned(jobs, worker: str, using=None) -> set[int]:
    """The ids of `jobs` (claims) still held by `worker` under the same claim: not
    cancelled, reaped, or claimed again since. Statements: 1."""
    if not jobs:
        return set()
    params = {"ids": db.pg_array([j.id for j in jobs]), "claims": db.pg_array([j.claim for j in jobs]),
              "worker": worker}
    return {r[0] for r in db.fetchall(sql.STILL_OWNED, params, using)}


def heartbeat(ids, worker: str, ttl: float, using=None) -> list[int]:
    """Extend the lease of `ids` held by `worker` to now() + ttl. Statements: 1."""
    if not ids:
        return []
    return [r[0] for r in db.fetchall(sql.HEARTBEAT, {"ids": db.pg_array(ids), "worker": worker, "ttl": float(ttl)}, using)]


def reclaim(queue: str, prefix: str, margin: float, using=None, limiter=None) -> list[int]:
    """Hand back claims of `queue` under `prefix` whose lease decayed below `margin`
    seconds (runnable, attempt + 1); credit their gate slots. Returns the ids."""
    from ..conf import history_enabled

    params = {"queue": queue, "prefix": prefix, "margin": float(margin),
              "history": history_enabled()}  # a handed-back attempt's timeline entry
    transactional = limiter is not None and limiter.transactional
    with transaction.atomic(using=database_alias(using)) if transactional else nullcontext():
        rows = db.fetchall(sql.RECLAIM, params, using)
        if limiter is not None:
            limiter.credit([limiter.slot_for(r[0], r[1], r[2], r[3]) for r in rows])
    return [r[0] for r in rows]


def abandon(ids, worker: str, drain: float, using=None, limiter=None) -> list[int]:
    """Hand back rows `worker` still runs at shutdown: runnable now, attempt + 1.

    Their gate slots are credited (in the same transaction with a transactional
    limiter). Statements: 1 (+ the credit). Returns the ids handed back.
    """
    if not ids:
        return []
    from ..conf import history_enabled

    params = {"ids": db.pg_array(ids), "worker": worker, "drain": float(drain),
              "history": history_enabled()}  # a cut-off attempt's timeline entry
    transactional = limiter is not None and limiter.transactional
    with transaction.atomic(using=database_alias(using)) if transactional else nullcontext():
        rows = db.fetchall(sql.ABANDON, params, using)
        if limiter is not None:
            limiter.credit([limiter.slot_for(r[0], r[2], r[3], worker) for r in rows])
    return [r[0] for r in rows]

