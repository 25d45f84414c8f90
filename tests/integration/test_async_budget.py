"""An async-only queue's concurrency needs neither step threads nor connections
(docs/reliability.md, "Connections"): `rundurable --queue aio=300` fits a server of
max_connections 100 and runs 300 one-second awaits at once."""

import subprocess

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable import registry
from gen_durable.models import Instance
from gen_durable.worker.connections import connection_need
from tests.durable_app.async_machines import AsyncOnlyQueueSleeper, AsyncSleeper
from tests.integration.test_rundurable import MANAGE, child_env

N = 300


def test_an_async_only_queue_counts_one_step_thread():
    assert registry.async_only("aio")
    assert not registry.async_only("default")  # sync machines run there
    assert not registry.async_only("nobody-uses-this")  # unknown: counted as sync
    need = connection_need({"aio": N, "default": 4})
    assert need["per process"]["step threads"] == registry.ASYNC_QUEUE_THREADS + 4


def test_a_sync_row_on_an_async_only_queue_still_runs(engine):
    """A sync machine's row sent to the async queue with queue= runs on its one thread."""
    from tests.durable_app.durable import noop

    ids = [gd.insert(noop, args={}, queue="aio") for _ in range(3)] + [gd.insert(AsyncSleeper, queue="aio")]
    sup = engine({"aio": 50})
    from tests.conftest import wait_until

    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 4, what="all done")
    assert sup.schedulers["aio"].max_threads == 1


@pytest.mark.django_db(transaction=True)
def test_300_async_steps_run_at_once_within_a_100_connection_server():
    with connection.cursor() as cur:
        cur.execute("SHOW max_connections")
        limit = int(cur.fetchone()[0])
    if limit > 100:
        pytest.skip(f"the server allows {limit} connections; this test proves the budget at 100")
    ids = gd.insert_all([gd.Spec(AsyncOnlyQueueSleeper, state={"sleep": 1}) for _ in range(N)])
    proc = subprocess.run(MANAGE + ["rundurable", "--burst", "--queue", f"aio={N}", "--no-gc", "--no-reaper"],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "E031" not in proc.stderr and "needs up to" in proc.stderr
    need = int(proc.stderr.split("needs up to ", 1)[1].split()[0])
    assert need < 20, proc.stderr[-2000:]  # one step thread, not 300
    rows = list(Instance.objects.filter(id__in=ids).values_list("status", "result"))
    assert [s for s, _ in rows] == ["done"] * N
    # All of them were awaiting at one instant: the latest start precedes the earliest end.
    began = max(r["began"] for _, r in rows)
    ended = min(r["ended"] for _, r in rows)
    assert began < ended
