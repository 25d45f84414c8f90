"""Gates and rate limits, admitted after the claim (docs/guide.md, "Limits").

Every test runs on both limiter backends (Postgres and the machine's Redis).
"""


import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.exceptions import InvalidInput
from gen_durable.models import Instance
from gen_durable.outcomes import Done
from gen_durable.worker import claims, executor
from gen_durable.worker.flusher import flush
from tests.conftest import wait_until
from tests.durable_app.durable import Plain
from tests.factories import InstanceFactory
from tests.durable_app.limit_machines import Transitions

from .conftest import buckets, collapse, rows

pytestmark = pytest.mark.django_db

WORKER = "lim-worker"


def pick(limiter, queue, n=10, **kw):
    return claims.pick(queue, n, WORKER, 60, gates=limiter.gate_names(), limiter=limiter, **kw)


def finish(limiter, jobs, outcome=None):
    entries = [executor.to_entry(outcome or Done(), Plain, j, consumed=(), presented=()) for j in jobs]
    return flush(entries, limiter=limiter)


def insert(queue, n, machine=Plain, **kw):
    return gd.insert_all([gd.Spec(machine, queue=queue, **kw) for _ in range(n)])


def test_a_gate_admits_up_to_its_limit_and_requeues_the_rest_for_later(configure, queue_name):
    limiter = configure(gates={"api": {"limit": 2}})
    ids = insert(queue_name, 4, concurrency_key="api:x")
    jobs = pick(limiter, queue_name)
    assert [j.id for j in jobs] == ids[:2]
    denied = {r[0]: r for r in rows(queue_name) if r[0] in ids[2:]}
    # back to runnable, unlocked, no shard, attempt kept, and not due at once
    assert {r[1:] for r in denied.values()} == {("runnable", None, None, 0, True)}
    collapse(queue_name)
    assert pick(limiter, queue_name) == []  # both slots held
    finish(limiter, jobs[:1])
    collapse(queue_name)
    assert [j.id for j in pick(limiter, queue_name)] == [ids[2]]


def test_a_gate_of_limit_2_runs_two_at_once_not_one(configure, queue_name):
    """The gate is not K=1: two rows of the same key are admitted together."""
    limiter = configure(gates={"pdf": {"limit": 2}})
    insert(queue_name, 3, concurrency_key="pdf")
    assert len(pick(limiter, queue_name)) == 2


def test_a_gate_counts_every_key_of_its_name_together(configure, queue_name):
    """`pdf:a`, `pdf:b` and `pdf` share the name's slots (the default, per="name")."""
    limiter = configure(gates={"pdf": {"limit": 3}})
    for key in ("pdf:a", "pdf:b", "pdf"):
        insert(queue_name, 2, concurrency_key=key)
    first = pick(limiter, queue_name)
    assert len(first) == 3
    assert {j.slot[0] for j in first} == {"pdf"}  # one counter for the name
    collapse(queue_name)
    assert pick(limiter, queue_name) == []  # the name is full, whatever the key
    finish(limiter, first[:2])
    collapse(queue_name)
    assert len(pick(limiter, queue_name)) == 2
    if configure.backend == "postgres":
        assert [(k, a) for k, _, _, a in buckets()] == [("pdf", 0.0)]


def test_a_per_key_gate_gives_each_key_its_own_slots_and_unconfigured_keys_stay_k1(configure, queue_name):
    limiter = configure(gates={"api": {"limit": 1, "per": "key"}})
    insert(queue_name, 2, concurrency_key="api:a")
    insert(queue_name, 2, concurrency_key="api:b")
    insert(queue_name, 2, concurrency_key="other:1")
    got = pick(limiter, queue_name)
    assert sorted(j.concurrency_key for j in got) == ["api:a", "api:b", "other:1"]
    assert sorted(j.slot[0] for j in got if j.slot is not None) == ["api:a", "api:b"]


def test_every_outcome_credits_the_slot(configure, queue_name):
    limiter = configure(gates={"g": {"limit": 1}})
    for do in ("next", "retry", "await", "stop", "done", "release", "switch"):
        (id_,) = gd.insert_all([gd.Spec(Transitions, queue=queue_name, concurrency_key="g:1",
                                        state={"do": do, "key": "elsewhere"})])
        (job,) = pick(limiter, queue_name)
        assert job.id == id_ and job.slot is not None
        entry = executor.execute(job)
        assert flush([entry], limiter=limiter).committed
        Instance.objects.filter(id=id_).update(status="done")  # out of the way, holding nothing
        other = insert(queue_name, 1, concurrency_key="g:1")
        got = pick(limiter, queue_name)
        assert [j.id for j in got] == other, f"slot not credited after {do}"
        finish(limiter, got)


