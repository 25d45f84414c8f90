"""The Redis limiter across a loss of Redis's data (FLUSHALL, a restart without
persistence): a gate's limit is never exceeded (docs/reliability.md "Limiter data loss").

Every test here runs its own redis-server (port 6433 unless GEN_DURABLE_TEST_OWN_REDIS_PORT
says otherwise): it flushes and restarts it, which the shared one must never see.
"""

import os
import shutil
import subprocess
import time

import pytest
import redis
from django.db import connection

import gen_durable as gd
from gen_durable.limiter.redis import RedisLimiter
from tests.conftest import wait_until
from tests.durable_app.limit_machines import Gated

from .conftest import collapse
from .test_admission import finish, insert, pick
from .test_processes import Sampler, done_count, side_table, start_workers, stop_workers  # noqa: F401

PORT = int(os.environ.get("GEN_DURABLE_TEST_OWN_REDIS_PORT", "6433"))


@pytest.fixture
def own_redis(tmp_path):
    """start() → the URL of a redis-server of this test's own (no persistence); restart()
    starts it again empty. Stopped at teardown."""
    if not shutil.which("redis-server"):
        pytest.skip("no redis-server")
    procs = []

    def start():
        proc = subprocess.Popen(["redis-server", "--port", str(PORT), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
        procs.append(proc)
        client = redis.Redis(port=PORT)
        wait_until(lambda: _pings(client), timeout=10, what="redis-server up")
        return f"redis://127.0.0.1:{PORT}/0"

    def restart():
        stop()
        return start()

    def stop():
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)

    start.restart = restart
    start.stop = stop
    yield start
    stop()


def _pings(client):
    try:
        return client.ping()
    except redis.ConnectionError:
        return False


def limiter_on(url, settings, lease):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "CONCURRENCY_LIMITS": {"api": {"limit": 1, "retry": 0.05}}}
    limiter = RedisLimiter(url, prefix="gdtest-loss:", lease_ttl=lease)
    limiter.sync_config()
    return limiter


@pytest.mark.django_db
@pytest.mark.parametrize("loss", ["flushall", "restart"])
def test_holders_re_assert_their_slots_before_anything_else_is_admitted(own_redis, settings, queue_name, loss):
    url = own_redis()
    limiter = limiter_on(url, settings, lease=1.0)
    insert(queue_name, 3, concurrency_key="api")
    (held,) = pick(limiter, queue_name)
    if loss == "flushall":
        redis.Redis.from_url(url).flushall()
    else:
        own_redis.restart()
    # No slot in Redis now; the epoch is gone with it. Admission asks Postgres, finds the
    # holder and waits a lease while the holder's heartbeat re-adds its slot.
    assert pick(limiter, queue_name) == []
    limiter.renew([held.slot])
    client = redis.Redis.from_url(url)
    assert client.zcard(limiter.gate_key("api")) == 1  # the slot is back
    end = time.monotonic() + 1.5  # past the recovery (one lease): still one holder, nothing admitted
    while time.monotonic() < end:
        limiter.renew([held.slot])  # as the heartbeat does, well inside the lease
        collapse(queue_name)  # (now() is the test transaction's: make the deferred rows due)
        assert pick(limiter, queue_name, n=1) == []
        time.sleep(0.1)
    assert client.zcard(limiter.gate_key("api")) == 1
    finish(limiter, [held])  # the holder's outcome credits its slot: the next is admitted
    collapse(queue_name)
    assert len(pick(limiter, queue_name, n=1)) == 1


@pytest.mark.django_db
def test_negative_control_without_the_epoch_a_flush_over_admits(own_redis, settings, queue_name):
    """What main did: nothing noticed the loss (here: the epoch written back at once, as
    if the data were intact) — a second row of a limit-1 gate is admitted beside the holder."""
    url = own_redis()
    limiter = limiter_on(url, settings, lease=60.0)
    insert(queue_name, 2, concurrency_key="api")
    (held,) = pick(limiter, queue_name)
    client = redis.Redis.from_url(url)
    client.flushall()
    client.hset(limiter.epoch_key, mapping={"seq": 10**6, "until": 0})
    collapse(queue_name)
    assert len(pick(limiter, queue_name)) == 1  # two running on a gate of 1


@pytest.mark.django_db
def test_redis_down_at_the_flush_commits_the_outcome_and_logs_the_lost_credit(own_redis, settings, queue_name,
                                                                              caplog):
    """The outcome is in Postgres before the credit is tried: a Redis that went away in
    between costs the slot until its lease lapses, never the outcome, and says so."""
    url = own_redis()
    limiter = limiter_on(url, settings, lease=60.0)
    insert(queue_name, 1, concurrency_key="api")
    (held,) = pick(limiter, queue_name)
    own_redis.stop()
    with caplog.at_level("ERROR", logger="gen_durable.limiter"):
        result = finish(limiter, [held])
    assert result.committed == {held.id: "done"}
    with connection.cursor() as cur:
        cur.execute("SELECT status FROM gen_durable WHERE id = %s", [held.id])
        assert cur.fetchone()[0] == "done"
    assert any("limiter credit failed" in r.getMessage() for r in caplog.records)


@pytest.mark.django_db
def test_a_fresh_redis_without_holders_admits_at_once(own_redis, settings, queue_name):
    """No row holds a slot (a first deploy, or a loss while the gate was idle): no wait."""
    url = own_redis()
    limiter = limiter_on(url, settings, lease=60.0)
    insert(queue_name, 2, concurrency_key="api")
    redis.Redis.from_url(url).flushall()
    assert len(pick(limiter, queue_name)) == 1


@pytest.mark.slow
def test_flushall_under_a_running_holder_never_shows_two_running(own_redis, side_table, queue_name):  # noqa: F811
    """The acceptance check, with real workers: a limit-1 gate, a holder running, FLUSHALL.
    On main a second job started at once (limit 2: four at once, 0.1 s after the flush)."""
    url = own_redis()
    cfg = {"CONCURRENCY_LIMITS": {"one": {"limit": 1, "retry": 0.05}}, "LEASE_TTL": 4, "HEARTBEAT_INTERVAL": 1,
           "LIMITER": {"BACKEND": "redis", "URL": url, "PREFIX": "gdtest-loss-proc:"}}
    tag = queue_name
    ids = gd.insert_all([gd.Spec(Gated, queue=queue_name, concurrency_key="one", state={"track": tag, "sleep": 2})
                         for _ in range(3)])
    sampler = Sampler(tag)
    procs = start_workers(queue_name, cfg)
    try:
        def running():
            with connection.cursor() as cur:
                cur.execute("SELECT count(*) FROM gd_test_running WHERE tag = %s", [tag])
                return cur.fetchone()[0]
        wait_until(lambda: running() == 1, timeout=60, what="the first holder running")
        sampler.start()
        redis.Redis.from_url(url).flushall()
        wait_until(lambda: done_count(ids) == len(ids), timeout=60, interval=0.1, what="every row done")
    finally:
        sampler.stop.set()
        stop_workers(procs)
        if sampler.is_alive():
            sampler.join(10)
    assert sampler.samples > 50
    assert sampler.peak == 1
