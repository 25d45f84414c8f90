"""Process-level: two `rundurable` processes × 8 threads on a gate of limit 3, both backends.

A side table (gd_test_running) holds one row per step while it runs; a sampler in the
test counts them. Slow: each test starts two worker processes.
"""

import os
import signal
import subprocess
import threading
import time
import uuid

import pytest
from django.db import connection

import gen_durable as gd
from tests.conftest import wait_until
from tests.durable_app.limit_machines import Gated, KeyHopper
from tests.integration.test_rundurable import MANAGE, ROOT, child_env

from .conftest import REDIS_URL, redis_client

pytestmark = pytest.mark.slow


@pytest.fixture
def side_table(committed):
    with connection.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS gd_test_running (id bigint PRIMARY KEY, tag text, pid int)")
        cur.execute("DELETE FROM gd_test_running")
    yield
    with connection.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS gd_test_running")


@pytest.fixture
def limiter_settings(backend):
    prefix = f"gdtest:{uuid.uuid4().hex[:10]}:"
    cfg = {"CONCURRENCY_LIMITS": {"pdf": {"limit": 3, "retry": 0.05}}}
    if backend == "redis":
        cfg["LIMITER"] = {"BACKEND": "redis", "URL": REDIS_URL, "PREFIX": prefix}
    yield cfg
    if backend == "redis":
        client = redis_client()
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)


class Sampler(threading.Thread):
    """Counts the running steps of `tag` every few ms (its own connection); keeps the peak."""

    def __init__(self, tag):
        super().__init__(daemon=True)
        self.tag, self.peak, self.samples, self.ignore_pid = tag, 0, 0, None
        self.stop = threading.Event()

    def run(self):
        try:
            while not self.stop.is_set():
                with connection.cursor() as cur:
                    cur.execute("SELECT count(*) FROM gd_test_running WHERE tag = %s AND pid IS DISTINCT FROM %s",
                                [self.tag, self.ignore_pid])
                    self.peak = max(self.peak, cur.fetchone()[0])
                self.samples += 1
                time.sleep(0.003)
        finally:
            connection.close()


def start_workers(queue, cfg, n=2):
    return [subprocess.Popen(MANAGE + ["rundurable", "--queue", f"{queue}=8", "--verbosity", "0"],
                             cwd=ROOT, env=child_env(**cfg), stderr=subprocess.PIPE, text=True)
            for _ in range(n)]


