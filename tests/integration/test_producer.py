"""The buffered producer (gen_durable/producer.py): calls return at once, rows go in by
insert_all in batches bounded by size and delay, on the producer's own connection."""

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import override_settings

import gen_durable as gd
from gen_durable import producer as producer_module
from gen_durable.exceptions import DuplicateInstance, InvalidInput
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.durable import Plain

ROOT = Path(__file__).resolve().parents[2]


def rows(queue):
    return Instance.objects.filter(queue=queue).count()


@pytest.fixture
def make():
    made = []

    def make(**kw):
        p = gd.Producer(**kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close(10)


@pytest.fixture
def flushes(events):
    return lambda: [ms["count"] + ms["duplicates"] for e, ms, _ in events if e == "producer.flush"]


def test_calls_return_without_touching_the_database_and_batches_by_size(
        committed, make, queue_name, django_assert_num_queries, flushes):
    p = make(max_batch=50, max_delay=60)
    with django_assert_num_queries(0):  # the calling thread runs no statement
        for i in range(120):
            p.insert(Plain, queue=queue_name, state={"i": i})
    wait_until(lambda: rows(queue_name) == 100, what="two full batches")
    time.sleep(0.2)
    assert rows(queue_name) == 100 and p.pending == 20, "the partial batch waits for its delay"
    assert p.flush(10) is True
    assert rows(queue_name) == 120 and p.pending == 0 and p.inserted == 120
    assert flushes() == [50, 50, 20], "one insert_all per batch"


def test_a_partial_batch_goes_in_after_max_delay(committed, make, queue_name):
    p = make(max_batch=1000, max_delay=0.05)
    for _ in range(3):
        p.insert(Plain, queue=queue_name)
    wait_until(lambda: rows(queue_name) == 3, timeout=5, what="rows after the delay")


def test_the_callers_transaction_is_not_joined(committed, make, queue_name):
    p = make(max_delay=0)
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            p.insert(Plain, queue=queue_name, state={"rolled": "back"})
            assert p.flush(10)
            raise RuntimeError("the caller rolls back")
    assert rows(queue_name) == 1, "the producer's row is in regardless"


def test_bad_input_raises_in_the_caller_and_nothing_is_queued(make, queue_name):
    p = make()
    with pytest.raises(InvalidInput, match="priority"):
        p.insert(Plain, queue=queue_name, priority=10**6)
    with pytest.raises(InvalidInput, match="using"):
        p.insert(Plain, queue=queue_name, using="default")
    assert p.pending == 0
    for kw, msg in [({"max_batch": 0}, "max_batch"), ({"max_delay": -1}, "max_delay"),
                    ({"max_delay": float("nan")}, "max_delay"), ({"max_buffer": 10, "max_batch": 20}, "max_buffer"),
                    ({"on_error": "nope"}, "on_error")]:
        with pytest.raises(InvalidInput, match=msg):
            gd.Producer(**kw)
    p.close()
    with pytest.raises(InvalidInput, match="closed"):
        p.insert(Plain, queue=queue_name)


def test_a_row_postgres_rejects_is_reported_alone_and_duplicates_are_reported(committed, make, queue_name, events):
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION gd_test_reject() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF NEW.state->>'bad' = 'yes' THEN RAISE EXCEPTION 'rejected by test trigger'; END IF;
                  RETURN NEW; END $$;
            CREATE TRIGGER gd_test_reject BEFORE INSERT ON gen_durable FOR EACH ROW EXECUTE FUNCTION gd_test_reject();
        """)
    try:
        reported = []
        p = make(max_batch=100, max_delay=60, on_error=lambda exc, specs: reported.append((exc, specs)))
        gd.insert(Plain, queue=queue_name, correlation_key=f"{queue_name}-taken")
        for i in range(5):
            p.insert(Plain, queue=queue_name, state={"i": i, "bad": "yes" if i == 2 else "no"})
        p.insert(Plain, queue=queue_name, correlation_key=f"{queue_name}-taken")
        assert p.flush(10)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER gd_test_reject ON gen_durable; DROP FUNCTION gd_test_reject()")
    assert rows(queue_name) == 1 + 4, "the other rows of the batch went in"
    kinds = sorted(type(exc).__name__ for exc, _ in reported)
    assert kinds[0] == "DuplicateInstance" and "rejected by test trigger" in str(reported[-1][0]) + str(reported[0][0])
    bad = next(specs for exc, specs in reported if not isinstance(exc, DuplicateInstance))
    assert [s.kwargs["state"]["i"] for s in bad] == [2]
    assert (p.inserted, p.duplicates, p.failed) == (4, 1, 1)
    assert [ms["count"] for e, ms, _ in events if e == "producer.error"] == [1]


def test_a_dropped_connection_is_reconnected(committed, make, queue_name):
    p = make(max_delay=0)
    p.insert(Plain, queue=queue_name)
    assert p.flush(10) and rows(queue_name) == 1
    with connection.cursor() as cur:  # every other session of this database: the producer's
        cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    p.insert(Plain, queue=queue_name)
    assert p.flush(10) and rows(queue_name) == 2 and p.failed == 0


def test_a_full_queue_blocks_the_caller(committed, make, queue_name):
    """max_buffer bounds memory: callers wait for the writer instead of queueing more."""
    with connection.cursor() as cur:
        cur.execute("""
            CREATE FUNCTION gd_test_slow() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_sleep(0.05); RETURN NEW; END $$;
            CREATE TRIGGER gd_test_slow BEFORE INSERT ON gen_durable FOR EACH ROW EXECUTE FUNCTION gd_test_slow();
        """)
    try:
        p = make(max_batch=2, max_delay=0, max_buffer=4)
        peak = []
        for _ in range(20):
            p.insert(Plain, queue=queue_name)
            peak.append(p.pending)
        assert p.flush(30)
    finally:
        with connection.cursor() as cur:
            cur.execute("DROP TRIGGER gd_test_slow ON gen_durable; DROP FUNCTION gd_test_slow()")
    assert rows(queue_name) == 20
    assert max(peak) <= 4 + 2, "queued rows stay within max_buffer (+ the batch being written)"


def test_many_threads_enqueue_and_nothing_is_lost(committed, make, queue_name):
    p = make(max_batch=200, max_delay=0.01)

    def produce(t):
        for i in range(250):
            p.insert(Plain, queue=queue_name, state={"t": t, "i": i})

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert p.flush(30)
    assert rows(queue_name) == 2000 and p.inserted == 2000


@override_settings(GEN_DURABLE={"EXTRA_QUEUES": ["q*"], "PRODUCER": {"MAX_DELAY": 0, "ON_ERROR": "tests.integration.test_producer.on_error"}})
def test_insert_async_uses_the_configured_process_producer(committed, queue_name):
    try:
        gd.insert_async(Plain, queue=queue_name)
        assert gd.flush_async(10)
        assert rows(queue_name) == 1
        assert producer_module.default_producer().on_error is on_error
    finally:
        producer_module.default_producer().close(10)


def on_error(exc, specs):  # the dotted path above
    pass


def test_rows_queued_at_exit_are_written(committed, queue_name):
    """A normal interpreter exit flushes every producer (atexit), however long its delay."""
    code = ("import django; django.setup(); import gen_durable as gd; "
            "from tests.durable_app.durable import Plain; "
            f"p = gd.Producer(max_delay=3600); [p.insert(Plain, queue={queue_name!r}) for _ in range(7)]; "
            "gd.insert_async(Plain, queue=" + repr(queue_name) + ")")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"],
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "example_project")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert rows(queue_name) == 8
