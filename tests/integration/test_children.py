"""Children: fan-out, the join barrier, failure visibility, dedup, nesting, GC and
cancel (docs/guide.md, docs/design.md#children)."""

import threading
from collections import Counter

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable import sql, telemetry
from gen_durable.models import Instance, Signal
from gen_durable.testing import assert_done, assert_failed, drain
from gen_durable.worker import flusher
from gen_durable.worker.claims import pick
from gen_durable.worker.executor import execute
from gen_durable.worker.maintenance import gc, reap
from tests.conftest import wait_until
from tests.helpers import ConnectionThread, PausingDb
from tests.durable_app.signal_machines import (
    JOIN_RUNS,
    AwaitThenSpawn,
    FanOut,
    Kid,
    Nested,
    TwoRounds,
)


@pytest.fixture(autouse=True)
def _fresh_join_counts():
    """Ids restart after a RESTART IDENTITY elsewhere in the session: count per test."""
    JOIN_RUNS.clear()


def row(id_):
    return Instance.objects.get(id=id_)


def children_of(id_):
    return list(Instance.objects.filter(parent_id=id_).order_by("id"))


def ran_and_waiting(parent):
    """The two children of `parent` as (the one that ran, the one still runnable).

    Siblings share priority and eligible_at, so which one a pick takes first is the
    plan's choice; tests must not assume it is the lower id."""
    kids = children_of(parent)
    done = [k for k in kids if row(k.id).status == "done"]
    assert len(done) == 1, [row(k.id).status for k in kids]
    return done[0], next(k for k in kids if k.id != done[0].id)


def run_one(queue, worker="w-test", limit=1):
    """Claim and run up to `limit` rows of `queue`, flushing each; return the flush results."""
    return [flusher.flush([execute(job)]) for job in pick(queue, limit, worker, 30)]


def test_a_fan_out_of_1000_children_joins_exactly_once(engine, queue_name):
    parent = gd.insert(FanOut, queue=queue_name, state={"kids": [{"i": i} for i in range(1000)]})
    engine({queue_name: 4}, reaper=False, gc=False)
    wait_until(lambda: row(parent).status == "done", timeout=120, what="the parent to join")
    result = row(parent).result
    assert JOIN_RUNS[parent] == 1
    kids = children_of(parent)
    assert (result["children"], result["done"], result["failed"]) == (1000, 1000, 0)
    assert result["ids"] == [k.id for k in kids]
    assert Counter(k.status for k in kids) == {"done": 1000}
    assert row(parent).children_pending == 0


@pytest.mark.django_db
def test_the_join_barrier_counts_each_terminal_child_once(queue_name):
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": i} for i in range(4)]})
    run_one(queue_name)
    assert row(parent).children_pending == 4
    run_one(kids_q)  # one child done
    r = row(parent)
    assert (r.status, r.children_pending) == ("awaiting_children", 3)
    # two siblings terminal in one flush: one aggregated decrement
    entries = [execute(job) for job in pick(kids_q, 2, "w-pair", 30)]
    result = flusher.flush(entries)
    assert len(result.committed) == 2
    r = row(parent)
    assert (r.status, r.children_pending) == ("awaiting_children", 1)
    [last] = run_one(kids_q)
    assert queue_name in last.woken  # the join woke the parent's queue
    r = row(parent)
    assert (r.status, r.step, r.children_pending) == ("runnable", "join", 0)
    drain(queue_name)
    assert row(parent).result["done"] == 4 and JOIN_RUNS[parent] == 1


@pytest.mark.django_db
def test_a_failed_child_is_visible_to_the_parent_not_propagated(queue_name):
    parent = gd.insert(FanOut, queue=queue_name, state={"kids": [{"i": 0}, {"i": 1, "fail": True}]})
    drain(queue_name)
    assert_done(parent, {"children": 2, "done": 1, "failed": 1, "errors": ["kid 1 failed"],
                         "ids": [k.id for k in children_of(parent)]})
    assert JOIN_RUNS[parent] == 1


@pytest.mark.django_db
def test_zero_children_proceeds_at_once(queue_name):
    parent = gd.insert(FanOut, queue=queue_name, state={"kids": []})
    [result] = run_one(queue_name)
    assert result.committed == {parent: "runnable"}  # never parked on an empty barrier
    r = row(parent)
    assert (r.status, r.step, r.children_pending) == ("runnable", "join", 0)
    drain(queue_name)
    assert_done(parent, {"children": 0, "done": 0, "failed": 0, "errors": [], "ids": []})


