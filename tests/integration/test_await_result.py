"""await_result and get (docs/guide.md)."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import sync_to_async
from django.db import connection

import gen_durable as gd
from gen_durable.testing import drain
from gen_durable.worker.maintenance import gc
from tests.durable_app.durable import Plain
from tests.durable_app.signal_machines import FanOut, Recorder, StopOnWake


@pytest.mark.django_db
def test_an_unknown_id_is_not_found():
    # answered from the first read: with an hour's timeout, waiting would hang the test
    result = gd.await_result(10**12, timeout=3600)
    assert result.status == "not_found" and result.snapshot is None and not result.ok


@pytest.mark.django_db(transaction=True)  # the row is committed, as a worker needs it to be
def test_a_runnable_row_is_busy_at_the_deadline_with_a_snapshot(queue_name):
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    result = gd.await_result(id_, timeout=0.05)
    assert result.status == "busy"
    snap = result.snapshot
    assert (snap.id, snap.status, snap.step, snap.attempt) == (id_, "runnable", "start", 0)
    assert result.result is None and result.error is None


@pytest.mark.django_db(transaction=True)
def test_a_parked_row_is_awaiting_unless_until_terminal(queue_name):
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    drain(queue_name)
    result = gd.await_result(id_, timeout=5)
    assert result.status == "awaiting"
    assert (result.snapshot.status, result.snapshot.step, result.snapshot.awaits) == ("awaiting_signal", "woke", ["go"])
    assert gd.await_result(id_, timeout=0.05, until="terminal").status == "busy"
    # awaiting children is parked too
    parent = gd.insert(FanOut, queue=queue_name, state={"kid_queue": f"{queue_name}-idle", "kids": [{"i": 0}]})
    drain(queue_name)
    assert gd.await_result(parent, timeout=5).snapshot.status == "awaiting_children"
    assert gd.await_result(parent, timeout=5).status == "awaiting"
    # the retry protocol: once the signal lands and the step runs, the same call answers done
    gd.signal(id_, "go", {"v": 1})
    drain(queue_name)
    done = gd.await_result(id_, timeout=5, until="terminal")
    assert done.status == "done" and done.ok
    assert [s["payload"] for s in done.result["awaited"]] == [{"v": 1}]


@pytest.mark.django_db(transaction=True)
def test_awaiting_inside_the_transaction_that_inserted_the_row_raises_at_once(queue_name):
    """No worker can see an uncommitted row: the wait could only time out (an atomic view)."""
    from django.db import transaction

    before = gd.insert(Plain, queue=queue_name)  # committed
    with transaction.atomic():
        id_ = gd.insert(Plain, queue=queue_name)
        # Raised, not a "busy" answer at the end of the 30 s timeout.
        with pytest.raises(gd.UncommittedInstance, match=f"await_result\\({id_}\\) inside the transaction"):
            gd.await_result(id_, timeout=30)
        # a row this transaction did not write is awaited as usual, transaction or not
        assert gd.await_result(before, timeout=0.05).status == "busy"
    assert gd.await_result(id_, timeout=0.05).status == "busy"  # committed: the usual answer
    # A nested atomic() (a savepoint: ATOMIC_REQUESTS and an atomic block in the view) too.
    with transaction.atomic():
        gd.insert(Plain, queue=queue_name)
        with transaction.atomic():
            nested = gd.insert(Plain, queue=queue_name)
        with pytest.raises(gd.UncommittedInstance):
            gd.await_result(nested, timeout=30)
        with transaction.atomic():
            with pytest.raises(gd.UncommittedInstance):
                gd.await_result(nested, timeout=30)  # from inside another savepoint


@pytest.mark.django_db
def test_done_and_failed_carry_the_result_and_the_error(queue_name):
    ok = gd.insert(Plain, queue=queue_name)
    bad = gd.insert(StopOnWake, queue=queue_name)
    drain(queue_name)
    gd.signal(bad, "go")
    drain(queue_name)
    done = gd.await_result(ok, timeout=5)
    assert (done.status, done.result, done.error, done.snapshot.status) == ("done", {}, None, "done")
    failed = gd.await_result(bad, timeout=5)
    assert (failed.status, failed.result, failed.error) == ("failed", None, "stopped on wake")
    assert failed.snapshot.step == "woke"


@pytest.mark.django_db
def test_a_row_deleted_by_gc_is_not_found(queue_name):
    id_ = gd.insert(Plain, queue=queue_name)
    drain(queue_name)
    assert gd.await_result(id_, timeout=5).status == "done"
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET updated_at = now() - interval '2 days' WHERE id = %s", [id_])
    gc(retention=86400, batch=100)
    assert gd.await_result(id_, timeout=5).status == "not_found"


def test_await_result_answers_when_the_engine_completes_the_row(engine, queue_name):
    engine({queue_name: 2}, reaper=False, gc=False)
    id_ = gd.insert(Plain, queue=queue_name)
    result = gd.await_result(id_, timeout=10)
    assert result.status == "done" and result.result == {}


def test_the_async_twin_answers_inside_an_event_loop(engine, queue_name):
    engine({queue_name: 2}, reaper=False, gc=False)

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))  # aawait_result's thread, observable
        id_ = await gd.ainsert(Plain, queue=queue_name)
        await sync_to_async(lambda: connection.close())()  # ainsert's (thread-sensitive) thread
        result = await gd.aawait_result(id_, timeout=10)
        left_open = await loop.run_in_executor(None, lambda: connection.connection is not None)
        return id_, result, left_open

    id_, result, left_open = asyncio.run(main())
    assert result.status == "done" and result.snapshot.id == id_
    assert not left_open  # the executor thread released its connection (CONN_MAX_AGE=0)


def test_await_result_sees_a_signal_wake_through_to_done(engine, queue_name):
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    engine({queue_name: 2}, reaper=False, gc=False)
    assert gd.await_result(id_, timeout=10).status == "awaiting"
    gd.signal(id_, "go", {"v": 3})
    result = gd.await_result(id_, timeout=10, until="terminal")
    assert result.status == "done" and result.result["awaited"][0]["payload"] == {"v": 3}


# --- get ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_get_by_id_and_by_key_and_none_for_unknown(queue_name):
    key = f"g-{queue_name}"
    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]}, correlation_key=key, priority=3)
    by_id, by_key = gd.get(id_), gd.get(key)
    assert by_id == by_key
    assert (by_id.id, by_id.fsm, by_id.status, by_id.step, by_id.state, by_id.queue, by_id.priority,
            by_id.correlation_key) == (id_, Recorder.name, "runnable", "start", {"names": ["go"]},
                                       queue_name, 3, key)
    assert gd.get(id_ + 1000) is None
    assert gd.get(f"nope-{queue_name}") is None
    with pytest.raises(gd.InvalidInput):
        gd.get(1.5)


@pytest.mark.django_db
def test_an_id_passed_as_a_str_that_finds_nothing_warns_at_the_callers_line(queue_name):
    """"27" from a URL is a correlation key, which no instance has: get and await_result
    find nothing, and say why. Controls: the int finds it; a key that is not digits, or a
    digits key an instance holds, warns of nothing."""
    import warnings

    id_ = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]})
    held = gd.insert(Recorder, queue=queue_name, state={"names": ["go"]}, correlation_key=f"{id_}0")
    with pytest.warns(gd.IdAsKeyWarning, match=rf"pass an int: int\('{id_}'\)") as caught:
        assert gd.get(str(id_)) is None
    assert caught[0].filename == __file__
    with pytest.warns(gd.IdAsKeyWarning, match=r"gd\.await_result") as caught:
        assert gd.await_result(str(id_), timeout=0).status == "not_found"
    assert caught[0].filename == __file__

    async def twins():  # from a coroutine, the thread they read in holds no line of the caller's
        return await gd.aget(str(id_)), await gd.aawait_result(str(id_), timeout=0)

    with pytest.warns(gd.IdAsKeyWarning) as caught:
        got = asyncio.run(twins())
    assert got[0] is None and got[1].status == "not_found"
    assert [w.filename for w in caught] == [__file__, __file__]
    assert "gd.aget(" in str(caught[0].message) and "gd.aawait_result(" in str(caught[1].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gd.get(id_).id == id_
        assert gd.get(f"nope-{queue_name}") is None
        assert gd.get(f"{id_}0").id == held
        assert gd.get("²") is None  # a digit, but not one int() reads: no advice to call it
