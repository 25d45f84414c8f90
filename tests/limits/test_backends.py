"""Backend-specific limiter behaviour: Postgres shards and reconciler, Redis leases."""

import time
import uuid

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.limiter.postgres import PostgresLimiter
from gen_durable.models import Instance
from gen_durable.limiter.redis import RedisLimiter
from gen_durable.worker import claims
from tests.conftest import wait_until
from tests.durable_app.durable import Plain
from tests.factories import InstanceFactory

from .conftest import REDIS_URL, buckets, collapse, redis_client


def make_due(queue):
    """Racing threads' collapse: ordered and SKIP LOCKED, so it never deadlocks with a pick."""
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET eligible_at = now() WHERE id IN (SELECT id FROM gen_durable "
                    "WHERE queue = %s AND status = 'runnable' AND eligible_at > now() ORDER BY id "
                    "FOR NO KEY UPDATE SKIP LOCKED)", [queue])


def remaining(queue):
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM gen_durable WHERE queue = %s AND status <> 'done'", [queue])
        return cur.fetchone()[0]
from .test_admission import finish, insert, pick

pytestmark = pytest.mark.django_db


@pytest.fixture
def pg(settings):
    def configure(rates=None, gates=None):
        settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": rates or {}, "CONCURRENCY_LIMITS": gates or {}}
        return PostgresLimiter()
    return configure


def test_gate_buckets_are_minted_on_first_use_already_debited(pg, queue_name):
    limiter = pg(gates={"api": {"limit": 2}})
    insert(queue_name, 4, concurrency_key="api")
    assert buckets() == []
    jobs = pick(limiter, queue_name)
    assert buckets() == [("api", 0, 2.0, 0.0)]
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM gen_durable WHERE queue = %s AND status = 'executing' "
                    "AND concurrency_shard = 0", [queue_name])
        assert cur.fetchone()[0] == 2
    finish(limiter, jobs[:1])
    assert buckets() == [("api", 0, 2.0, 1.0)]


def test_shards_split_the_limit_and_each_admission_draws_the_fullest(pg, queue_name):
    limiter = pg(gates={"api": {"limit": 4, "shards": 2}})
    insert(queue_name, 1, concurrency_key="api")
    (lone,) = pick(limiter, queue_name)
    assert buckets() == [("api", 0, 2.0, 1.0)]  # shard 1 is still cold (= full)
    insert(queue_name, 4, concurrency_key="api")
    assert len(pick(limiter, queue_name)) == 3
    assert buckets() == [("api", 0, 2.0, 0.0), ("api", 1, 2.0, 0.0)]




def test_reconcile_heals_a_leaked_gate_counter_from_the_executing_rows(pg, queue_name):
    limiter = pg(gates={"api": {"limit": 2}})
    insert(queue_name, 1, concurrency_key="api")
    pick(limiter, queue_name)
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable_buckets SET available = 0 WHERE key = 'api'")  # a leaked slot
        cur.execute("INSERT INTO gen_durable_buckets (kind, key, shard, capacity, available) "
                    "VALUES ('conc', 'ghost:1', 0, 5, 5), ('conc', 'api', 3, 1, 1)")
    assert limiter.reconcile() == {"buckets": 0, "gates": 3}  # healed api/0, dropped ghost and api/3
    assert buckets() == [("api", 0, 2.0, 1.0)]
    assert limiter.reconcile() == {"buckets": 0, "gates": 0}


def test_reconcile_drops_idle_full_gate_shards(pg, queue_name):
    limiter = pg(gates={"api": {"limit": 2}})
    insert(queue_name, 1, concurrency_key="api:doc-1")
    jobs = pick(limiter, queue_name)
    finish(limiter, jobs)
    assert buckets() == [("api", 0, 2.0, 2.0)]  # the name's counter (per="name")
    assert limiter.reconcile()["gates"] == 1
    assert buckets() == []


