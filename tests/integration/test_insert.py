"""insert / insert_all against real Postgres (docs/guide.md, docs/design.md#identity)."""

import datetime as dt
import json
import uuid
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.utils import timezone

import gen_durable as gd
from gen_durable.models import Instance
from tests.durable_app.durable import Counter, Plain, noop

pytestmark = pytest.mark.django_db


def db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def test_insert_creates_a_runnable_row_with_defaults():
    id_ = gd.insert(Counter, state={"target": 3})
    row = Instance.objects.get(id=id_)
    assert (row.status, row.step, row.attempt, row.queue, row.priority, row.weight) == \
        ("runnable", "start", 0, "default", 0, 1.0)
    assert row.fsm == "tests.Counter" and row.fsm_version == 1
    assert row.state == {"target": 3}
    assert row.correlation_scope == ["runnable", "executing", "awaiting_signal", "awaiting_children"]
    with connection.cursor() as cur:
        cur.execute("SELECT jsonb_typeof(state), eligible_at <= now() FROM gen_durable WHERE id = %s", [id_])
        assert cur.fetchone() == ("object", True)


def test_insert_is_one_statement(django_assert_num_queries):
    with django_assert_num_queries(1):
        gd.insert(Plain)


def test_insert_all_of_1000_is_one_statement(django_assert_num_queries):
    specs = [gd.Spec(Plain, state={"i": i}) for i in range(1000)]
    with django_assert_num_queries(1):
        ids = gd.insert_all(specs)
    assert len(ids) == 1000 and None not in ids
    assert Instance.objects.filter(id__in=ids).count() == 1000


def test_insert_all_empty_sends_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert gd.insert_all([]) == []


def test_queue_defaults_from_the_machine_and_can_be_overridden():
    class Mailer(gd.Machine):
        queue = "mail"

        @gd.step
        def start(self, ctx):
            return gd.Done()

    a = gd.insert(Mailer)
    b = gd.insert(Mailer, queue="other")
    assert Instance.objects.get(id=a).queue == "mail"
    assert Instance.objects.get(id=b).queue == "other"


def test_job_args_alias_and_name_lookup():
    id_ = gd.insert(noop, args={"x": 1})
    id2 = gd.insert("tests.noop", args={"x": 2})
    assert Instance.objects.get(id=id_).state == {"x": 1}
    assert Instance.objects.get(id=id2).step == "perform"


def test_scheduling_precedence_eligible_at_then_schedule_at_then_schedule_in():
    base = timezone.now().replace(microsecond=0)
    e, s = base + dt.timedelta(hours=3), base + dt.timedelta(hours=2)
    a = gd.insert(Plain, eligible_at=e, schedule_at=s, schedule_in=60)
    b = gd.insert(Plain, schedule_at=s, schedule_in=60)
    assert Instance.objects.get(id=a).eligible_at == e
    assert Instance.objects.get(id=b).eligible_at == s


def test_schedule_in_is_computed_on_the_database_clock():
    # Ask the database for its clock inside the same transaction: now() is the
    # transaction start, so eligible_at must be exactly now() + 90 s.
    with transaction.atomic():
        now = db_now()
        id_ = gd.insert(Plain, schedule_in=dt.timedelta(seconds=90))
        eligible = Instance.objects.get(id=id_).eligible_at
    assert eligible - now == dt.timedelta(seconds=90)


def test_priority_and_weight_and_keys_are_stored(settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"api": {"allowed": 10, "period": 1}}}
    id_ = gd.insert(Plain, priority=-5, concurrency_key=("gate", 7), rate_limit=("api", "t1"), weight=2.5)
    row = Instance.objects.get(id=id_)
    assert (row.priority, row.concurrency_key, row.rate_limit, row.weight) == (-5, "gate:7", "api:t1", 2.5)
    with connection.cursor() as cur:
        cur.execute("SELECT concurrency_name FROM gen_durable WHERE id = %s", [id_])
        assert cur.fetchone()[0] == "gate"


