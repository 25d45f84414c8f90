"""Lock order of the maintenance passes: GC, reaper, cancel and flush in any number of
sessions never deadlock (docs/reliability.md "Deadlocks").

Each hammer runs the real passes in threads (one connection each) over a tree of
terminal parents and children of different ages, and is paired with a negative control:
the same load through the statements main had (GC selecting without locks, a parent
deleted while its children remain) reports `deadlock detected`.
"""

import threading
import time

import pytest
from django.db import connection, connections, transaction
from django.db.utils import OperationalError

import gen_durable as gd
from gen_durable import db as gd_db
from gen_durable.models import Instance
from gen_durable.worker import claims, flusher, maintenance
from gen_durable.worker.executor import Entry
from tests.factories import InstanceFactory, TerminalFactory

RETENTION = 86400.0

# The GC of main, kept here as the negative control: an unlocked, unordered selection,
# then a delete that rewrites the children of every deleted parent (ON DELETE SET NULL).
OLD_GC_SELECT = """
SELECT g.id FROM gen_durable g
WHERE g.status IN ('done', 'failed')
  AND g.updated_at < now() - make_interval(secs => %(retention)s::float8)
  AND NOT EXISTS (SELECT 1 FROM gen_durable p
                  WHERE p.id = g.parent_id AND p.status NOT IN ('done', 'failed'))
LIMIT %(batch)s
"""


def old_gc(retention, batch):
    deleted = 0
    while True:
        ids = [r[0] for r in gd_db.fetchall(OLD_GC_SELECT, {"retention": retention, "batch": batch})]
        if ids:
            deleted += gd_db.execute("DELETE FROM gen_durable WHERE id = ANY (%(ids)s::bigint[]) "
                                     "AND status IN ('done', 'failed')", {"ids": gd_db.pg_array(ids)})
        if len(ids) < batch:
            return deleted


def set_age(pairs):
    """pairs: [(id, seconds ago)] → updated_at = now() - seconds."""
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable g SET updated_at = now() - make_interval(secs => a.secs) "
                    "FROM unnest(%s::bigint[], %s::float8[]) AS a(id, secs) WHERE g.id = a.id",
                    [[i for i, _ in pairs], [float(s) for _, s in pairs]])


def seed_tree(queue, parents=40, children=4, spread=0.0):
    """Terminal parents with terminal children, ages interleaved around each other.

    spread > 0: ages straddle the retention cutoff over `spread` seconds, so rows keep
    aging in while the passes run and each pass's batch differs from the others'.
    """
    ages = []
    for p in range(parents):
        parent = TerminalFactory(queue=queue, status="failed", result=None, last_error="cancelled")
        ages.append((parent.id, RETENTION + 3600 + (p % 7) * 600 if not spread else
                     RETENTION - spread * ((p * 7919) % 100) / 100))
        for c in range(children):
            child = TerminalFactory(queue=queue, parent=parent)
            k = p * children + c
            ages.append((child.id, RETENTION + 600 + (k * 523) % 7200 if not spread else
                         RETENTION - spread * ((k * 104729) % 100) / 100))
    set_age(ages)
    return len(ages)


def gc_until_empty(gc_fn, queue, deadline):
    def run():
        while time.monotonic() < deadline:
            gc_fn()
            if not Instance.objects.filter(queue=queue).exists():
                return
            time.sleep(0.001)
    return run


def hammer(n, fn, timeout=120):
    """Run fn() in n threads released together; return the exceptions they raised."""
    barrier = threading.Barrier(n)
    errors = []

    def run():
        try:
            barrier.wait(timeout=30)
            fn()
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a pass hung"
    return errors


def deadlocks(errors):
    return [e for e in errors if "deadlock detected" in str(e)]


@pytest.mark.parametrize("spread", [0.0, 1.5])
def test_six_gc_passes_at_once_never_deadlock_and_delete_everything(committed, queue_name, spread):
    for _ in range(2):
        seed_tree(queue_name, spread=spread)
        errors = hammer(6, gc_until_empty(lambda: maintenance.gc(RETENTION, 10), queue_name,
                                          time.monotonic() + spread + 20))
        assert errors == []
        assert not Instance.objects.filter(queue=queue_name).exists()