@pytest.mark.parametrize("per, healed", [
    ("name", [("api", 0, 3.0, 1.0)]),                                       # api:a and api:b together
    ("key", [("api:a", 0, 3.0, 2.0), ("api:b", 0, 3.0, 2.0)]),              # each key its own
])
def test_reconcile_counts_the_rows_of_each_counter(pg, queue_name, per, healed):
    limiter = pg(gates={"api": {"limit": 3, "per": per}})
    insert(queue_name, 1, concurrency_key="api:a")
    insert(queue_name, 1, concurrency_key="api:b")
    assert len(pick(limiter, queue_name)) == 2
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable_buckets SET available = 0 WHERE kind = 'conc'")  # leaked slots
    assert limiter.reconcile()["gates"] == len(healed)
    assert buckets() == healed


def test_rate_bucket_sweep(pg, committed, queue_name):
    limiter = pg(rates={"api": {"allowed": 10, "period": 1, "burst": 5},
                        "frozen": {"allowed": 0, "period": 1, "burst": 5}})
    with connection.cursor() as cur:
        cur.execute("""INSERT INTO gen_durable_buckets (kind, key, shard, capacity, available, last_refill) VALUES
            ('rate', 'api:idle', 0, 5, 0, now() - interval '10 seconds'),
            ('rate', 'api:fresh', 0, 5, 0, now()),
            ('rate', 'ghost:1', 0, 5, 0, now()),
            ('rate', 'frozen:1', 0, 5, 0, now() - interval '1 hour')""")
    assert limiter.reconcile()["buckets"] == 2
    assert [k for k, *_ in buckets("rate")] == ["api:fresh", "frozen:1"]