@pytest.mark.django_db
def test_child_dedup_by_correlation_key_counts_only_landed_children(queue_name):
    kids_q = f"{queue_name}-kids"
    key = f"kid-{queue_name}"
    parent = gd.insert(FanOut, queue=queue_name, state={
        "kid_queue": kids_q, "kids": [{"i": 0, "key": key}, {"i": 1, "key": key}, {"i": 2}]})
    run_one(queue_name)
    r = row(parent)
    assert (r.status, r.children_pending) == ("awaiting_children", 2)
    assert [k.state["i"] for k in children_of(parent)] == [0, 2]
    drain(kids_q)
    drain(queue_name)
    assert row(parent).result["children"] == 2

    # every child deduplicated against a live row → nothing landed → proceeds at once
    held = f"held-{queue_name}"
    gd.insert(Kid, queue=f"{queue_name}-idle", correlation_key=held)
    lone = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 9, "key": held}]})
    [result] = run_one(queue_name)
    assert result.committed == {lone: "runnable"} and children_of(lone) == []


@pytest.mark.django_db
def test_nested_fan_out_joins_each_level(queue_name):
    top = gd.insert(Nested, queue=queue_name)
    drain(queue_name)
    assert_done(top, {"mids": 2, "grandchildren": 5})
    mids = children_of(top)
    assert [len(children_of(m.id)) for m in mids] == [2, 3]
    assert JOIN_RUNS[top] == 1


@pytest.mark.django_db
def test_ctx_children_includes_earlier_rounds(queue_name):
    id_ = gd.insert(TwoRounds, queue=queue_name)
    tally = drain(queue_name)
    assert tally["schedule_children"] == 2
    assert_done(id_, {"first_round": 2, "children": 5, "is": [0, 1, 2, 3, 4]})


@pytest.mark.django_db
def test_a_stale_schedule_children_inserts_no_children_and_consumes_nothing(queue_name):
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(AwaitThenSpawn, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 0}, {"i": 1}]})
    drain(queue_name)
    go = gd.signal(parent, "go")
    [job] = pick(queue_name, 1, "old-worker", 30)
    entry = execute(job)
    assert entry.kind == "schedule" and entry.consumed == (go,)
    Instance.objects.filter(id=parent).update(lease_expires_at=row(parent).lease_expires_at.replace(year=2000))
    assert reap() == [parent]  # the lease expired: the row went back to runnable
    stale = []

    def on_stale(event, measurements, metadata):
        stale.append((event, metadata["id"], metadata["kind"]))

    telemetry.attach("outcome.", on_stale)
    try:
        result = flusher.flush([entry])
    finally:
        telemetry.detach(on_stale)
    assert result.committed == {} and [e.id for e in result.stale] == [parent]
    assert stale == [("outcome.stale", parent, "schedule")]
    assert children_of(parent) == []
    assert list(Signal.objects.filter(target_id=parent).values_list("id", flat=True)) == [go]
    r = row(parent)
    assert (r.status, r.step, r.children_pending, r.attempt) == ("runnable", "spawn", 0, 1)
    drain(queue_name)  # the re-run spawns for real
    drain(kids_q)
    drain(queue_name)
    assert_done(parent, {"children": 2})


@pytest.mark.django_db
def test_gc_spares_terminal_children_of_a_joining_parent(queue_name):
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 0}, {"i": 1}]})
    run_one(queue_name)
    run_one(kids_q)
    first, second = ran_and_waiting(parent)
    assert row(parent).status == "awaiting_children"
    aged = "UPDATE gen_durable SET updated_at = now() - interval '2 days' WHERE id = ANY(%s)"
    with connection.cursor() as cur:
        cur.execute(aged, [[first.id]])
    assert gc(retention=86400, batch=100) == 0
    assert Instance.objects.filter(id=first.id).exists()
    drain(kids_q)
    drain(queue_name)
    assert_done(parent)
    with connection.cursor() as cur:
        cur.execute(aged, [[parent, second.id]])
    assert gc(retention=86400, batch=100) == 3
    assert not Instance.objects.filter(id__in=[parent, first.id, second.id]).exists()


def test_spawn_and_park_are_atomic(transactional_db, queue_name, monkeypatch):
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": i} for i in range(3)]})
    [job] = pick(queue_name, 1, "w-spawn", 30)
    entry = execute(job)
    spawned, release = threading.Event(), threading.Event()

    def after_spawn_park():
        spawned.set()
        assert release.wait(30)

    monkeypatch.setattr(flusher, "db", PausingDb({sql.SPAWN_PARK: after_spawn_park}, after=True))
    a = ConnectionThread(lambda: flusher.flush([entry]))
    a.start()
    assert spawned.wait(30)
    try:
        # Inside A's open transaction the children exist and the parent is parked;
        # from here (another connection) none of it is visible or claimable.
        assert not Instance.objects.filter(parent_id=parent).exists()
        assert not Instance.objects.filter(queue=kids_q).exists()
        assert pick(kids_q, 10, "thief", 30) == []
        assert row(parent).status == "executing"
    finally:
        release.set()
    result = a.join_result()
    assert result.committed == {parent: "awaiting_children"}
    r = row(parent)
    assert (r.status, r.children_pending) == ("awaiting_children", 3)
    assert [k.status for k in children_of(parent)] == ["runnable"] * 3