def test_negative_control_two_main_gc_deletes_with_different_batches_deadlock(committed, queue_name):
    """Main's unlocked selection hands two passes different batches when rows age in or
    change between their selects. A deletes parent P1 and Q; B deletes P1's child C and
    Q's parent P2: each statement's ON DELETE SET NULL then waits for a row the other
    holds. A third session holds Q for a moment so both statements are inside at once."""
    p1 = TerminalFactory(queue=queue_name, status="failed", result=None)
    c = TerminalFactory(queue=queue_name, parent=p1)
    p2 = TerminalFactory(queue=queue_name, status="failed", result=None)
    q = TerminalFactory(queue=queue_name, parent=p2)
    delete = "DELETE FROM gen_durable WHERE id = ANY (%(ids)s::bigint[]) AND status IN ('done', 'failed')"
    holder_ready, release = threading.Event(), threading.Event()

    def holder():
        with transaction.atomic():
            gd_db.fetchall("SELECT id FROM gen_durable WHERE id = %(id)s FOR UPDATE", {"id": q.id})
            holder_ready.set()
            release.wait(30)

    def pass_a():
        gd_db.execute(delete, {"ids": gd_db.pg_array([p1.id, q.id])})

    def pass_b():
        time.sleep(0.3)  # A is queued on Q first
        gd_db.execute(delete, {"ids": gd_db.pg_array([c.id, p2.id])})

    def run(fn):
        def body():
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connections.close_all()
        return threading.Thread(target=body)

    errors = []
    h = run(holder)
    h.start()
    assert holder_ready.wait(10)
    threads = [run(pass_a), run(pass_b)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # both statements are waiting on Q
    release.set()
    for t in threads + [h]:
        t.join(60)
    assert deadlocks(errors), errors


def test_gc_leaves_a_parent_whose_child_is_held_elsewhere_for_a_later_sweep(committed, queue_name):
    """Its delete would rewrite the child (SET NULL) and wait on it: GC takes the
    children's locks first, SKIP LOCKED, and keeps the parent when one is busy."""
    from tests.factories import ExecutingFactory

    parent = TerminalFactory(queue=queue_name, status="failed", result=None)
    child = ExecutingFactory(queue=queue_name, parent=parent, locked_by="w")
    other = TerminalFactory(queue=queue_name)
    set_age([(parent.id, RETENTION + 60), (other.id, RETENTION + 60)])
    held, release = threading.Event(), threading.Event()

    def holder():  # a flush of the child, say
        with transaction.atomic():
            gd_db.fetchall("SELECT id FROM gen_durable WHERE id = %(id)s FOR NO KEY UPDATE", {"id": child.id})
            held.set()
            release.wait(30)
        connections.close_all()

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '3s'")  # a waiting pass fails here instead of hanging
        try:
            assert maintenance.gc(RETENTION, 100) == 1
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET lock_timeout")
    finally:
        release.set()
        t.join(30)
    assert sorted(Instance.objects.filter(queue=queue_name).values_list("id", flat=True)) == [parent.id, child.id]
    assert maintenance.gc(RETENTION, 100) == 1  # the child is free now: the parent goes
    assert Instance.objects.get(id=child.id).parent_id is None


def test_gc_skips_rows_another_session_holds_instead_of_waiting(committed, queue_name):
    rows = [TerminalFactory(queue=queue_name).id for _ in range(3)]
    set_age([(i, RETENTION + 60) for i in rows])
    held = threading.Event()
    release = threading.Event()

    def holder():
        with transaction.atomic():
            gd_db.fetchall("SELECT id FROM gen_durable WHERE id = %(id)s FOR KEY SHARE", {"id": rows[0]})
            held.set()
            release.wait(30)
        connections.close_all()

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cur:
            cur.execute("SET lock_timeout = '3s'")  # a waiting pass fails here instead of hanging
        try:
            assert maintenance.gc(RETENTION, 100) == 2
        finally:
            with connection.cursor() as cur:
                cur.execute("RESET lock_timeout")
    finally:
        release.set()
        t.join(30)
    assert maintenance.gc(RETENTION, 100) == 1


@pytest.mark.parametrize("gc_pass, deadlock", [
    (lambda: maintenance.gc(RETENTION, 100), False),
    (lambda: old_gc(RETENTION, 100), True),  # negative control: main's GC
])
def test_gc_of_a_cancelled_parent_while_its_childs_done_flush_counts_it_off(
        committed, queue_name, gc_pass, deadlock):
    """The flush of the child's Done locks the child, then the parent (join_parents);
    main's GC locked the aged parent to delete it, then the child (ON DELETE SET NULL).
    A third session holds the parent for a moment so GC is queued on it first."""
    from tests.factories import ExecutingFactory

    parent = TerminalFactory(queue=queue_name, status="failed", result=None, last_error="cancelled")
    child = ExecutingFactory(queue=queue_name, parent=parent, locked_by="w", fsm="tests.Plain")
    set_age([(parent.id, RETENTION + 3600)])
    errors, held, release = [], threading.Event(), threading.Event()

    def run(fn):
        def body():
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
            finally:
                connections.close_all()
        t = threading.Thread(target=body)
        t.start()
        return t

    def holder():
        with transaction.atomic():
            gd_db.fetchall("SELECT id FROM gen_durable WHERE id = %(id)s FOR SHARE", {"id": parent.id})
            held.set()
            release.wait(30)

    def done_flush():
        time.sleep(0.3)  # GC is queued on the parent first
        flusher.flush([Entry(id=child.id, worker="w", kind="done", result="{}", fsm="tests.Plain",
                             queue=queue_name)])

    threads = [run(holder)]
    assert held.wait(10)
    threads += [run(gc_pass), run(done_flush)]
    time.sleep(1.0)
    release.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    if deadlock:
        assert deadlocks(errors), errors
        return
    assert errors == []
    assert Instance.objects.get(id=child.id).status == "done"
    assert maintenance.gc(RETENTION, 100) == 1  # the aged parent; the fresh child stays
    assert Instance.objects.get(id=child.id).parent_id is None


def test_any_mix_of_gc_reaper_cancel_and_flush_passes_never_deadlocks(committed, queue_name):
    """Eight sessions for three seconds: two GC passes, two reapers, two cancellers and
    two flushers of children's Done outcomes, over live trees (parents joining executing
    children, half of them with lapsed leases) and aged terminal trees."""
    import random

    from tests.factories import ExecutingFactory

    live_parents, children = [], []
    for _ in range(20):
        p = InstanceFactory(queue=queue_name, status="awaiting_children", children_pending=3)
        live_parents.append(p.id)
        for k in range(3):
            c = ExecutingFactory(queue=queue_name, parent=p, locked_by="w", fsm="tests.Plain")
            children.append(c.id)
    with connection.cursor() as cur:  # half the leases lapsed: the reapers take those
        cur.execute("UPDATE gen_durable SET lease_expires_at = now() - interval '1 second' "
                    "WHERE id = ANY(%s) AND id %% 2 = 0", [children])
    seed_tree(queue_name, parents=20, children=3)
    deadline = time.monotonic() + 3

    def loop(fn):
        def run():
            rng = random.Random(threading.get_ident())
            while time.monotonic() < deadline:
                fn(rng)
        return run

    passes = [
        loop(lambda rng: maintenance.gc(RETENTION, 7)),
        loop(lambda rng: maintenance.reap()),
        loop(lambda rng: cancel_if_live(rng.choice(live_parents + children))),
        loop(lambda rng: flusher.flush([Entry(id=i, worker="w", kind="done", result="{}", fsm="tests.Plain",
                                              queue=queue_name) for i in sorted(rng.sample(children, 4))])),
    ]
    barrier = threading.Barrier(8)
    errors = []

    def cancel_if_live(id_):
        try:
            gd.cancel(id_, reason="hammer")
        except gd.NoTarget:  # already terminal (cancelled or done): nothing to do
            pass

    def run(fn):
        try:
            barrier.wait(30)
            fn()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(p,)) for p in passes for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert not Instance.objects.filter(queue=queue_name, children_pending__lt=0).exists()