def stop_workers(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()


def running_worker(procs, tag):
    """One of `procs` that is running a step of `tag` now (from the side table), or None."""
    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM gd_test_running WHERE tag = %s", [tag])
        pids = {r[0] for r in cur.fetchall()}
    return next((p for p in procs if p.pid in pids), None)


def done_count(ids):
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM gen_durable WHERE id = ANY(%s) AND status = 'done'", [ids])
        return cur.fetchone()[0]


def test_two_processes_never_run_more_than_the_gate(side_table, limiter_settings, queue_name):
    tag = queue_name
    # Keys of one name: `pdf` and `pdf:<tenant>` all count against the name's 3 slots.
    keys = ["pdf", "pdf:a", "pdf:b", "pdf:c"]
    ids = gd.insert_all([gd.Spec(Gated, queue=queue_name, concurrency_key=keys[i % 4],
                                 state={"track": tag, "sleep": 0.05}) for i in range(60)])
    sampler = Sampler(tag)
    sampler.start()
    procs = start_workers(queue_name, limiter_settings)
    try:
        wait_until(lambda: done_count(ids) == len(ids), timeout=120, interval=0.1, what="every row done")
    finally:
        sampler.stop.set()
        stop_workers(procs)
        sampler.join(10)
    assert sampler.samples > 50
    assert sampler.peak == 3  # never more than the limit over all the name's keys — and not K=1


def test_after_kill_9_the_counters_come_back_within_a_lease_and_a_gc_interval(
        side_table, limiter_settings, backend, queue_name):
    tag = queue_name
    ids = gd.insert_all([gd.Spec(Gated, queue=queue_name, concurrency_key=f"pdf:{i % 3}",
                                 state={"track": tag, "sleep": 0.4}) for i in range(15)])
    procs = start_workers(queue_name, limiter_settings)
    sampler = Sampler(tag)
    try:
        proc = wait_until(lambda: running_worker(procs, tag), timeout=60, what="a worker running a gated step")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        sampler.ignore_pid = proc.pid  # its side-table rows stay behind: it died mid-step
        sampler.start()
        # The dead worker's rows come back after their lease (3 s), its slots with them
        # (Postgres: credited by the reaper, healed by GC's reconciler; Redis: expired).
        wait_until(lambda: done_count(ids) == len(ids), timeout=120, interval=0.1, what="every row done")
        if backend == "postgres":
            def consistent():
                with connection.cursor() as cur:
                    cur.execute("SELECT coalesce(bool_and(available = capacity), true) FROM gen_durable_buckets "
                                "WHERE kind = 'conc' AND key = 'pdf'")
                    return cur.fetchone()[0]
            wait_until(consistent, timeout=5, what="gate counters full again within a GC interval (0.5 s)")
        else:
            client = redis_client()
            key = limiter_settings["LIMITER"]["PREFIX"] + "conc:pdf"
            wait_until(lambda: client.zcard(key) == 0, timeout=5, what="no slot left in Redis")
    finally:
        sampler.stop.set()
        stop_workers(procs)
        if sampler.is_alive():
            sampler.join(10)
    assert sampler.peak <= 3


def gate_counters_full(backend, cfg):
    """Postgres: every conc bucket full (or swept); Redis: no member left in any gate set."""
    if backend == "postgres":
        with connection.cursor() as cur:
            cur.execute("SELECT key, shard, capacity, available FROM gen_durable_buckets WHERE kind = 'conc' "
                        "AND (key = 'pdf' OR key LIKE 'pdf:%%') ORDER BY key, shard")
            rows = cur.fetchall()
        return all(c == a for _, _, c, a in rows) and all(k == "pdf" for k, *_ in rows), rows
    client = redis_client()
    prefix = cfg["LIMITER"]["PREFIX"] + "conc:"
    sets = {k.decode(): client.zcard(k) for k in client.scan_iter(match=prefix + "*")}
    return all(n == 0 for n in sets.values()), sets


@pytest.mark.parametrize("shards", [1, 3])
def test_key_hopping_cancel_and_kill_9_across_two_processes_keep_the_name_gate(
        side_table, limiter_settings, backend, queue_name, shards):
    """Rows move between `pdf:a`, `pdf:b`, no key and `pdf` (one name: 3 slots), park,
    continue inline, retry; some are cancelled and one worker is killed mid-step. Never
    more than 3 gated steps at once, and every counter comes back full (Postgres: over
    1 or 3 shards; Redis ignores shards)."""
    limiter_settings["CONCURRENCY_LIMITS"]["pdf"]["shards"] = shards
    tag = queue_name
    ids = gd.insert_all([gd.Spec(KeyHopper, queue=queue_name, concurrency_key=("pdf:a", "pdf:b")[i % 2],
                                 state={"track": tag, "sleep": 0.03, "first": ("pdf:a", "pdf:b")[i % 2]})
                         for i in range(40)])
    sampler = Sampler(tag)
    procs = start_workers(queue_name, limiter_settings)
    sampler.start()
    try:
        proc = wait_until(lambda: running_worker(procs, tag), timeout=60, what="a worker running a gated step")
        for i in ids[::7]:
            gd.cancel(i)
        sampler.ignore_pid = proc.pid
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

        def settled():
            with connection.cursor() as cur:
                cur.execute("SELECT count(*) FROM gen_durable WHERE id = ANY(%s) AND status IN ('done', 'failed')",
                            [ids])
                return cur.fetchone()[0] == len(ids)
        wait_until(settled, timeout=120, interval=0.1, what="every row done or cancelled")
        wait_until(lambda: gate_counters_full(backend, limiter_settings)[0], timeout=10,
                   what="gate counters full again")
    finally:
        sampler.stop.set()
        stop_workers(procs)
        if sampler.is_alive():
            sampler.join(10)
    assert sampler.samples > 50
    assert 1 < sampler.peak <= 3
    assert done_count(ids) > 0
