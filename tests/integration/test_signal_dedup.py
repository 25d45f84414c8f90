"""A dedup key delivered to an instance stays delivered for its whole life, consumed
or not, across signal names, and a deduplicated delivery wakes nothing
(docs/design.md#signals)."""

import pytest

import gen_durable as gd
from gen_durable.models import Instance, Signal
from gen_durable.testing import assert_awaiting, drain

pytestmark = pytest.mark.django_db


class Checkout(gd.Machine):
    """Awaits `pay`; a wrong amount awaits `pay` again; the right one moves on to a
    step that awaits `pay` once more (a second instalment)."""

    name = "tests.dedup.Checkout"

    @gd.step
    def start(self, ctx):
        return gd.Await("pay", next="check")

    @gd.step
    def check(self, ctx):
        paid = sum(s.payload["amount"] for s in ctx.awaited)
        if paid < 10:
            return gd.Await("pay", next="check")
        return gd.Next("second_instalment", state={"paid": paid})

    @gd.step
    def second_instalment(self, ctx):
        return gd.Await("pay", next="done")

    @gd.step
    def done(self, ctx):
        return gd.Done({"runs": [s.payload for s in ctx.awaited]})


class Payment(gd.Machine):
    name = "tests.dedup.Payment"

    @gd.step
    def start(self, ctx):
        return gd.Await("payment_confirmed", next="finish", timeout=3600)

    @gd.step
    def finish(self, ctx):
        return gd.Done({"confirmed": bool(ctx.awaited)})


def test_a_key_delivered_under_another_name_wakes_nothing():
    id_ = gd.insert(Payment)
    drain()
    with pytest.warns(gd.UnawaitedSignalWarning, match=r"await only 'payment_confirmed'"):
        assert gd.signal(id_, "other", dedup_key="k1") is not None
    assert gd.signal(id_, "payment_confirmed", dedup_key="k1") is None
    assert drain()["steps"] == 0  # not woken: it would conclude "timed out"
    assert_awaiting(id_, ["payment_confirmed"])
    assert gd.signal(id_, "payment_confirmed", dedup_key="k2") is not None
    drain()
    assert Instance.objects.get(id=id_).result == {"confirmed": True}


def test_a_redelivery_never_wakes_a_machine_that_awaits_the_same_name_again():
    id_ = gd.insert(Checkout)
    drain()
    assert gd.signal(id_, "pay", {"amount": 3}, dedup_key="evt-1") is not None
    drain()  # wrong amount: awaits pay again
    assert_awaiting(id_, ["pay"])
    assert gd.signal(id_, "pay", {"amount": 3}, dedup_key="evt-1") is None  # the provider redelivers
    assert drain()["steps"] == 0
    assert_awaiting(id_, ["pay"])


def test_a_consumed_key_stays_delivered_for_the_instance_s_life():
    id_ = gd.insert(Checkout)
    drain()
    assert gd.signal(id_, "pay", {"amount": 10}, dedup_key="evt-1") is not None
    drain()  # consumed; the machine moved on and awaits pay again
    assert_awaiting(id_, ["pay"])
    assert not Signal.objects.filter(target_id=id_).exists()
    assert gd.signal(id_, "pay", {"amount": 10}, dedup_key="evt-1") is None
    assert not Signal.objects.filter(target_id=id_).exists()  # nothing stored
    assert drain()["steps"] == 0
    assert gd.signal(id_, "pay", {"amount": 5}, dedup_key="evt-2") is not None
    drain()
    assert Instance.objects.get(id=id_).result == {"runs": [{"amount": 5}]}


def test_dedup_keys_are_per_instance_and_go_with_the_instance():
    from django.db import connection

    a, b = gd.insert(Checkout), gd.insert(Checkout)
    drain()
    assert gd.signal(a, "pay", {"amount": 1}, dedup_key="same") is not None
    assert gd.signal(b, "pay", {"amount": 1}, dedup_key="same") is not None
    Instance.objects.filter(id=a).delete()  # as GC deletes terminal rows
    with connection.cursor() as cur:
        cur.execute("SELECT target_id FROM gen_durable_signal_dedup WHERE dedup_key = 'same'")
        assert [r[0] for r in cur.fetchall()] == [b]
