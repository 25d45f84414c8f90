"""Bad input gets a specific error and loses nothing (docs/design.md#reliability-bars): values Postgres cannot
store, exits raised by steps, and a poisoned outcome inside a group-commit batch."""

import enum

import pytest
from django.db import transaction

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import assert_failed, drain
from gen_durable.worker.claims import pick
from gen_durable.worker.executor import execute
from gen_durable.worker.flusher import Flusher

pytestmark = pytest.mark.django_db


class NulState(gd.Machine):
    name = "tests.bad.NulState"

    @gd.step
    def start(self, ctx):
        return gd.Next("start", state={"s": "bad\x00byte"})


class Exits(gd.Machine):
    name = "tests.bad.Exits"

    @gd.step
    def start(self, ctx):
        raise SystemExit(3)


class Ok(gd.Machine):
    name = "tests.bad.Ok"

    @gd.step
    def start(self, ctx):
        return gd.Next("second")

    @gd.step
    def second(self, ctx):
        return gd.Done({"ok": True})


class P(enum.IntEnum):
    HIGH = -1


def test_a_nul_in_a_steps_state_reaches_handle_and_fails_the_instance():
    id_ = gd.insert(NulState)
    assert drain()["stop"] == 1
    assert_failed(id_, "NUL")


def test_system_exit_in_a_step_goes_to_handle_instead_of_looping_on_the_lease():
    id_ = gd.insert(Exits)
    drain()
    row = assert_failed(id_, "SystemExit")
    assert row["attempt"] == 0


def test_one_unstorable_outcome_does_not_hold_back_its_batch(queue_name):
    ids = [gd.insert(Ok, queue=queue_name) for _ in range(3)]
    jobs = pick(queue_name, 10, "w", 60)
    entries = [execute(j) for j in jobs]
    bad = next(e for e in entries if e.id == ids[1])
    bad.kind, bad.delay = "retry", 1e300  # now() + 1e300 s: "interval out of range" in Postgres
    Flusher()._flush([(e, None) for e in entries])
    rows = {r.id: r for r in Instance.objects.filter(id__in=ids)}
    assert rows[ids[0]].status == rows[ids[2]].status == "runnable"
    assert rows[ids[0]].step == "second"
    assert rows[ids[1]].status == "failed"
    assert rows[ids[1]].last_error.startswith("outcome could not be stored")


def test_int_enum_priority_works_in_insert_all_too():
    ids = gd.insert_all([gd.Spec(Ok, priority=P.HIGH), gd.Spec(Ok)])
    assert Instance.objects.get(id=ids[0]).priority == -1


@pytest.mark.parametrize("call", [
    lambda: gd.insert(Ok, correlation_key="k\x00"),
    lambda: gd.insert(Ok, queue="q\x00"),
    lambda: gd.insert(Ok, correlation_key="\ud800"),
    lambda: gd.signal("k", "go\x00"),
    lambda: gd.signal("k", "go", dedup_key="d\x00"),
    lambda: gd.signal(2**63, "go"),
    lambda: gd.get(2**70),
    lambda: gd.insert(Ok, schedule_in=10**400),
    lambda: gd.Await("a\x00", next="x"),
])
def test_unstorable_names_keys_and_ids_are_input_errors(call):
    with pytest.raises(gd.InvalidInput):
        call()


def test_unstorable_state_and_payloads_are_serialization_errors():
    for value in ({"s": "a\x00b"}, {"s": "\ud800"}, {"a\x00": 1}):
        with pytest.raises(gd.SerializationError):
            gd.insert(Ok, state=value)
    id_ = gd.insert(Ok)
    with pytest.raises(gd.SerializationError):
        gd.signal(id_, "go", {"s": "x\x00"})
    # A literal backslash-u0000 text is fine: only a real NUL is refused.
    ok = gd.insert(Ok, state={"s": "\\u0000"})
    assert Instance.objects.get(id=ok).state == {"s": "\\u0000"}


def test_cancel_reason_none_reads_cancelled():
    id_ = gd.insert(Ok)
    gd.cancel(id_, None)
    assert Instance.objects.get(id=id_).last_error == "cancelled"


@pytest.mark.django_db
def test_calls_on_a_database_without_the_migrations_say_to_run_migrate():
    """On main: a raw ProgrammingError ('relation "gen_durable" does not exist')."""
    from django.db import connection

    with connection.cursor() as cur:  # a schema without our tables, for this transaction only
        cur.execute("CREATE SCHEMA gd_unmigrated; SET LOCAL search_path TO gd_unmigrated")
    with pytest.raises(gd.NotMigrated, match=r"run `python manage.py migrate gen_durable --database default`") as info:
        with transaction.atomic():  # a savepoint: the failed statement leaves the test's transaction usable
            gd.insert(Ok)
    assert info.value.alias == "default" and "gen_durable" in str(info.value.__cause__)


@pytest.mark.django_db
def test_insert_refuses_a_set_or_a_non_dict_state_of_an_untyped_machine():
    with pytest.raises(gd.SerializationError, match="a set does not round-trip"):
        gd.insert(Ok, state={"tags": {"a", "b"}})
    with pytest.raises(gd.SerializationError, match="must be a dict"):
        gd.insert(Ok, state=["a", "b"])
    with pytest.raises(gd.SerializationError, match="must be a dict"):
        gd.insert_all([gd.Spec(Ok, state={}), gd.Spec(Ok, state=7)])
    assert not Instance.objects.filter(fsm=Ok.name).exists()