def test_duplicate_correlation_key_raises_naming_the_holder_and_writes_nothing():
    holder = gd.insert(Plain, correlation_key="order:1")
    with pytest.raises(gd.DuplicateInstance) as err:
        gd.insert(Plain, correlation_key="order:1")
    assert (err.value.correlation_key, err.value.existing_id) == ("order:1", holder)
    assert str(err.value) == f"an instance with correlation_key 'order:1' is already live (instance {holder})"
    assert Instance.objects.filter(correlation_key="order:1").count() == 1


def test_key_is_freed_when_the_holder_terminates_with_the_default_scope():
    id_ = gd.insert(Plain, correlation_key="k-free")
    Instance.objects.filter(id=id_).update(status="done")
    gd.insert(Plain, correlation_key="k-free")
    assert Instance.objects.filter(correlation_key="k-free").count() == 2


def test_terminal_statuses_in_scope_reserve_the_key():
    scope = ["runnable", "executing", "awaiting_signal", "awaiting_children", "done", "failed"]
    id_ = gd.insert(Plain, correlation_key="k-res", correlation_scope=scope)
    Instance.objects.filter(id=id_).update(status="done")
    with pytest.raises(gd.DuplicateInstance):
        gd.insert(Plain, correlation_key="k-res")


def test_empty_scope_never_dedups_and_null_key_never_conflicts():
    gd.insert(Plain, correlation_key="k-empty", correlation_scope=[])
    gd.insert(Plain, correlation_key="k-empty", correlation_scope=[])
    gd.insert(Plain)
    gd.insert(Plain)
    assert Instance.objects.filter(correlation_key="k-empty").count() == 2


def test_guard_follows_status_out_of_scope():
    id_ = gd.insert(Plain, correlation_key="k-guard", correlation_scope=["runnable"])
    Instance.objects.filter(id=id_).update(status="executing")
    gd.insert(Plain, correlation_key="k-guard")  # executing is not in scope: key free


def test_insert_all_dedups_in_batch_and_against_live_rows_in_input_order():
    existing = gd.insert(Plain, correlation_key="k7")
    ids = gd.insert_all([
        gd.Spec(Plain, correlation_key="k7"),
        gd.Spec(Plain, correlation_key="k8"),
        gd.Spec(Plain, correlation_key="k8"),
        gd.Spec(Plain),
        gd.Spec(Plain, correlation_key="k9", correlation_scope=[]),
        gd.Spec(Plain, correlation_key="k9", correlation_scope=[]),
    ])
    assert ids[0] is None and ids[2] is None
    assert all(isinstance(i, int) for i in (ids[1], ids[3], ids[4], ids[5]))
    assert existing not in ids
    rows = {r.id: r for r in Instance.objects.filter(id__in=[i for i in ids if i])}
    assert rows[ids[1]].correlation_key == "k8"
    assert rows[ids[3]].correlation_key is None
    assert ids[4] < ids[5]


def test_insert_all_inserts_in_key_order():
    ids = gd.insert_all([gd.Spec(Plain, correlation_key="b"), gd.Spec(Plain, correlation_key="a")])
    assert ids[1] < ids[0]


def test_insert_all_has_no_parameter_ceiling():
    specs = [gd.Spec(Plain, correlation_key=f"big-{i}") for i in range(6000)]
    ids = gd.insert_all(specs)
    assert len(set(ids)) == 6000
    with connection.cursor() as cur:
        cur.execute("SELECT correlation_scope::text[] FROM gen_durable WHERE id = %s", [ids[0]])
        assert cur.fetchone()[0] == ["runnable", "executing", "awaiting_signal", "awaiting_children"]


def test_insert_inside_a_rolled_back_atomic_leaves_no_row():
    before = Instance.objects.count()
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            gd.insert(Plain, correlation_key="rolled-back")
            raise RuntimeError("roll back")
    assert Instance.objects.count() == before
    gd.insert(Plain, correlation_key="rolled-back")  # the key was never taken