def test_gate_counters_stay_within_capacity_under_8_racing_pickers(pg, committed, queue_name):
    """8 threads pick and finish 400 rows of one gate key with 2 shards: the CHECK never
    surfaces, at most `limit` run at once, and every counter ends full."""
    from tests.helpers import ConnectionThread
    import threading

    limiter = pg(gates={"hot": {"limit": 3, "shards": 2}})
    insert(queue_name, 400, concurrency_key="hot")
    running, peak, lock = set(), [0], threading.Lock()

    def worker(n):
        def run():
            w = f"racer-{n}"
            deadline = time.monotonic() + 20
            while remaining(queue_name) and time.monotonic() < deadline:
                jobs = claims.pick(queue_name, 5, w, 60, gates=limiter.gate_names(), limiter=limiter)
                make_due(queue_name)
                if not jobs:
                    continue
                with lock:
                    running.update(j.id for j in jobs)
                    peak[0] = max(peak[0], len(running))
                with lock:
                    running.difference_update(j.id for j in jobs)
                finish(limiter, jobs)
        return ConnectionThread(run)

    threads = [worker(i) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join_result(120)
    assert peak[0] <= 3
    with connection.cursor() as cur:
        cur.execute("SELECT status, concurrency_shard, locked_by, count(*) FROM gen_durable WHERE queue = %s "
                    "GROUP BY 1, 2, 3", [queue_name])
        states = cur.fetchall()
    assert states == [("done", None, None, 400)], (states, buckets())
    assert all(avail == cap for _, _, cap, avail in buckets())


def test_racing_cold_rate_mints_conserve_tokens(configure, committed, queue_name, events):
    """8 threads pick from 20 fresh keys × 10 rows (rate 0, burst 5): exactly 5 per key."""
    from tests.helpers import ConnectionThread

    limiter = configure(rates={"api": {"allowed": 0, "period": 1, "burst": 5}})
    gd.insert_all([gd.Spec(Plain, queue=queue_name, rate_limit=f"api:{k}") for k in range(20) for _ in range(10)])
    admitted = []

    def worker(n):
        def run():
            for _ in range(20):
                jobs = claims.pick(queue_name, 7, f"mint-{n}", 60, gates=(), limiter=limiter)
                admitted.extend(j.rate_limit for j in jobs)
                make_due(queue_name)
        return ConnectionThread(run)

    threads = [worker(i) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join_result(120)
    from collections import Counter

    assert Counter(admitted) == {f"api:{k}": 5 for k in range(20)}
    if configure.backend == "postgres":
        assert {avail for *_, avail in buckets("rate")} == {0.0}


@pytest.fixture
def redis_limiter(settings):
    prefix = f"gdtest:{uuid.uuid4().hex[:10]}:"
    made = []

    def make(gates=None, rates=None, lease=60.0):
        settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": rates or {}, "CONCURRENCY_LIMITS": gates or {}}
        lim = RedisLimiter(REDIS_URL, prefix=prefix, lease_ttl=lease)
        lim.sync_config()  # as a worker's start-up does: the prefix's epoch
        made.append(lim)
        return lim

    yield make
    client = redis_client()
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)


def test_redis_slots_of_a_dead_worker_expire_with_their_lease(redis_limiter, queue_name):
    limiter = redis_limiter(gates={"api": {"limit": 2}}, lease=0.2)
    insert(queue_name, 4, concurrency_key="api")
    assert len(pick(limiter, queue_name)) == 2  # then the worker "dies": no credit, no renew
    collapse(queue_name)
    assert pick(limiter, queue_name) == []
    got = []

    def expired():
        collapse(queue_name)
        got.extend(pick(limiter, queue_name))
        return len(got) == 2

    wait_until(expired, timeout=10, what="the dead worker's slots to expire")


def test_redis_renew_keeps_a_live_workers_slots(redis_limiter, queue_name):
    limiter = redis_limiter(gates={"api": {"limit": 1}}, lease=0.3)
    insert(queue_name, 2, concurrency_key="api")
    (held,) = pick(limiter, queue_name)
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # renew well inside the lease, as the heartbeat does
        limiter.renew([held.slot])
        collapse(queue_name)
        assert pick(limiter, queue_name) == []
        time.sleep(0.05)


def test_redis_zero_rate_buckets_never_expire(redis_limiter, queue_name):
    limiter = redis_limiter(rates={"frozen": {"allowed": 0, "period": 1, "burst": 1},
                                   "live": {"allowed": 10, "period": 1, "burst": 1}})
    insert(queue_name, 1, rate_limit="frozen")
    insert(queue_name, 1, rate_limit="live")
    assert len(pick(limiter, queue_name)) == 2
    client = redis_client()
    assert client.pttl(limiter.rate_key("frozen")) == -1
    assert 0 < client.pttl(limiter.rate_key("live")) <= 1100


def test_check_and_start_up_warn_about_unconfigured_rate_limit_names(pg, queue_name, caplog):
    """W004 names each unconfigured rate limit with how many rows wait on it and one of
    their ids (where to look in the admin), most rows first."""
    from gen_durable.checks import check_rate_limit_names
    from gen_durable.limiter import unknown_rate_limits

    pg(rates={"api": {"allowed": 1, "period": 1}})
    # Rows that name a rate limit no longer configured (insert refuses unconfigured names).
    ghosts = [InstanceFactory(fsm="tests.Plain", queue=queue_name, rate_limit=f"ghost:{k}").id for k in range(3)]
    typo = InstanceFactory(fsm="tests.Plain", queue=queue_name, rate_limit="apj").id
    gd.insert(Plain, queue=queue_name, rate_limit="api")
    assert unknown_rate_limits() == [("ghost", 3, min(ghosts)), ("apj", 1, typo)]
    (warning,) = check_rate_limit_names(databases=["default"])
    assert warning.id == "gen_durable.W004"
    assert f"ghost (3 rows, e.g. id {min(ghosts)}), apj (1 row, e.g. id {typo})" in warning.msg
    assert check_rate_limit_names(databases=None) == []  # only with --database


def test_an_unreachable_redis_limiter_holds_back_only_the_limited_rows(engine, settings, queue_name, events,
                                                                        tmp_path):
    """Redis down: rows without limits run; rows with a gate or a rate limit wait and are
    retried; once a Redis answers on that address they run too (no restart)."""
    import subprocess

    from tests.faults.cluster import free_port

    port = free_port()  # nothing listens here yet: connection refused
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "CONCURRENCY_LIMITS": {"erp": {"limit": 2}},
                            "RATE_LIMITS": {"api": {"allowed": 100, "period": 1}},
                            "LIMITER": {"BACKEND": "redis", "URL": f"redis://127.0.0.1:{port}/0", "PREFIX": "gdtest-down:"}}
    plain = insert(queue_name, 3)
    limited = insert(queue_name, 2, concurrency_key="erp:a") + insert(queue_name, 1, rate_limit="api")
    engine({queue_name: 4})
    wait_until(lambda: Instance.objects.filter(id__in=plain, status="done").count() == 3, timeout=20,
               what="the rows without limits done while the limiter is down")
    assert set(Instance.objects.filter(id__in=limited).values_list("status", flat=True)) == {"runnable"}
    assert any(e == "limiter.unavailable" and md["backend"] == "redis" for e, _, md in events)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        wait_until(lambda: Instance.objects.filter(id__in=limited, status="done").count() == 3, timeout=30,
                   what="the limited rows done once Redis answers")
    finally:
        server.terminate()
        server.wait(10)


