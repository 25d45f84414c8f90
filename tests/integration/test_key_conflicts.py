"""An outcome whose move would take a correlation key another row holds waits for the key
(worker/flusher.py `_unstorable`, docs/guide.md "Outcomes"); on main it failed the
instance with "outcome could not be stored" and the work was lost."""

import threading

import pytest

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until

GO = threading.Event()


class RetriesOnce(gd.Machine):
    """First attempt: waits until the test has inserted the key's other holder, then Retry."""

    name = "tests.keyconflict.RetriesOnce"

    @gd.step
    def start(self, ctx):
        if ctx.attempt == 0:
            GO.wait(20)
            return gd.Retry()
        return gd.Done({"attempt": ctx.attempt})


@pytest.mark.django_db(transaction=True)
def test_a_retry_into_a_key_another_row_holds_waits_instead_of_failing(engine, queue_name, events, clean_tables):
    GO.clear()
    # The key is reserved while runnable only: while A executes, B may take it.
    a = gd.insert(RetriesOnce, queue=queue_name, correlation_key="k", correlation_scope=["runnable"])
    engine({queue_name: 2})
    wait_until(lambda: Instance.objects.get(id=a).status == "executing", what="A running")
    b = gd.insert(RetriesOnce, queue=queue_name + "-unserved", correlation_key="k", correlation_scope=["runnable"])
    GO.set()  # A's Retry would move it back to runnable: key 'k' is B's now
    wait_until(lambda: sum(1 for e, _, m in events if e == "flush.key_conflict" and m["id"] == a) >= 2,
               timeout=20, what="A's outcome deferred twice")
    row = Instance.objects.get(id=a)
    assert (row.status, row.last_error) == ("executing", None)  # waiting, not failed
    Instance.objects.filter(id=b).update(status="done")  # B leaves the key's scope
    wait_until(lambda: Instance.objects.get(id=a).status == "done", timeout=20, what="A done")
    row = Instance.objects.get(id=a)
    assert row.result == {"attempt": 1} and row.last_error is None


class Tally(gd.Machine):
    """Re-awaits "pay" after each wake; records the signal ids each wake was handed."""

    name = "tests.keyconflict.Tally"

    @gd.step
    def start(self, ctx):
        return gd.Await("pay", next="woken", consume=ctx.state["consume"], state={**ctx.state, "seen": []})

    @gd.step
    def woken(self, ctx):
        seen = ctx.state["seen"] + [[s.id for s in ctx.awaited]]
        nxt = gd.Await("pay", next="woken", consume=ctx.state["consume"], state={**ctx.state, "seen": seen})
        return gd.Done({"seen": seen}) if len(seen) == 2 else nxt


@pytest.mark.django_db
@pytest.mark.parametrize("consume", [True, False])
def test_await_consume_says_whether_a_re_await_is_handed_the_same_signals_again(consume):
    from gen_durable.testing import drain

    i = gd.insert(Tally, state={"consume": consume})
    drain()
    first = gd.signal(i, "pay", {"n": 1})
    drain()
    second = gd.signal(i, "pay", {"n": 2})
    drain()
    seen = Instance.objects.get(id=i).result["seen"]
    # consume=False (the default, the negative control): the first payment is handed twice.
    assert seen == ([[first], [second]] if consume else [[first], [first, second]])


def test_await_consume_must_be_a_bool():
    with pytest.raises(gd.InvalidInput, match="consume must be True or False"):
        gd.Await("pay", next="x", consume="yes")
