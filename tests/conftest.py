import itertools
import uuid

import pytest
from django.db import connection


_counter = itertools.count()


@pytest.fixture(scope="session", autouse=True)
def _stop_result_watcher(django_db_setup):
    """Close await_result's LISTEN connections before the test database is dropped."""
    yield
    from gen_durable.testing import stop_result_watchers

    stop_result_watchers()


@pytest.fixture
def queue_name(request):
    """A queue name unique to this test, so tests sharing a database stay apart."""
    return f"q{next(_counter)}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
def clean_tables(transactional_db):
    """Committed-row tests start from empty tables (transactional_db flushes after)."""
    with connection.cursor() as cur:
        cur.execute("TRUNCATE gen_durable, gen_durable_signals, gen_durable_buckets, gen_durable_bucket_configs, "
                    "gen_durable_history RESTART IDENTITY CASCADE")
    yield


@pytest.fixture
def committed(clean_tables):
    """Committed rows (other sessions and processes see them), removed again at teardown."""
    yield
    with connection.cursor() as cur:
        cur.execute("TRUNCATE gen_durable, gen_durable_signals, gen_durable_history RESTART IDENTITY CASCADE")


@pytest.fixture
def events():
    """Telemetry events (name, measurements, metadata) emitted during the test."""
    from gen_durable import telemetry

    seen = []

    def handler(event, measurements, metadata):
        seen.append((event, measurements, metadata))

    telemetry.attach("", handler)
    yield seen
    telemetry.detach(handler)


def wait_until(predicate, timeout=10.0, interval=0.02, what="condition"):
    """Poll `predicate` until it is truthy; fail after `timeout` seconds (bounded retry)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def engine(transactional_db):
    """Start an in-process worker (gen_durable.worker.supervisor) for given queues; stop at teardown."""
    from django.db import connections

    from gen_durable.worker.supervisor import Supervisor, WorkerConfig

    started = []

    def start(queues, **kw):
        sup = Supervisor(WorkerConfig(queues=queues, **kw)).start()
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.stop()
    connections.close_all()