def test_redis_a_stale_outcomes_slot_is_given_back_when_a_crash_undid_its_claim(redis_limiter, queue_name):
    """A claim committed without waiting for the WAL flush can be undone by a server
    crash while its step runs (docs/design.md, "Claims across a crash"). Its Redis slot
    is no Postgres row: the crash leaves it, and no reap credits it (the row is not
    claimed). The step's outcome, stale when it arrives, gives the slot back; before, it
    stayed until its lease lapsed and the gate admitted one fewer meanwhile."""
    limiter = redis_limiter(gates={"api": {"limit": 1}})
    (first_id, _) = insert(queue_name, 2, concurrency_key="api")
    (job,) = pick(limiter, queue_name)
    assert job.id == first_id and job.slot is not None
    with connection.cursor() as cur:  # what the crash leaves: the row as it was before the claim
        cur.execute("UPDATE gen_durable SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL, "
                    "claim = claim - 1 WHERE id = %s", [job.id])
    collapse(queue_name)
    assert pick(limiter, queue_name) == []  # the undone claim's slot still fills the gate
    result = finish(limiter, [job])
    assert result.committed == {} and [e.id for e in result.stale] == [job.id]
    collapse(queue_name)
    assert [j.id for j in pick(limiter, queue_name)] == [first_id]  # admitted again at once


def test_redis_a_stale_outcomes_credit_leaves_the_newer_admission_of_its_row_held(redis_limiter, queue_name):
    """The same worker claimed and admitted the row again before the stale outcome came:
    the credit removes the first admission's member only (a member names its admission)."""
    limiter = redis_limiter(gates={"api": {"limit": 2}})
    (a,) = insert(queue_name, 1, concurrency_key="api")
    (first,) = pick(limiter, queue_name)
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET status = 'runnable', locked_by = NULL, lease_expires_at = NULL, "
                    "claim = claim - 1 WHERE id = %s", [a])
    (second,) = pick(limiter, queue_name, held={a: first.claim})  # as the feeder does after a crash
    assert (first.id, second.id) == (a, a) and second.claim > first.claim and second.slot != first.slot
    b, _c = insert(queue_name, 2, concurrency_key="api")
    assert finish(limiter, [first]).committed == {}
    collapse(queue_name)
    assert [j.id for j in pick(limiter, queue_name)] == [b]  # one slot came back; `second` holds the other
    collapse(queue_name)
    assert pick(limiter, queue_name) == []
    assert finish(limiter, [second]).committed == {a: "done"}
