"""A unique-conflict of one row in a batch statement affects that row alone: with a
correlation key reserved in some live statuses only, the statements that move many rows
into such a status (pick, reap, release, reclaim, await expiry) leave the colliding row
waiting and move its neighbours (docs/design.md#isolation)."""

import threading

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import drain
from gen_durable.worker import claims, maintenance
from tests.durable_app.durable import Plain
from tests.helpers import ConnectionThread


def test_two_rows_of_a_key_reserved_only_while_executing_never_fail_the_pick(committed, queue_name):
    a, b = (gd.insert(Plain, queue=queue_name, correlation_key="k", correlation_scope=["executing"])
            for _ in range(2))
    others = gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(20)])
    claimed = {j.id for j in claims.pick(queue_name, 50, "w", 60)}
    assert set(others) <= claimed  # the neighbours are claimed…
    assert len(claimed & {a, b}) == 1  # …and one row of the key; the other waits
    assert Instance.objects.get(id=({a, b} - claimed).pop()).status == "runnable"
    # While the key is executing, a second pick leaves the other row waiting.
    assert claims.pick(queue_name, 50, "w2", 60) == []
    Instance.objects.filter(id__in=claimed).update(status="done", locked_by=None)
    assert [j.id for j in claims.pick(queue_name, 50, "w3", 60)] == [({a, b} - claimed).pop()]


def test_drain_runs_every_row_of_a_key_reserved_only_while_executing(committed, queue_name):
    ids = [gd.insert(Plain, queue=queue_name, correlation_key="k", correlation_scope=["executing"])
           for _ in range(3)]
    ids += gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(10)])
    drain(queue_name)
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}


def _guarded_while_runnable(queue, n=1):
    """Rows of key "k" reserved while runnable, now executing for a dead worker (lease
    lapsed), and then a new runnable row that took the key meanwhile."""
    ids = []
    for _ in range(n):
        ids.append(gd.insert(Plain, queue=queue, correlation_key="k", correlation_scope=["runnable"]))
        claims.pick(queue, 1, "dead-worker", -1)
    holder = gd.insert(Plain, queue=queue, correlation_key="k", correlation_scope=["runnable"])
    return ids, holder


def test_the_reaper_after_kill_9_moves_the_neighbours_and_leaves_the_colliding_row(committed, queue_name):
    (stuck,), holder = _guarded_while_runnable(queue_name)
    others = gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(10)])
    claims.pick(queue_name, 50, "dead-worker", -1)  # the holder is claimed too: free it again
    Instance.objects.filter(id=holder).update(status="runnable", locked_by=None, lease_expires_at=None)
    reaped = set(maintenance.reap())
    assert set(others) <= reaped and stuck not in reaped
    assert Instance.objects.get(id=stuck).status == "executing"  # waits for the key
    # Once the holder runs (leaves the runnable scope), the next reap returns it.
    claims.pick(queue_name, 50, "w", 60)
    assert stuck in maintenance.reap()


def test_two_colliding_rows_in_one_reap_batch_move_one_at_a_time(committed, queue_name):
    ids = []
    for _ in range(2):  # both executing for a dead worker, both reserving "k" while runnable
        ids.append(gd.insert(Plain, queue=queue_name, correlation_key="k", correlation_scope=["runnable"]))
        claims.pick(queue_name, 1, "dead-worker", -1)
    assert maintenance.reap() == [min(ids)]


def test_release_and_await_expiry_skip_the_colliding_row(committed, queue_name):
    (stuck,), holder = _guarded_while_runnable(queue_name)
    other = gd.insert(Plain, queue=queue_name)
    mine = claims.pick(queue_name, 50, "w", 60)
    assert {j.id for j in mine} == {other, holder}
    Instance.objects.filter(id=stuck).update(locked_by="w")
    Instance.objects.filter(id=holder).update(status="runnable", locked_by=None)  # holds "k" again
    assert set(claims.release(Instance.objects.filter(id__in=[stuck, other]), "w")) == {other}
    again = gd.insert(Plain, queue=queue_name)
    claims.pick(queue_name, 50, "w", 60)
    Instance.objects.filter(id=holder).update(status="runnable", locked_by=None)
    assert set(claims.abandon([stuck, again], "w", 5.0)) == {again}  # shutdown hand-back too
    with connection.cursor() as cur:  # park the stuck row with a lapsed await deadline
        cur.execute("UPDATE gen_durable SET status = 'awaiting_signal', awaits = '{go}', locked_by = NULL, "
                    "await_deadline = now() - interval '1 second' WHERE id = %s", [stuck])
    assert stuck not in maintenance.expire_awaits()
    assert Instance.objects.get(id=stuck).status == "awaiting_signal"


@pytest.mark.parametrize("round_", range(3))
def test_racing_pickers_claim_one_row_per_key_and_neither_fails(committed, queue_name, round_):
    keys = [f"k{i}" for i in range(8)]
    for key in keys:
        for _ in range(2):
            gd.insert(Plain, queue=queue_name, correlation_key=key, correlation_scope=["executing"])
    barrier = threading.Barrier(2)

    def picker(worker):
        def run():
            barrier.wait(10)
            got = []
            for _ in range(10):
                got += [j.id for j in claims.pick(queue_name, 3, worker, 60)]
            return got
        return run

    threads = [ConnectionThread(picker(f"w{i}")) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join_result()  # raises what a pick raised
    executing = Instance.objects.filter(queue=queue_name, status="executing")
    assert sorted(executing.values_list("correlation_key", flat=True)) == keys