@pytest.mark.django_db
def test_cancelled_children_count_off_the_parent_and_wake_it_at_zero(queue_name):
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 0}, {"i": 1}]})
    drain(queue_name)
    first, second = children_of(parent)
    assert gd.cancel(first.id, reason="not needed") == first.id
    r = row(parent)
    assert (r.status, r.children_pending) == ("awaiting_children", 1)
    assert_failed(first.id, "not needed")
    with pytest.raises(gd.NoTarget):
        gd.cancel(first.id)  # already terminal
    with pytest.raises(gd.NoTarget):
        gd.cancel(second.id + 1000)
    gd.cancel(second.id, reason="also not needed")
    r = row(parent)
    assert (r.status, r.children_pending) == ("runnable", 0)
    drain(queue_name)
    assert row(parent).result["failed"] == 2
    assert row(parent).result["errors"] == ["also not needed", "not needed"]
    assert JOIN_RUNS[parent] == 1


@pytest.mark.django_db
def test_cancel_by_key_clears_the_inbox(queue_name):
    key = f"c-{queue_name}"
    id_ = gd.insert(AwaitThenSpawn, queue=queue_name, correlation_key=key)
    drain(queue_name)
    gd.signal(key, "noise")
    assert gd.cancel(key, reason="bye") == id_
    assert_failed(id_, "bye")
    assert not Signal.objects.filter(target_id=id_).exists()
    # The names it awaited stay: retry() parks it on them again (docs/guide.md, Calls).
    assert row(id_).awaits == ["go"]


@pytest.mark.django_db
def test_a_terminal_parent_is_left_alone_by_its_childrens_join(queue_name):
    """A cancelled parent's children still finish; counting them off must not rewrite
    the terminal parent (its updated_at is its termination instant for GC)."""
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 0}, {"i": 1}]})
    drain(queue_name)
    gd.cancel(parent, reason="parent gone")
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET updated_at = now() - interval '2 days' WHERE id = %s", [parent])
    before = row(parent)
    run_one(kids_q)  # a child's Done joins through the flush
    first, second = ran_and_waiting(parent)
    gd.cancel(second.id)  # a child's cancel joins through cancel.sql
    after = row(parent)
    assert (after.status, after.children_pending, after.updated_at) == ("failed", 2, before.updated_at)
    assert gc(retention=86400, batch=100) == 1  # the aged parent goes; its fresh children stay
    assert not Instance.objects.filter(id=parent).exists()
    assert [k.parent_id for k in Instance.objects.filter(id__in=[first.id, second.id])] == [None, None]


@pytest.mark.django_db
def test_an_executing_parent_keeps_its_claim_time_while_its_children_join(queue_name):
    """updated_at of an executing row is its claim's time: the admin's "running" column
    and the overview's longest-running step read it. A child's Done (the flush's
    join_parents) and a child's cancel count off the parent without moving it; on main
    both reset it to now(), so a parent running for an hour showed as just started."""
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 0}, {"i": 1}]})
    drain(queue_name)
    with connection.cursor() as cur:  # the parent as a worker holds it, claimed an hour ago
        cur.execute("UPDATE gen_durable SET status = 'executing', locked_by = 'w-parent', "
                    "lease_expires_at = now() + interval '1 minute', updated_at = now() - interval '1 hour' "
                    "WHERE id = %s", [parent])
    claimed_at = row(parent).updated_at
    run_one(kids_q)  # a child's Done joins through the flush
    first, second = ran_and_waiting(parent)
    assert (row(parent).children_pending, row(parent).updated_at) == (1, claimed_at)
    gd.cancel(second.id)  # a child's cancel joins through cancel.sql
    after = row(parent)
    assert (after.status, after.children_pending, after.updated_at) == ("executing", 0, claimed_at)


@pytest.mark.django_db
def test_a_running_steps_late_outcome_after_cancel_is_dropped(queue_name):
    kids_q = f"{queue_name}-kids"
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": kids_q, "kids": [{"i": 0}, {"i": 1}]})
    drain(queue_name)
    [job] = pick(kids_q, 1, "w-late", 30)
    entry = execute(job)  # the step ran; its Done is on its way to the flush
    gd.cancel(job.id, reason="cancelled mid-step")
    assert row(parent).children_pending == 1
    result = flusher.flush([entry])
    assert result.committed == {} and [e.id for e in result.stale] == [job.id]
    r = row(job.id)
    assert (r.status, r.result, r.last_error) == ("failed", None, "cancelled mid-step")
    p = row(parent)  # counted off once, by the cancel — not again by the late Done
    assert (p.status, p.children_pending) == ("awaiting_children", 1)
    drain(kids_q)
    drain(queue_name)
    assert row(parent).result["done"] == 1 and row(parent).result["failed"] == 1
