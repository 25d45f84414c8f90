"""Insert races on committed rows (docs/design.md#identity).

Each thread uses its own Django connection (connections are per thread) and closes it
when done. Threads open their connection and transaction first, then meet at a
`threading.Barrier` so the racing statements reach Postgres together.
"""

import threading
import time
import uuid

import pytest
from django.db import OperationalError, connection, transaction

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.durable import Plain

pytestmark = pytest.mark.django_db(transaction=True)

SHORT_DEADLOCK_TIMEOUT = "SET LOCAL deadlock_timeout = '100ms'"


def run_threads(n, fn, timeout=30.0):
    """Run `fn(i, barrier)` on `n` threads; return [("ok", value) | ("error", exc)] by thread."""
    barrier = threading.Barrier(n, timeout=10)
    results = [None] * n

    def worker(i):
        try:
            results[i] = ("ok", fn(i, barrier))
        except BaseException as exc:  # reported to the test, never swallowed
            results[i] = ("error", exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,), name=f"race-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a racing thread hung"
    return results


def is_superuser():
    with connection.cursor() as cur:
        cur.execute("SELECT current_setting('is_superuser') = 'on'")
        return cur.fetchone()[0]


def is_deadlock(exc):
    return isinstance(exc, OperationalError) and getattr(exc.__cause__, "sqlstate", None) == "40P01"


def rows_per_key(queue):
    with connection.cursor() as cur:
        cur.execute("SELECT correlation_key, count(*) FROM gen_durable WHERE queue = %s GROUP BY 1", [queue])
        return dict(cur.fetchall())


# --- one key, many inserters ----------------------------------------------------------------

def test_sixteen_simultaneous_inserts_of_one_key_make_exactly_one_row(queue_name):
    rounds = 3
    keys = [f"order:{uuid.uuid4().hex}" for _ in range(rounds)]

    def insert(i, barrier):
        connection.ensure_connection()
        outcomes = []
        for key in keys:
            barrier.wait()
            try:
                outcomes.append(gd.insert(Plain, correlation_key=key, queue=queue_name))
            except gd.DuplicateInstance as exc:
                outcomes.append(exc)
        return outcomes

    results = run_threads(16, insert)
    errors = [r[1] for r in results if r[0] == "error"]
    assert errors == []
    for n, key in enumerate(keys):
        outcomes = [r[1][n] for r in results]
        ids = [o for o in outcomes if isinstance(o, int)]
        dups = [o for o in outcomes if isinstance(o, gd.DuplicateInstance)]
        assert len(ids) == 1 and len(dups) == 15, outcomes
        assert {d.correlation_key for d in dups} == {key}
        assert list(Instance.objects.filter(correlation_key=key).values_list("id", flat=True)) == ids
    assert rows_per_key(queue_name) == {k: 1 for k in keys}


def test_a_duplicate_insert_waits_for_the_holders_transaction(queue_name):
    # The holder inserted inside transaction.atomic() and has not committed: a second
    # insert of the key blocks on it, then is a duplicate if the holder commits and
    # succeeds if it rolls back.
    for holder_commits in (True, False):
        key = f"order:{uuid.uuid4().hex}"
        inserted, release = threading.Event(), threading.Event()

        def holder():
            try:
                with transaction.atomic():
                    gd.insert(Plain, correlation_key=key, queue=queue_name)
                    inserted.set()
                    assert release.wait(10)
                    if not holder_commits:
                        transaction.set_rollback(True)
            finally:
                connection.close()

        def second(out):
            try:
                assert inserted.wait(10)
                out.append(gd.insert(Plain, correlation_key=key, queue=queue_name))
            except gd.DuplicateInstance as exc:
                out.append(exc)
            finally:
                connection.close()

        out = []
        threads = [threading.Thread(target=holder), threading.Thread(target=second, args=(out,))]
        for t in threads:
            t.start()
        assert inserted.wait(10)

        def second_is_blocked():
            with connection.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND wait_event_type = 'Lock' AND query LIKE %s", ["%INSERT INTO gen_durable%"])
                return cur.fetchone()[0] == 1

        wait_until(second_is_blocked, timeout=10, what="the second insert to wait on the holder")
        assert out == []
        release.set()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads)
        if holder_commits:
            assert len(out) == 1 and isinstance(out[0], gd.DuplicateInstance)
        else:
            assert len(out) == 1 and isinstance(out[0], int)
        assert Instance.objects.filter(correlation_key=key).count() == 1


# --- two batches, overlapping new keys, opposite orders ---------------------------------------

N_KEYS = 200
HOLD = 0.05  # seconds each transaction stays open after its insert, so the two overlap


def race_two_batches(insert_batch, keys, short_timeout):
    """Both threads insert `keys` (one in order, one reversed) inside transaction.atomic()."""

    def run(i, barrier):
        order = keys if i == 0 else keys[::-1]
        with transaction.atomic():
            if short_timeout:
                with connection.cursor() as cur:
                    cur.execute(SHORT_DEADLOCK_TIMEOUT)  # a deadlock is found in 0.1 s, not 1 s
            connection.ensure_connection()
            barrier.wait()
            value = insert_batch(order)
            time.sleep(HOLD)
        return value

    return run_threads(2, run)


def test_racing_insert_all_batches_in_opposite_orders_do_not_deadlock(queue_name):
    short = is_superuser()
    all_keys = []
    for _ in range(5):
        keys = [f"k:{uuid.uuid4().hex}" for _ in range(N_KEYS)]
        all_keys += keys
        results = race_two_batches(
            lambda order: gd.insert_all([gd.Spec(Plain, correlation_key=k, queue=queue_name) for k in order]),
            keys, short)
        errors = [r[1] for r in results if r[0] == "error"]
        assert not any(is_deadlock(e) for e in errors), errors
        assert errors == []
        # Both batches walk the keys in one order, so the later one waits on the first
        # key and then finds every key taken: one batch gets all rows, the other none.
        inserted = sorted(sum(i is not None for i in r[1]) for r in results)
        assert inserted == [0, N_KEYS]
    assert rows_per_key(queue_name) == {k: 1 for k in all_keys}


RAW_INSERT_IN_INPUT_ORDER = """
INSERT INTO gen_durable (fsm, step, queue, correlation_key)
SELECT 'tests.Plain', 'start', %s, k FROM unnest(%s::text[]) WITH ORDINALITY AS t(k, i) ORDER BY i
ON CONFLICT (correlation_guard) WHERE correlation_guard IS NOT NULL DO NOTHING
"""


def test_control_unsorted_batches_in_opposite_orders_do_deadlock(queue_name):
    # The negative control for the test above: the same race with an INSERT that keeps
    # the input order (what insert_all would do if insert_rows did not sort a keyed
    # batch into key order) deadlocks.
    short = is_superuser()

    def raw(order):
        with connection.cursor() as cur:
            cur.execute(RAW_INSERT_IN_INPUT_ORDER, [queue_name, order])
            return cur.rowcount

    deadlocks, rounds, deadline = 0, 0, time.monotonic() + 10
    while rounds < 20 and time.monotonic() < deadline and not deadlocks:
        rounds += 1
        keys = [f"k:{uuid.uuid4().hex}" for _ in range(N_KEYS)]
        results = race_two_batches(raw, keys, short)
        errors = [r[1] for r in results if r[0] == "error"]
        assert all(is_deadlock(e) for e in errors), errors
        deadlocks += len(errors)
    assert deadlocks >= 1, f"no deadlock in {rounds} rounds"
