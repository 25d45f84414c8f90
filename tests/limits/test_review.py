"""Adversarial review of the configured limits: races and inputs that once leaked a slot
or were accepted and ignored (docs/guide.md, "Limits")."""

import pytest

import gen_durable as gd
from gen_durable.worker import claims
from tests.durable_app.durable import Plain

from .conftest import buckets

pytestmark = pytest.mark.django_db

WORKER = "breaker-worker"


def test_a_row_cancelled_between_its_claim_and_its_admission_takes_no_slot(settings, queue_name):
    """Postgres: the claim commits, then the admission debits in its own transaction. A
    cancel that lands in between takes the row out of executing with no slot to credit
    (shard -1); the admission must not debit a slot the row will never give back — the
    counter would stay short until a GC sweep (never, with --no-gc)."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "CONCURRENCY_LIMITS": {"pdf": {"limit": 2}}}
    from gen_durable.limiter import get_limiter

    limiter = get_limiter()
    a, b = gd.insert_all([gd.Spec(Plain, queue=queue_name, concurrency_key=k) for k in ("pdf:a", "pdf:b")])
    jobs = claims.pick(queue_name, 10, WORKER, 60, gates=limiter.gate_names())  # claimed, not admitted
    assert sorted(j.id for j in jobs) == [a, b]
    gd.cancel(a)  # lands between the claim and the admission
    adm = limiter.admit(sorted(jobs, key=lambda j: j.id), queue_name)
    assert a not in adm.admitted and b in adm.admitted, "a row no longer ours is not admitted"
    assert buckets() == [("pdf", 0, 2.0, 1.0)], "only the row still executing holds a slot"



def test_a_gate_limit_beyond_the_float8_counters_is_a_check_error_not_a_crash_at_admission(configure, queue_name):
    """A limit Postgres counters (float8) cannot hold once passed E007 and raised
    OverflowError out of every pick of the queue."""
    from django.test import override_settings

    from gen_durable import checks

    huge = {"pdf": {"limit": 10**400}}
    with override_settings(GEN_DURABLE={"CONCURRENCY_LIMITS": huge}):
        assert [m.id for m in checks.check_limits()] == ["gen_durable.E007"]
    limiter = configure(gates={"pdf": {"limit": 2**53}})  # the largest accepted: admits
    gd.insert_all([gd.Spec(Plain, queue=queue_name, concurrency_key="pdf:a")])
    assert len(claims.pick(queue_name, 10, WORKER, 60, gates=limiter.gate_names(), limiter=limiter)) == 1


def test_redis_a_credit_after_the_commit_never_frees_the_slot_of_the_rows_next_holder(settings, queue_name):
    """Redis credits after the outcome commits. In between, another worker can pick the
    same row (a Next back into the gate) and admit it: the late credit must remove only
    the finished step's slot, not the new holder's, or the gate admits limit + 1."""
    from gen_durable.limiter.redis import RedisLimiter
    from gen_durable.outcomes import Next
    from gen_durable.worker import executor
    from gen_durable.worker.flusher import flush

    from .conftest import REDIS_URL, collapse, redis_client
    from tests.durable_app.limit_machines import Transitions

    prefix = f"gdtest:{queue_name}:"
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "CONCURRENCY_LIMITS": {"pdf": {"limit": 2}}}
    limiter = RedisLimiter(REDIS_URL, prefix=prefix)
    try:
        x = gd.insert(Transitions, queue=queue_name, concurrency_key="pdf:a", state={"do": "x"})

        def pick(worker, n):
            collapse(queue_name)
            return claims.pick(queue_name, n, worker, 60, gates=limiter.gate_names(), limiter=limiter)

        (first,) = pick("w1", 1)
        assert first.id == x
        again = []
        credit = limiter.credit

        def late_credit(slots):  # w2 picks the row between w1's commit and w1's credit
            again.extend(pick("w2", 1))
            credit(slots)

        limiter.credit = late_credit
        entry = executor.to_entry(Next("go"), Transitions, first, consumed=(), presented=())
        flush([entry], limiter=limiter)
        limiter.credit = credit
        assert [j.id for j in again] == [x], "w2 holds the row again, with a slot"
        gd.insert_all([gd.Spec(Transitions, queue=queue_name, concurrency_key=k, state={"do": "x"})
                       for k in ("pdf:b", "pdf")])
        more = pick("w3", 5)
        assert len(more) == 1, f"limit 2: w2's row and one more, not {[j.id for j in more]}"
    finally:
        keys = list(redis_client().scan_iter(match=prefix + "*"))
        if keys:
            redis_client().delete(*keys)


def test_a_slot_taken_for_a_row_cancelled_before_its_admission_is_not_kept_alive(configure, engine, queue_name):
    """A cancel that lands between a row's claim and its admission: Postgres does not
    admit the row (above); Redis cannot see the cancel and admits it, and the worker runs
    the step. Its heartbeat must not renew that slot (the row is no longer its own): the
    slot expires within one lease, not a lease after the wasted step ends."""
    from tests.durable_app.limit_machines import Gated
    from tests.conftest import wait_until

    limiter = configure(gates={"pdf": {"limit": 1, "retry": 0.05}})
    victim = gd.insert(Gated, queue=queue_name, concurrency_key="pdf:a", state={"sleep": 10})
    real = limiter.admit

    def admit(jobs, queue):
        if any(j.id == victim for j in jobs):
            gd.cancel(victim)  # lands between the claim and the admission
        return real(jobs, queue)

    limiter.admit = admit
    try:
        engine({queue_name: 2})
        wait_until(lambda: gd.get(victim).status == "failed", what="the victim cancelled")
        other = gd.insert(Gated, queue=queue_name, concurrency_key="pdf:b", state={})
        # LEASE_TTL is 3 s in the test settings; the victim's step sleeps 10 s.
        wait_until(lambda: gd.get(other).status == "done", timeout=7,
                   what="the other row admitted within a lease of the cancel")
    finally:
        limiter.admit = real


def test_a_gate_and_a_rate_limit_of_one_name_keep_separate_counters(configure, queue_name):
    """Held: `api` as a gate (limit 2) and as a rate limit (burst 3, no refill to speak
    of) — the rows carry `api:x` as both keys; each limit counts on its own."""
    from tests.durable_app.limit_machines import Transitions

    from .conftest import collapse

    limiter = configure(gates={"api": {"limit": 2}}, rates={"api": {"allowed": 1, "period": 3600, "burst": 3}})
    ids = gd.insert_all([gd.Spec(Transitions, queue=queue_name, concurrency_key="api:x", rate_limit="api:x",
                                 state={"do": "done"}) for _ in range(4)])
    first = claims.pick(queue_name, 10, WORKER, 60, gates=limiter.gate_names(), limiter=limiter)
    assert [j.id for j in first] == ids[:2], "the gate admits 2 (3 tokens were there)"
    from gen_durable.outcomes import Done
    from gen_durable.worker import executor
    from gen_durable.worker.flusher import flush

    flush([executor.to_entry(Done(), Transitions, j, consumed=(), presented=()) for j in first], limiter=limiter)
    collapse(queue_name)
    second = claims.pick(queue_name, 10, WORKER, 60, gates=limiter.gate_names(), limiter=limiter)
    assert [j.id for j in second] == ids[2:3], "2 slots free again, but 1 token left"
    if configure.backend == "postgres":
        assert [(k, c, a) for k, _, c, a in buckets()] == [("api", 2.0, 1.0)]


def gate_members(configure, name):
    """Slots held in gate counter `name`: Postgres capacity - available, Redis members."""
    if configure.backend == "postgres":
        return sum(c - a for k, _, c, a in buckets() if k == name)
    from .conftest import redis_client

    return redis_client().zcard(f"{configure.prefix}conc:{name}")


@pytest.mark.parametrize("how", ["abandon", "reclaim", "reap", "cancel"])
def test_every_way_out_of_executing_gives_the_claimants_slots_back(configure, queue_name, how):
    """Redis members name their admission (row, claimant, sequence); the paths that know
    only the row and its claimant give back every member of that pair."""
    from django.db import connection

    from gen_durable.worker import maintenance

    limiter = configure(gates={"pdf": {"limit": 3}})
    ids = gd.insert_all([gd.Spec(Plain, queue=queue_name, concurrency_key=k) for k in ("pdf:a", "pdf:b", "pdf")])
    worker = f"host:{queue_name}:tok"
    jobs = claims.pick(queue_name, 10, worker, 60, gates=limiter.gate_names(), limiter=limiter)
    assert len(jobs) == 3 and gate_members(configure, "pdf") == 3
    if how == "abandon":
        back = claims.abandon(ids, worker, 0, limiter=limiter)
    elif how == "reclaim":
        back = claims.reclaim(queue_name, "host:", 3600, limiter=limiter)
    elif how == "reap":
        with connection.cursor() as cur:
            cur.execute("UPDATE gen_durable SET lease_expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
                        [ids])
        back = maintenance.reap(limiter=limiter)
    else:
        back = [gd.cancel(i) for i in ids]
    assert sorted(back) == ids
    assert gate_members(configure, "pdf") == 0