@pytest.mark.parametrize("kwargs, message", [
    ({"queue": ""}, "queue"),
    ({"queue": "  "}, "queue"),
    ({"priority": 40000}, "priority"),
    ({"priority": 1.5}, "priority"),
    ({"schedule_in": -1}, "schedule_in"),
    ({"schedule_in": float("nan")}, "schedule_in"),
    ({"schedule_at": dt.datetime(2030, 1, 1)}, "timezone-aware"),
    ({"eligible_at": "tomorrow"}, "eligible_at"),
    ({"weight": 0}, "weight"),
    ({"correlation_scope": ["live"]}, "correlation_scope"),
    ({"step": "nope"}, "no step"),
    ({"concurrency_key": ("a", "b", "c")}, "concurrency_key"),
])
def test_bad_input_gets_a_specific_error_and_writes_nothing(kwargs, message):
    before = Instance.objects.count()
    with pytest.raises(gd.InvalidInput, match=message):
        gd.insert(Plain, **kwargs)
    assert Instance.objects.count() == before


def test_unknown_machine_name_is_a_lookup_error():
    with pytest.raises(gd.UnknownMachine, match="nope.Machine"):
        gd.insert("nope.Machine")
    with pytest.raises(gd.InvalidInput):
        gd.insert(object)


def test_non_json_and_oversized_state_fail_at_insert(settings):
    with pytest.raises(gd.SerializationError, match="not JSON"):
        gd.insert(Plain, state={"x": object()})
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "MAX_PAYLOAD_BYTES": 1000}
    with pytest.raises(gd.SerializationError, match="1000-byte limit"):
        gd.insert(Plain, state={"blob": "x" * 2000})


def test_state_with_datetime_decimal_uuid_round_trips_as_django_json():
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=dt.timezone.utc)
    uid = uuid.uuid4()
    id_ = gd.insert(Plain, state={"when": when, "amount": Decimal("10.50"), "id": uid, "nested": [[1, 2], {"a": [3]}]})
    state = Instance.objects.get(id=id_).state
    assert state == {"when": "2026-01-02T03:04:05.123Z", "amount": "10.50", "id": str(uid), "nested": [[1, 2], {"a": [3]}]}


@pytest.mark.django_db(transaction=True)
def test_async_twins():
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    async def main():
        try:
            return await gd.ainsert(Plain, state={"a": 1}), await gd.ainsert_all([gd.Spec(Plain), gd.Spec(Plain)])
        finally:
            await sync_to_async(connections.close_all)()

    id_, ids = asyncio.run(main())
    assert Instance.objects.get(id=id_).state == {"a": 1}
    assert Instance.objects.filter(id__in=ids).count() == 2


def test_insert_all_stores_each_rows_values_whether_a_column_varies_or_repeats(settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"rl": {"allowed": 10, "period": 1}}}
    # A column whose rows all hold one value travels as that value, a varying one as an
    # array (db.batch_column): both must land on every row as given.
    at = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc)
    varied = [
        gd.Spec(Plain, state={"i": 0}, queue="qa", priority=3, eligible_at=at, concurrency_key="c0",
                rate_limit="rl", weight=2, correlation_key="v0", correlation_scope=["runnable"]),
        gd.Spec(Plain, state={"i": 1}, queue="qb", priority=-1, schedule_in=3600, rate_limit="rl", weight=1.5),
        gd.Spec(noop, args={"i": 2}, queue="qa", priority=3, concurrency_key=("c", 7),
                correlation_key="v2"),
    ]
    same = [gd.Spec(Plain, state={"i": i}, queue="qs", priority=7, eligible_at=at) for i in range(3)]
    with transaction.atomic():  # now() is the transaction's start: schedule_in lands exactly
        now = db_now()
        ids = gd.insert_all(varied + same)
    rows = {r.id: r for r in Instance.objects.filter(id__in=ids)}
    got = [rows[i] for i in ids]
    assert [r.state for r in got] == [{"i": 0}, {"i": 1}, {"i": 2}, {"i": 0}, {"i": 1}, {"i": 2}]
    assert [r.fsm for r in got] == ["tests.Plain", "tests.Plain", "tests.noop"] + ["tests.Plain"] * 3
    assert [r.queue for r in got] == ["qa", "qb", "qa", "qs", "qs", "qs"]
    assert [r.priority for r in got] == [3, -1, 3, 7, 7, 7]
    assert [r.concurrency_key for r in got] == ["c0", None, "c:7", None, None, None]
    assert [r.weight for r in got] == [2.0, 1.5, 1.0, 1.0, 1.0, 1.0]
    assert [r.correlation_key for r in got] == ["v0", None, "v2", None, None, None]
    assert got[0].eligible_at == at and [r.eligible_at for r in got[3:]] == [at] * 3
    assert got[1].eligible_at - now == dt.timedelta(seconds=3600)
    with connection.cursor() as cur:
        cur.execute("SELECT id, correlation_scope::text[] FROM gen_durable WHERE id = ANY(%s)", [ids[:3]])
        scopes = dict(cur.fetchall())
    assert scopes[ids[0]] == ["runnable"]
    assert scopes[ids[2]] == ["runnable", "executing", "awaiting_signal", "awaiting_children"]