def test_cancel_and_reap_credit_the_slot(configure, queue_name):
    from gen_durable.worker import maintenance

    limiter = configure(gates={"g": {"limit": 1}})
    a, b, c = insert(queue_name, 3, concurrency_key="g")
    (job,) = pick(limiter, queue_name)
    gd.cancel(job.id)
    collapse(queue_name)
    (job,) = pick(limiter, queue_name)
    assert job.id == b
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [b])
    assert maintenance.reap(limiter=limiter) == [b]
    collapse(queue_name)
    got = pick(limiter, queue_name)
    assert [j.id for j in got] == [b] or [j.id for j in got] == [c]


def test_a_cold_rate_bucket_admits_its_burst_at_once_then_nothing(configure, queue_name):
    limiter = configure(rates={"api": {"allowed": 0, "period": 1, "burst": 5}})
    insert(queue_name, 10, rate_limit="api")
    assert len(pick(limiter, queue_name)) == 5
    collapse(queue_name)
    assert pick(limiter, queue_name) == []


def test_weights_take_a_strict_most_urgent_prefix(configure, queue_name):
    limiter = configure(rates={"api": {"allowed": 0, "period": 1, "burst": 5}})
    heavy = gd.insert(Plain, queue=queue_name, rate_limit="api", weight=2, priority=0)
    light = gd.insert(Plain, queue=queue_name, rate_limit="api", weight=2, priority=1)
    fat = gd.insert(Plain, queue=queue_name, rate_limit="api", weight=2, priority=2)   # 6 > 5: stops here
    thin = gd.insert(Plain, queue=queue_name, rate_limit="api", weight=1, priority=3)  # would fit, but not past `fat`
    assert [j.id for j in pick(limiter, queue_name)] == [heavy, light]
    assert {r[0] for r in rows(queue_name) if r[1] == "runnable"} == {fat, thin}


def test_a_rate_bucket_refills(configure, committed, queue_name):
    """Committed: the database's now() must move between picks."""
    limiter = configure(rates={"api": {"allowed": 100, "period": 1, "burst": 1}})
    insert(queue_name, 5, rate_limit="api")
    assert len(pick(limiter, queue_name)) == 1
    got = []

    def more():
        collapse(queue_name)
        got.extend(pick(limiter, queue_name))
        return got

    wait_until(more, timeout=10, what="a refilled token")


def test_partitions_are_separate_buckets(configure, queue_name):
    limiter = configure(rates={"tenant": {"allowed": 0, "period": 1, "burst": 1}})
    for t in (1, 2, 3):
        insert(queue_name, 2, rate_limit=("tenant", t))
    assert sorted(j.rate_limit for j in pick(limiter, queue_name)) == ["tenant:1", "tenant:2", "tenant:3"]


def test_gate_and_rate_compose_and_debit_only_the_admitted(configure, queue_name):
    limiter = configure(gates={"gate": {"limit": 5}}, rates={"api": {"allowed": 0, "period": 1, "burst": 3}})
    insert(queue_name, 3, concurrency_key="gate:x", rate_limit="api", weight=2)
    assert len(pick(limiter, queue_name)) == 1
    if configure.backend == "postgres":
        assert buckets("conc") == [("gate", 0, 5.0, 4.0)]
        assert buckets("rate") == [("api", 0, 3.0, 1.0)]
    else:
        collapse(queue_name)
        insert(queue_name, 4, concurrency_key="gate:x")
        assert len(pick(limiter, queue_name)) == 4  # 1 + 4 = the limit: nothing leaked to the denied rows


def test_retry_keeps_the_rate_limit(configure, queue_name):
    limiter = configure(rates={"api": {"allowed": 0, "period": 1, "burst": 1}})
    gd.insert(Transitions, queue=queue_name, rate_limit="api", state={"do": "retry"})
    (job,) = pick(limiter, queue_name)
    flush([executor.execute(job)], limiter=limiter)
    row = Instance.objects.get(id=job.id)
    assert (row.status, row.rate_limit, row.attempt) == ("runnable", "api", 1)
    collapse(queue_name)
    assert pick(limiter, queue_name) == []  # the retry needs a token too


