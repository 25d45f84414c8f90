"""Admission is batched: its cost does not grow with the batch; a throttled head moves aside."""

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.worker import claims
from gen_durable.worker.scheduler import LIMITED_WINDOW
from tests.durable_app.durable import Plain

from .test_admission import pick

pytestmark = pytest.mark.django_db


def statements(captured):
    return [q["sql"].split("\n")[0] for q in captured.captured_queries]


@pytest.mark.parametrize("n", [4, 40])
def test_a_limited_pick_costs_a_constant_number_of_statements(configure, committed, django_assert_max_num_queries,
                                                             queue_name, n, monkeypatch):
    limiter = configure(gates={"g": {"limit": n // 2}}, rates={"r": {"allowed": 0, "period": 1, "burst": n}})
    gd.insert_all([gd.Spec(Plain, queue=queue_name, concurrency_key="g", rate_limit="r") for _ in range(n)])
    calls = []
    if configure.backend == "redis":  # count round-trips: every command the client sends
        real = limiter.client.execute_command
        monkeypatch.setattr(limiter.client, "execute_command", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    with django_assert_max_num_queries(100) as captured:
        jobs = pick(limiter, queue_name, n)
    assert len(jobs) == n // 2
    texts = statements(captured)
    if configure.backend == "postgres":
        # claim, BEGIN, lock, debit, COMMIT, defer (the denied half), inboxes, children
        assert len(texts) == 8, texts
        assert [t for t in texts if t.startswith("--")] == [
            "-- pick: claim up to `limit` runnable rows of one queue and lease them to `worker`.",
            "-- limiter_lock: lock the counter shards of the keys a claimed batch needs (Postgres limiter).",
            "-- limiter_debit: apply one admission decision (second statement of the admission transaction).",
            "-- defer: hand claimed rows the limiter denied back to runnable, later.",
            texts[-2], texts[-1]]
    else:
        assert len(texts) == 4, texts  # claim, defer, inboxes, children
        assert calls in (["EVALSHA"], ["SCRIPT LOAD", "EVALSHA"], ["EVALSHA", "SCRIPT LOAD", "EVALSHA"]), calls


def test_an_unlimited_pick_never_calls_the_limiter(configure, django_assert_num_queries, queue_name):
    limiter = configure(gates={"g": {"limit": 1}}, rates={"r": {"allowed": 1, "period": 1}})
    gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(5)])
    limiter.admit = None  # would raise if called
    with django_assert_num_queries(3):
        assert len(pick(limiter, queue_name)) == 5


def test_credit_of_a_flush_is_one_statement_for_any_number_of_slots(committed, settings, queue_name,
                                                                     django_assert_num_queries):
    from gen_durable.limiter.postgres import PostgresLimiter
    from gen_durable.outcomes import Done
    from gen_durable.worker import executor
    from gen_durable.worker.flusher import flush

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "CONCURRENCY_LIMITS": {"g": {"limit": 50, "shards": 3}}}
    limiter = PostgresLimiter()
    gd.insert_all([gd.Spec(Plain, queue=queue_name, concurrency_key=f"g:{i % 4}") for i in range(40)])
    jobs = pick(limiter, queue_name, 40)
    entries = [executor.to_entry(Done(), Plain, j, consumed=(), presented=()) for j in jobs]
    with django_assert_num_queries(4):  # BEGIN, flush, credit, COMMIT
        flush(entries, limiter=limiter)
    with connection.cursor() as cur:
        cur.execute("SELECT bool_and(available = capacity) FROM gen_durable_buckets")
        assert cur.fetchone()[0]


def test_a_throttled_head_of_10000_rows_does_not_starve_100_rows_behind_it(configure, committed, queue_name):
    """10,000 rows of a throttled rate key, then 100 unlimited rows, same priority. Picks
    of 4 (plus the widened window after denials, as the scheduler does) reach all 100 in
    about 10,000 / LIMITED_WINDOW picks: each throttled row is deferred once, to when
    its bucket can admit it, instead of filling every pick's window."""
    limiter = configure(rates={"slow": {"allowed": 1, "period": 1, "burst": 2}})
    gd.insert_all([gd.Spec(Plain, queue=queue_name, rate_limit="slow") for _ in range(10_000)])
    free = set(gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(100)]))
    got, throttled_run, picks, window = set(), 0, 0, None
    while free - got and picks < 200:
        stats = {}
        jobs = claims.pick(queue_name, 4, "hol", 60, gates=(), limiter=limiter, window=window, stats=stats)
        picks += 1
        window = LIMITED_WINDOW if stats.get("denied", 0) * 2 >= stats.get("claimed", 1) and stats.get("denied") else None
        got |= {j.id for j in jobs if j.id in free}
        throttled_run += sum(j.id not in free for j in jobs)
        claims.release(jobs, "hol")  # "ran": out of the way (unlimited rows are not re-picked: see below)
        with connection.cursor() as cur:
            cur.execute("UPDATE gen_durable SET status = 'done' WHERE id = ANY(%s)", [[j.id for j in jobs]])
    assert got == free
    assert picks <= 10_000 // LIMITED_WINDOW + 30
    assert throttled_run <= 2 + picks  # the burst, then ~1/s


def test_without_deferral_the_same_head_starves_them(configure, committed, queue_name, monkeypatch):
    """Negative control: denied rows requeued with their old eligible_at (no deferral) —
    the 100 rows behind the head are never reached."""
    limiter = configure(rates={"slow": {"allowed": 0, "period": 1, "burst": 2}})
    gd.insert_all([gd.Spec(Plain, queue=queue_name, rate_limit="slow") for _ in range(2_000)])
    free = set(gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(100)]))
    real = claims.defer
    monkeypatch.setattr(claims, "defer", lambda ids, delays, worker, using=None: real(ids, [None] * len(ids), worker, using))
    got = set()
    for _ in range(20):
        got |= {j.id for j in claims.pick(queue_name, 4, "hol", 60, gates=(), limiter=limiter, window=LIMITED_WINDOW)}
    assert not got & free