def test_insert_all_maps_ids_to_positions_when_keyed_and_unkeyed_rows_mix():
    # insert_rows sorts a batch with keys into key order (one lock order for racing
    # batches) and maps the ids back: unkeyed rows keep their input order, keyed ones
    # go in key order, a duplicate gets None.
    ids = gd.insert_all([gd.Spec(Plain, state={"p": 0}), gd.Spec(Plain, state={"p": 1}, correlation_key="mix-b"),
                         gd.Spec(Plain, state={"p": 2}), gd.Spec(Plain, state={"p": 3}, correlation_key="mix-a"),
                         gd.Spec(Plain, state={"p": 4}, correlation_key="mix-b")])
    assert ids[4] is None
    states = dict(Instance.objects.filter(id__in=[i for i in ids if i]).values_list("id", "state"))
    assert [states[i]["p"] for i in ids if i] == [0, 1, 2, 3]
    assert ids[3] < ids[1] and ids[0] < ids[2]


def test_insert_all_gives_each_row_the_values_of_its_own_shape():
    # spec_batch keeps one validated Row per distinct shape and, once a second shape
    # turns up, an index per row (the rows before it get the first shape). Interleaved
    # shapes, an unhashable-free mix of machines, queues, priorities, a shape built
    # whole (a datetime is never reused) and per-row states and keys must land as given.
    at = dt.datetime(2031, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
    specs = [gd.Spec(Plain, state={"p": 0}), gd.Spec(Plain, state={"p": 1}, correlation_key="shape-k1"),
             gd.Spec(noop, args={"p": 2}, queue="q-shape", priority=3),
             gd.Spec(Plain, state={"p": 3}),
             gd.Spec(Counter, state={"p": 4}, eligible_at=at),
             gd.Spec(noop, args={"p": 5}, queue="q-shape", priority=3, correlation_key="shape-k2"),
             gd.Spec(Plain, state={"p": 6}, priority=-2)]
    ids = gd.insert_all(specs)
    rows = {r.id: r for r in Instance.objects.filter(id__in=ids)}
    got = [(rows[i].fsm, rows[i].queue, rows[i].priority, rows[i].state["p"], rows[i].correlation_key)
           for i in ids]
    assert got == [("tests.Plain", "default", 0, 0, None), ("tests.Plain", "default", 0, 1, "shape-k1"),
                   ("tests.noop", "q-shape", 3, 2, None), ("tests.Plain", "default", 0, 3, None),
                   ("tests.Counter", "default", 0, 4, None), ("tests.noop", "q-shape", 3, 5, "shape-k2"),
                   ("tests.Plain", "default", -2, 6, None)]
    assert rows[ids[4]].eligible_at == at


@pytest.mark.parametrize("first, second, message", [
    ({"priority": 1}, {"priority": True}, "priority"),
    ({"schedule_in": 5}, {"schedule_in": float("inf")}, "schedule_in"),
    ({"state": {}}, {"state": {"a": 1}, "args": {"b": 2}}, "not both"),
    ({"correlation_key": "ok"}, {"correlation_key": ""}, "correlation_key"),
])
def test_insert_all_validates_every_spec_when_its_shape_repeats(first, second, message):
    # spec_batch validates a repeated shape once: a later spec that merely compares equal
    # (True == 1) or differs only in a per-row value must still be checked.
    before = Instance.objects.count()
    with pytest.raises(gd.InvalidInput, match=message):
        gd.insert_all([gd.Spec(Plain, **first)] * 3 + [gd.Spec(Plain, **second)])
    assert Instance.objects.count() == before


@pytest.mark.parametrize("queues", [("q", "q"), ("qx", "qy")])
def test_insert_all_keeps_both_readings_of_a_repeated_wall_clock_hour(queues):
    # 01:30 on the night New York leaves DST happens twice (fold 0 and 1, an hour
    # apart); the two aware datetimes compare equal in Python. One shape validated
    # once, or one column value sent once, must not make them one instant.
    from zoneinfo import ZoneInfo

    first = dt.datetime(2031, 11, 2, 1, 30, tzinfo=ZoneInfo("America/New_York"))
    second = first.replace(fold=1)
    assert first == second and second - first == dt.timedelta(0)
    ids = gd.insert_all([gd.Spec(Plain, eligible_at=first, queue=queues[0]),
                         gd.Spec(Plain, eligible_at=second, queue=queues[1])])
    stored = [Instance.objects.get(id=i).eligible_at for i in ids]
    assert stored == [first.astimezone(dt.timezone.utc), second.astimezone(dt.timezone.utc)]
    assert stored[1] - stored[0] == dt.timedelta(hours=1)
    assert stored[1] == Instance.objects.get(id=gd.insert(Plain, eligible_at=second)).eligible_at


@pytest.mark.parametrize("machine, kwargs", [
    (Plain, {"state": object(), "concurrency_key": 5}),
    (Plain, {"correlation_key": 5, "weight": 0}),
    ("nope.Machine", {"state": 1, "args": 2}),
    (object, {"state": 1, "args": 2}),
    ((Plain, ("queue", str, "q")), {}),  # not a machine, though shaped like a cached shape's key
])
def test_insert_all_reports_a_faulty_spec_as_insert_does(machine, kwargs):
    # The first spec of each shape gets build_row's checks in build_row's order, so a
    # spec with several faults fails on the same one as insert(), also after good specs
    # (the message then says which item).
    with pytest.raises(Exception) as single:
        gd.insert(machine, **kwargs)
    with pytest.raises(Exception) as batch:
        gd.insert_all([gd.Spec(Plain, queue="q")] * 2 + [gd.Spec(machine, **kwargs)])
    placed = isinstance(single.value, (gd.InvalidInput, gd.SerializationError))
    assert (type(batch.value), str(batch.value)) == (type(single.value),
                                                     ("item 2 of insert_all: " if placed else "") + str(single.value))


def test_insert_all_streams_its_input_rows(monkeypatch):
    # The unnest calls sit in the select list (a ProjectSet streams the rows into the
    # insert); unnest(a, b, …) in FROM is a Function Scan, which stores every row first
    # (spilling to disk for a 100,000-row batch).
    from gen_durable import calls, db

    seen = []
    fetchall = db.fetchall

    def recording(statement, params=None, using=None):
        seen.append((statement, params))
        return fetchall(statement, params, using)

    monkeypatch.setattr(db, "fetchall", recording)
    gd.insert_all([gd.Spec(Plain, state={"p": i}, correlation_key=f"stream-{i}") for i in range(3)])
    statement, params = seen[-1]
    assert statement is calls.sql.INSERT_ALL
    with connection.cursor() as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        raw = cur.fetchone()[0]
    text_plan = raw if isinstance(raw, str) else json.dumps(raw)
    assert '"ProjectSet"' in text_plan and "Function Scan" not in text_plan


@pytest.mark.django_db
def test_a_bad_item_of_insert_all_is_named_by_its_place_and_nothing_is_written():
    specs = [gd.Spec(Plain, state={"n": i}) for i in range(5)]
    specs[3] = gd.Spec(Plain, queue="defualt")
    with pytest.raises(gd.InvalidInput, match=r"^item 3 of insert_all: queue 'defualt' is not declared; "
                                              r"did you mean 'default'\?"):
        gd.insert_all(specs)
    specs[3] = gd.Spec(Plain, state={"when": object()})
    with pytest.raises(gd.SerializationError, match=r"^item 3 of insert_all: "):
        gd.insert_all(specs)
    assert not Instance.objects.exists()


@pytest.mark.django_db
def test_insert_at_a_misspelt_step_names_the_close_one():
    with pytest.raises(gd.InvalidInput, match=r"has no step 'strat'; did you mean 'start'\?; its steps are"):
        gd.insert(Counter, step="strat")