def test_next_declares_the_rate_limit_of_the_next_step(configure, queue_name):
    limiter = configure(rates={"api": {"allowed": 0, "period": 1, "burst": 2}})
    gd.insert(Transitions, queue=queue_name, state={"do": "next_rate", "rate": "api:7", "weight": 2})
    (job,) = pick(limiter, queue_name)
    flush([executor.execute(job)], limiter=limiter)
    (job,) = pick(limiter, queue_name)  # the cold bucket admits the weight-2 step at once
    assert job.step == "fin" and job.rate_limit == "api:7"


def test_a_weight_above_the_burst_is_rejected(configure, queue_name):
    limiter = configure(rates={"api": {"allowed": 10, "period": 1, "burst": 1}})
    with pytest.raises(InvalidInput, match="above the burst 1 of rate limit 'api'"):
        gd.insert(Plain, queue=queue_name, rate_limit="api", weight=100)
    id_ = gd.insert(Transitions, queue=queue_name, state={"do": "next_rate", "rate": "api", "weight": 100})
    (job,) = pick(limiter, queue_name)
    flush([executor.execute(job)], limiter=limiter)
    row = Instance.objects.get(id=id_)
    assert row.status == "failed"
    assert "weight 100, above the burst 1 of rate limit 'api'" in row.last_error


def test_an_unknown_rate_limit_stalls_the_row_with_an_event_and_a_log_line(configure, queue_name, events, caplog):
    limiter = configure(rates={"api": {"allowed": 10, "period": 1}})
    stalled = InstanceFactory(fsm="tests.Plain", queue=queue_name, rate_limit="ghost:1").id  # no longer configured
    free = gd.insert(Plain, queue=queue_name)
    assert [j.id for j in pick(limiter, queue_name)] == [free]
    assert [(r[1], r[5]) for r in rows(queue_name) if r[0] == stalled] == [("runnable", True)]
    unknown = [m for e, _, m in events if e == "rate_limit.unknown"]
    assert unknown == [{"key": "ghost:1", "name": "ghost", "fsm": "tests.Plain", "step": "start"}]
    assert "rate limit 'ghost' is not in GEN_DURABLE['RATE_LIMITS']" in caplog.text
    # and a Next naming it reports it at once, from the step that named it
    gd.insert(Transitions, queue=queue_name, state={"do": "next_rate", "rate": "phantom"})
    (job,) = pick(limiter, queue_name)
    flush([executor.execute(job)], limiter=limiter)
    assert {"key": "phantom", "name": "phantom", "fsm": "tests.Transitions", "step": "go"} in \
        [m for e, _, m in events if e == "rate_limit.unknown"]


def test_throttled_events(configure, queue_name, events):
    limiter = configure(gates={"api": {"limit": 1}}, rates={"r": {"allowed": 0, "period": 1, "burst": 2}})
    insert(queue_name, 3, concurrency_key="api")
    insert(queue_name, 5, rate_limit="r")
    pick(limiter, queue_name)
    assert ("concurrency.throttled", {"wanted": 3, "admitted": 1}, {"key": "api", "queue": queue_name}) in events
    assert ("rate_limit.throttled", {"wanted": 5, "granted": 2}, {"key": "r", "queue": queue_name}) in events


def test_denied_rows_come_back_when_the_bucket_can_admit_them(configure, queue_name):
    """eligible_at of denied rows follows the refill: rate 10/s, burst 1, 5 rows →
    the k-th denied row becomes due about k/10 s later."""
    limiter = configure(rates={"api": {"allowed": 10, "period": 1, "burst": 1}})
    insert(queue_name, 5, rate_limit="api")
    assert len(pick(limiter, queue_name)) == 1
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM eligible_at - now())::float8 FROM gen_durable "
                    "WHERE queue = %s AND status = 'runnable' ORDER BY eligible_at", [queue_name])
        delays = [r[0] for r in cur.fetchall()]
    assert len(delays) == 4
    for k, d in enumerate(delays, start=1):
        assert k / 10 - 0.08 <= d <= k / 10 + 0.05, delays


def test_admission_of_a_single_already_claimed_row(configure, queue_name):
    """admit(jobs, queue) with one claimed row (what an inline continuation needs)."""
    limiter = configure(gates={"g": {"limit": 1}})
    insert(queue_name, 2, concurrency_key="g")
    a, b = claims.pick(queue_name, 10, WORKER, 60, gates=limiter.gate_names())  # claimed, not admitted
    first = limiter.admit([a], queue_name)
    assert list(first.admitted) == [a.id] and first.denied == []
    second = limiter.admit([b], queue_name)
    assert second.admitted == {} and second.denied == [b.id] and second.retry_in[b.id] > 0
    limiter.credit([first.admitted[a.id]])
    assert list(limiter.admit([b], queue_name).admitted) == [b.id]
