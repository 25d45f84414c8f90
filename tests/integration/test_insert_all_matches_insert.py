"""insert_all's column batch (calls.Batch, spec_batch, insert_rows, map_returned,
insert_all.sql's select-list unnest) and its callers (ScheduleChildren in the
flusher, the buffered producer), checked against `gd.insert` row by row.

The oracle throughout: every row insert_all writes must be the row `gd.insert` writes
for the same keywords (run in a savepoint that is rolled back, inside the test's
transaction, so now() — and so a delay's eligible_at — is the same instant), and a
position gets None exactly where the key is taken (by a live row or by an earlier
guarded row of the batch)."""

import datetime as dt
import random
import threading
import time
import uuid
from zoneinfo import ZoneInfo

import pytest
from django.db import OperationalError, connection, transaction

import gen_durable as gd
from gen_durable.models import Instance
from tests.durable_app.durable import Counter, Plain, noop


@pytest.fixture(autouse=True)
def _rate_limit_rl(settings):
    """The shapes name the rate limit "rl": insert refuses an unconfigured one."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"rl": {"allowed": 1000, "period": 1}}}

NY = ZoneInfo("America/New_York")
AT = dt.datetime(2031, 5, 1, 12, 0, tzinfo=dt.timezone.utc)
AT_NY = dt.datetime(2031, 5, 1, 8, 0, tzinfo=NY)  # the same instant as AT, another zone
FOLD0 = dt.datetime(2031, 11, 2, 1, 30, tzinfo=NY)
FOLD1 = FOLD0.replace(fold=1)  # == FOLD0 in Python, an hour later in fact

# Shared keywords (everything but state/args/correlation_key), reusable and not.
SHARED = [
    {}, {"queue": "qa"}, {"queue": "qb", "priority": 5}, {"priority": -3}, {"priority": 0},
    {"queue": None}, {"schedule_in": 30}, {"schedule_in": 30.0}, {"schedule_in": dt.timedelta(seconds=45)},
    {"schedule_in": 0}, {"eligible_at": AT}, {"schedule_at": AT_NY}, {"eligible_at": FOLD0},
    {"eligible_at": FOLD1}, {"schedule_at": AT, "schedule_in": 5},
    {"concurrency_key": "ck"}, {"concurrency_key": ("ck", 1)}, {"concurrency_key": ("ck", 1.0)},
    {"concurrency_key": ("ck", "1")}, {"rate_limit": "rl"}, {"rate_limit": ("rl", "p1")},
    {"rate_limit": ("rl", 2), "weight": 3}, {"rate_limit": "rl", "weight": 2}, {"rate_limit": "rl", "weight": 2.5}, {"weight": 1.0},
    {"correlation_scope": []}, {"correlation_scope": ["done"]}, {"correlation_scope": ["runnable"]},
    {"correlation_scope": ("runnable", "done", "failed")}, {"correlation_scope": ["executing"]},
    {"correlation_scope": ["runnable", "executing", "awaiting_signal", "awaiting_children"]},
    {"priority": 7, "queue": "qa", "concurrency_key": "ck2", "rate_limit": "rl"},
    {"step": "start"}, {"step": None},
]
MACHINES = [Plain, "tests.Plain", Counter, noop, "tests.noop"]
KEYS = [None, None, None, "k0", "k1", "k2", "NULL", 'q"u\\o,te', "{b,r}", "é ü", " ", "k\x1fsep"]

COLS = ("fsm, fsm_version, step, state, queue, priority, eligible_at, concurrency_key, rate_limit, "
        "weight, correlation_key, correlation_scope::text[], status, parent_id")


def fetch_row(id_):
    with connection.cursor() as cur:
        cur.execute(f"SELECT {COLS} FROM gen_durable WHERE id = %s", [id_])
        return cur.fetchone()


def as_insert_writes(spec):
    """The row gd.insert writes for `spec` (inserted in a savepoint, then rolled back)."""
    sid = transaction.savepoint()
    try:
        return fetch_row(gd.insert(spec.machine, **spec.kwargs))
    finally:
        transaction.savepoint_rollback(sid)


def is_guarded(spec):
    key = spec.kwargs.get("correlation_key")
    scope = spec.kwargs.get("correlation_scope")
    return key is not None and (scope is None or "runnable" in [str(s) for s in scope])


def expected_landing(specs, held=()):
    taken, out = set(held), []
    for spec in specs:
        if is_guarded(spec) and spec.kwargs["correlation_key"] in taken:
            out.append(False)
        else:
            out.append(True)
            if is_guarded(spec):
                taken.add(spec.kwargs["correlation_key"])
    return out


def random_specs(rng, n, tag, shapes=None):
    shapes = shapes or [(m, s) for m in MACHINES for s in SHARED
                        if not ("step" in s and s["step"] and m in (noop, "tests.noop"))]
    pool = rng.sample(shapes, min(len(shapes), rng.choice([1, 2, 3, 6, len(shapes)])))
    specs = []
    for p in range(n):
        machine, shared = rng.choice(pool)
        kw = dict(shared)
        if rng.random() < 0.5:
            key = rng.choice(KEYS)
            if key is not None:
                kw["correlation_key"] = f"{tag}:{key}"
        payload = {"p": p, "tag": tag}
        if machine in (noop, "tests.noop") and rng.random() < 0.7:
            kw["args"] = payload
        elif rng.random() < 0.05:
            kw["state"] = payload
            kw["args"] = None
        else:
            kw["state"] = payload
        specs.append(gd.Spec(machine, **kw))
    return specs


def insert_and_check(specs, held=(), arg=None):
    """insert_all(specs): ids in input order, None exactly where expected, each row as
    insert writes it (the oracle rows are taken first, before the batch holds keys)."""
    landing = expected_landing(specs, held)
    wants = [as_insert_writes(s) if ok else None for s, ok in zip(specs, landing)]
    ids = gd.insert_all(specs if arg is None else arg)
    assert len(ids) == len(specs)
    assert [i is not None for i in ids] == landing
    landed = [i for i in ids if i is not None]
    assert len(set(landed)) == len(landed)
    for p, (spec, id_, want) in enumerate(zip(specs, ids, wants)):
        if id_ is not None:
            assert fetch_row(id_) == want, (p, spec)
    return ids


# --- the random oracle ----------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(40))
def test_random_mixed_batches_write_what_insert_writes(seed):
    rng = random.Random(seed)
    tag = f"s{seed}-{uuid.uuid4().hex[:6]}"
    n = rng.choice([1, 2, 3, 5, 17, 60, 200])
    specs = random_specs(rng, n, tag)
    # Some keys already held by live rows.
    held = [f"{tag}:{k}" for k in rng.sample(["k0", "k1", "NULL", "{b,r}"], rng.randint(0, 2))]
    for key in held:
        gd.insert(Plain, correlation_key=key, queue="held")
    before = Instance.objects.count()
    arg = specs if rng.random() < 0.5 else (s for s in specs)  # a generator too
    ids = insert_and_check(specs, held, arg)
    assert Instance.objects.count() == before + sum(i is not None for i in ids)


@pytest.mark.django_db
def test_every_shape_once_then_interleaved_round_robin():
    # Many shapes, each new one turning up late (position > 0) and then alternating.
    tag = uuid.uuid4().hex[:6]
    shapes = [(m, s) for m in (Plain, noop) for s in SHARED if not (s.get("step") and m is noop)]
    specs = []
    for p in range(3 * len(shapes)):
        machine, shared = shapes[(p * 7) % len(shapes)]
        kw = dict(shared, state={"p": p})
        if p % 5 == 0:
            kw["correlation_key"] = f"{tag}:{p % 3}"
        specs.append(gd.Spec(machine, **kw))
    insert_and_check(specs)


@pytest.mark.django_db
def test_one_shape_then_a_second_shape_at_the_last_position():
    # spec_batch back-fills shape 0 for the rows before the second shape turns up.
    specs = [gd.Spec(Plain, state={"p": p}, queue="qa") for p in range(9)] + [gd.Spec(noop, args={"p": 9})]
    insert_and_check(specs)
    specs = [gd.Spec(Plain, state={"p": p}, eligible_at=AT) for p in range(4)] + [gd.Spec(Plain, state={"p": 4})]
    insert_and_check(specs)


@pytest.mark.django_db
def test_only_unreusable_shapes():
    # Datetimes, tuples and lists never reuse a shape: every row is its own shape.
    specs = [gd.Spec(Plain, state={"p": 0}, eligible_at=FOLD0, concurrency_key=("c", 1)),
             gd.Spec(Plain, state={"p": 1}, eligible_at=FOLD1, concurrency_key=("c", 1.0)),
             gd.Spec(Plain, state={"p": 2}, correlation_scope=["done"], correlation_key="uu"),
             gd.Spec(Plain, state={"p": 3}, correlation_scope=["runnable"], correlation_key="uu"),
             gd.Spec(Plain, state={"p": 4}, correlation_scope=["runnable"], correlation_key="uu")]
    ids = insert_and_check(specs)
    assert ids[4] is None and None not in ids[:4]


@pytest.mark.django_db
def test_unhashable_values_of_a_shape_type_are_validated_whole():
    # A str subclass / int subclass is not a shape type; a list machine is unhashable.
    class S(str):
        pass

    class Pri(int):
        pass

    specs = [gd.Spec(Plain, state={"p": 0}, queue=S("qs")), gd.Spec(Plain, state={"p": 1}, queue=S("qs")),
             gd.Spec(Plain, state={"p": 2}, priority=Pri(4)), gd.Spec(Plain, state={"p": 3}, queue="qs")]
    insert_and_check(specs)
    with pytest.raises(gd.InvalidInput) as batch:
        gd.insert_all([gd.Spec(Plain)] + [gd.Spec([Plain], queue="q")])
    with pytest.raises(gd.InvalidInput) as single:
        gd.insert([Plain], queue="q")
    assert str(batch.value) == "item 1 of insert_all: " + str(single.value)


# --- correlation keys -------------------------------------------------------------------

@pytest.mark.django_db
@pytest.mark.parametrize("scopes", [
    (None, None, None),
    ([], None, None),
    (["done"], None, ["runnable"]),
    (None, [], ["runnable", "done"]),
    (["done"], ["failed"], []),
    (("runnable",), None, ("executing",)),
])
def test_one_key_repeated_with_scopes_in_one_batch(scopes):
    key = f"rep-{uuid.uuid4().hex[:6]}"
    specs = []
    for p in range(9):
        scope = scopes[p % 3]
        kw = {"state": {"p": p}, "correlation_key": key}
        if scope is not None:
            kw["correlation_scope"] = scope
        if p % 2:
            kw["queue"] = "odd"
        specs.append(gd.Spec(Plain, **kw))
    insert_and_check(specs)


@pytest.mark.django_db
def test_keys_against_live_rows_and_rows_out_of_scope():
    tag = uuid.uuid4().hex[:6]
    live = gd.insert(Plain, correlation_key=f"{tag}:live")
    gd.insert(Plain, correlation_key=f"{tag}:unguarded", correlation_scope=["done"])
    specs = [gd.Spec(Plain, state={"p": 0}, correlation_key=f"{tag}:live"),
             gd.Spec(Plain, state={"p": 1}, correlation_key=f"{tag}:live", correlation_scope=["done"]),
             gd.Spec(Plain, state={"p": 2}, correlation_key=f"{tag}:unguarded"),
             gd.Spec(Plain, state={"p": 3}, correlation_key=f"{tag}:unguarded", queue="x"),
             gd.Spec(Plain, state={"p": 4}, correlation_key=f"{tag}:live", queue="x")]
    ids = insert_and_check(specs, held=[f"{tag}:live"])
    assert ids[0] is None and ids[4] is None and ids[1] is not None and ids[2] is not None and ids[3] is None
    assert Instance.objects.filter(correlation_key=f"{tag}:live", status="runnable").count() == 2
    assert live not in ids


@pytest.mark.django_db
def test_the_same_key_as_different_machines_and_all_duplicates():
    key = f"dup-{uuid.uuid4().hex[:6]}"
    gd.insert(Plain, correlation_key=key)
    specs = [gd.Spec(m, state={"p": p}, correlation_key=key) for p, m in enumerate([Plain, noop, Counter] * 3)]
    assert gd.insert_all(specs) == [None] * 9
    assert gd.insert_all(specs[:1]) == [None]


# --- bad input anywhere -----------------------------------------------------------------

BAD = [
    (Plain, {"state": object()}),
    (Plain, {"state": {"x": "y" * 1_100_000}}),
    (Plain, {"state": {"a": 1}, "args": {"b": 2}}),
    (Plain, {"state": {"a": "nul\x00"}}),
    (Plain, {"state": {"a": "\ud800"}}),
    (Plain, {"state": {"a": float("nan")}}),
    (Plain, {"state": {"a": float("inf")}}),
    (Plain, {"state": {(1, 2): 3}}),
    (Plain, {"correlation_key": "\ud800"}),
    (Plain, {"queue": "q\x00"}),
    (Plain, {"concurrency_key": "c\x00"}),
    (Plain, {"correlation_key": ""}),
    (Plain, {"correlation_key": 5}),
    (Plain, {"correlation_key": "a\x00b"}),
    (Plain, {"queue": ""}),
    (Plain, {"queue": "qa", "priority": 1 << 20}),
    (Plain, {"priority": True}),
    (Plain, {"schedule_in": -1}),
    (Plain, {"schedule_in": float("nan")}),
    (Plain, {"eligible_at": dt.datetime(2031, 1, 1)}),
    (Plain, {"correlation_scope": "runnable"}),
    (Plain, {"correlation_scope": ["nope"]}),
    (Plain, {"weight": 0}),
    (Plain, {"weight": -1.0}),
    (Plain, {"concurrency_key": ("a",)}),
    (Plain, {"rate_limit": ""}),
    (Plain, {"step": "nope"}),
    ("no.such", {}),
    (noop, {"step": "start"}),
]


@pytest.mark.django_db
@pytest.mark.parametrize("where", ["first", "middle", "last", "after-its-shape"])
@pytest.mark.parametrize("bad", range(len(BAD)))
def test_a_bad_spec_anywhere_raises_what_insert_raises_and_writes_nothing(bad, where):
    machine, kwargs = BAD[bad]
    with pytest.raises(Exception) as single:
        gd.insert(machine, **kwargs)
    good = [gd.Spec(Plain, state={"p": p}, queue="qa" if p % 2 else None, correlation_key=f"g{p}")
            for p in range(6)]
    bad_spec = gd.Spec(machine, **kwargs)
    if where == "first":
        specs = [bad_spec] + good
    elif where == "middle":
        specs = good[:3] + [bad_spec] + good[3:]
    elif where == "last":
        specs = good + [bad_spec]
    else:  # the same shape, valid, comes first: only per-row checks run on the bad one
        ok = dict(kwargs)
        for k in ("state", "args", "correlation_key"):
            ok.pop(k, None)
        sid = transaction.savepoint()
        try:
            gd.insert(machine, **ok)
        except Exception:
            ok = None  # the shape itself is bad
        finally:
            transaction.savepoint_rollback(sid)
        specs = good + ([gd.Spec(machine, **ok)] * 2 if ok is not None else []) + [bad_spec]
    before = Instance.objects.count()
    with pytest.raises(Exception) as batch:
        gd.insert_all(specs)
    # insert()'s error, after the bad item's place in the list (`item 3 of insert_all: `).
    placed = isinstance(single.value, (gd.InvalidInput, gd.SerializationError))
    prefix = f"item {specs.index(bad_spec)} of insert_all: " if placed else ""
    assert (type(batch.value), str(batch.value)) == (type(single.value), prefix + str(single.value))
    assert Instance.objects.count() == before


@pytest.mark.django_db
@pytest.mark.parametrize("where", [0, 2, 5])
def test_using_inside_a_spec_is_refused_anywhere(where):
    specs = [gd.Spec(Plain, state={"p": p}, queue="qa" if p % 2 else "qb") for p in range(5)]
    specs.insert(where, gd.Spec(Plain, using="default", queue="qa"))
    before = Instance.objects.count()
    with pytest.raises(gd.InvalidInput, match="pass using= to insert_all itself"):
        gd.insert_all(specs)
    assert Instance.objects.count() == before


@pytest.mark.django_db
def test_an_unknown_keyword_fails_as_in_insert():
    with pytest.raises(TypeError) as single:
        gd.insert(Plain, queu="qa")
    with pytest.raises(TypeError) as batch:
        gd.insert_all([gd.Spec(Plain), gd.Spec(Plain, queu="qa")])
    assert "queu" in str(batch.value) and "queu" in str(single.value)
    # Raised where the Spec is written, naming it and the keyword meant.
    assert str(batch.value) == "gd.Spec() got an unexpected keyword argument 'queu'; did you mean 'queue'?"


def test_spec_takes_exactly_the_keywords_of_insert():
    import inspect

    from gen_durable.calls import build_row
    from gen_durable.outcomes import INSERT_KEYWORDS

    assert INSERT_KEYWORDS == set(inspect.signature(build_row).parameters) - {"machine"}
    assert INSERT_KEYWORDS == set(inspect.signature(gd.insert).parameters) - {"machine", "using"}
    with pytest.raises(TypeError, match="insert keywords: args, concurrency_key"):
        gd.Child(Plain, xyzzy=1)


@pytest.mark.django_db
def test_a_non_spec_item_and_a_failing_generator_write_nothing():
    before = Instance.objects.count()
    with pytest.raises(gd.InvalidInput, match="item 3"):
        gd.insert_all([gd.Spec(Plain)] * 3 + [(Plain, {})])

    def gen():
        yield gd.Spec(Plain)
        yield gd.Spec(noop, queue="z")
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError):
        gd.insert_all(gen())
    assert Instance.objects.count() == before


@pytest.mark.django_db
def test_empty_inputs_send_nothing(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert gd.insert_all([]) == []
        assert gd.insert_all(()) == []
        assert gd.insert_all(iter([])) == []
        assert gd.insert_all(s for s in []) == []


@pytest.mark.django_db
def test_large_mixed_batch_is_one_statement_and_exact(django_assert_num_queries):
    rng = random.Random(7)
    specs = random_specs(rng, 20000, "big")
    with django_assert_num_queries(1):
        ids = gd.insert_all(specs)
    landing = expected_landing(specs)
    assert [i is not None for i in ids] == landing
    rows = {r[0]: r[1:] for r in _rows_by_id([i for i in ids if i is not None])}
    for p, (spec, id_) in enumerate(zip(specs, ids)):
        if id_ is not None:
            state, queue, key = rows[id_]
            want_queue = spec.kwargs.get("queue") or "default"
            assert (state["p"], queue, key) == (p, want_queue, spec.kwargs.get("correlation_key")), p


def _rows_by_id(ids):
    with connection.cursor() as cur:
        cur.execute("SELECT id, state, queue, correlation_key FROM gen_durable WHERE id = ANY(%s)", [ids])
        return [(i, __import__("json").loads(s) if isinstance(s, str) else s, q, k) for i, s, q, k in cur.fetchall()]


# --- ScheduleChildren: many parents in one flush ------------------------------------------

class BreakSpawner(gd.Machine):
    """Spawns the children described in state['kids'] (insert keywords, JSON-shaped)."""

    name = "tests.break.Spawner"

    @gd.step
    def start(self, ctx):
        kids = []
        for kw in ctx.state["kids"]:
            kw = dict(kw)
            if isinstance(kw.get("concurrency_key"), list):
                kw["concurrency_key"] = tuple(kw["concurrency_key"])
            kids.append(gd.Child(Plain, **kw))
        return gd.ScheduleChildren(next="join", children=kids)

    @gd.step
    def join(self, ctx):
        return gd.Done({"n": len(ctx.children)})


@pytest.mark.django_db
def test_children_of_several_parents_in_one_flush_land_under_their_parent(queue_name):
    from gen_durable.worker import flusher
    from gen_durable.worker.claims import pick
    from gen_durable.worker.executor import execute

    tag = uuid.uuid4().hex[:6]
    kq = f"{queue_name}-kids"
    gd.insert(Plain, queue=f"{queue_name}-held", correlation_key=f"{tag}:held")
    plans = [
        [{"state": {"p": "a0"}, "queue": kq, "correlation_key": f"{tag}:z"},
         {"state": {"p": "a1"}, "queue": kq, "correlation_key": f"{tag}:held"},
         {"state": {"p": "a2"}, "queue": kq, "priority": 4, "concurrency_key": ["c", 1]}],
        [{"state": {"p": "b0"}, "queue": kq, "correlation_key": f"{tag}:z"},  # taken by a0
         {"state": {"p": "b1"}, "queue": kq, "correlation_key": f"{tag}:z", "correlation_scope": []},
         {"state": {"p": "b2"}, "queue": kq, "correlation_key": f"{tag}:a", "schedule_in": 60}],
        [{"state": {"p": "c0"}, "queue": kq, "correlation_key": f"{tag}:a"},  # taken by b2
         {"state": {"p": "c1"}, "queue": kq}],
        [{"state": {"p": "d0"}, "queue": kq, "correlation_key": f"{tag}:held"}],  # none land
    ]
    parents = [gd.insert(BreakSpawner, queue=queue_name, state={"kids": kids}) for kids in plans]
    jobs = pick(queue_name, 10, "w-break", 30)
    assert len(jobs) == 4
    flusher.flush([execute(job) for job in jobs])
    landed = {"a0", "a2", "b1", "b2", "c1"}
    for parent, kids in zip(parents, plans):
        got = {k.state["p"]: k for k in Instance.objects.filter(parent_id=parent)}
        want = {kw["state"]["p"] for kw in kids} & landed
        assert set(got) == want, (parent, set(got), want)
        r = Instance.objects.get(id=parent)
        assert r.children_pending == len(want)
        assert r.status == ("awaiting_children" if want else "runnable")
        for kw in kids:
            if kw["state"]["p"] in got:
                k = got[kw["state"]["p"]]
                assert (k.queue, k.priority, k.correlation_key) == \
                    (kq, kw.get("priority", 0), kw.get("correlation_key"))
                if "concurrency_key" in kw:
                    assert k.concurrency_key == "c:1"


# --- the buffered producer ------------------------------------------------------------

def test_producer_batches_of_mixed_shapes_and_duplicates(committed, queue_name):
    tag = uuid.uuid4().hex[:6]
    gd.insert(Plain, queue=f"{queue_name}-held", correlation_key=f"{tag}:held")
    errors = []
    p = gd.Producer(max_batch=1000, max_delay=60, on_error=lambda e, specs: errors.append((e, specs)))
    try:
        plan = []
        for i in range(40):
            kw = {"state": {"p": i}, "queue": queue_name}
            if i % 4 == 1:
                kw["correlation_key"] = f"{tag}:k{i % 3}"
            if i % 7 == 0:
                kw["correlation_key"] = f"{tag}:held"
            if i % 5 == 2:
                kw["correlation_scope"] = []
                kw["correlation_key"] = f"{tag}:k0"
            if i % 6 == 3:
                kw["priority"] = 9
            if i % 9 == 4:
                kw["eligible_at"] = AT
            plan.append(kw)
            p.insert(Plain if i % 2 else noop, **kw)
        assert p.flush(10)
    finally:
        p.close(10)
    specs = [gd.Spec(Plain if i % 2 else noop, **kw) for i, kw in enumerate(plan)]
    landing = expected_landing(specs, held=[f"{tag}:held"])
    got = {r.state["p"]: r for r in Instance.objects.filter(queue=queue_name)}
    assert set(got) == {i for i, ok in enumerate(landing) if ok}
    dup_ps = sorted(s.kwargs["state"]["p"] for e, ss in errors for s in ss)
    assert all(isinstance(e, gd.DuplicateInstance) for e, _ in errors)
    assert dup_ps == [i for i, ok in enumerate(landing) if not ok]
    for i, r in got.items():
        kw = plan[i]
        assert (r.priority, r.correlation_key) == (kw.get("priority", 0), kw.get("correlation_key"))
        if "eligible_at" in kw:
            assert r.eligible_at == AT
        assert r.correlation_scope == (kw["correlation_scope"] if "correlation_scope" in kw else
                                       ["runnable", "executing", "awaiting_signal", "awaiting_children"])


# --- racing batches --------------------------------------------------------------------

def _race(fn, n=2):
    barrier = threading.Barrier(n, timeout=10)
    results = [None] * n

    def worker(i):
        try:
            results[i] = ("ok", fn(i, barrier))
        except BaseException as exc:
            results[i] = ("error", exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    return results


@pytest.mark.django_db(transaction=True)
def test_racing_mixed_shape_batches_on_the_same_keys_do_not_deadlock(queue_name):
    for round_ in range(4):
        keys = [f"r{round_}:{uuid.uuid4().hex}" for _ in range(150)]

        def run(i, barrier):
            rng = random.Random(i * 100 + round_)
            order = keys[:] if i == 0 else keys[::-1]
            if i >= 2:
                rng.shuffle(order)
            specs = []
            for p, k in enumerate(order):
                shared = rng.choice([{}, {"priority": 3}, {"eligible_at": AT}, {"concurrency_key": ("x", p % 3)},
                                     {"correlation_scope": ["runnable", "done"]}])
                specs.append(gd.Spec(rng.choice([Plain, noop]), state={"p": p, "t": i}, correlation_key=k,
                                     queue=queue_name, **shared))
            with transaction.atomic():
                connection.ensure_connection()
                barrier.wait()
                ids = gd.insert_all(specs)
                time.sleep(0.05)
            return dict(zip(order, ids))

        results = _race(run, n=3)
        errors = [r[1] for r in results if r[0] == "error"]
        assert errors == [], errors
        for k in keys:
            winners = [r[1][k] for r in results if r[1][k] is not None]
            assert len(winners) == 1, (k, winners)
            assert list(Instance.objects.filter(correlation_key=k).values_list("id", flat=True)) == winners


@pytest.mark.django_db(transaction=True)
def test_ainsert_all_maps_like_insert_all(queue_name):
    import asyncio

    tag = uuid.uuid4().hex[:6]
    specs = [gd.Spec(Plain if p % 3 else noop, state={"p": p}, queue=queue_name,
                     correlation_key=f"{tag}:{p % 4}" if p % 2 else None, priority=p % 2)
             for p in range(12)]
    from asgiref.sync import sync_to_async
    from django.db import connections

    async def main():
        try:
            return await gd.ainsert_all(specs)
        finally:  # the sync thread's connection would outlive the test database
            await sync_to_async(connections.close_all)()

    ids = asyncio.run(main())
    assert [i is not None for i in ids] == expected_landing(specs)
    for p, id_ in enumerate(ids):
        if id_ is not None:
            r = Instance.objects.get(id=id_)
            assert (r.state["p"], r.priority, r.correlation_key) == (p, p % 2, specs[p].kwargs["correlation_key"])


@pytest.mark.django_db
@pytest.mark.parametrize("kwargs", [{}, {"correlation_key": "fold"}, {"queue": "qf"}])
def test_both_readings_of_a_wall_clock_hour_alone_in_a_batch(kwargs):
    # The only `at` values of the batch compare equal (fold 0 and 1): one value sent
    # once would make them one instant.
    specs = [gd.Spec(Plain, state={"p": 0}, eligible_at=FOLD0, **kwargs),
             gd.Spec(Plain, state={"p": 1}, eligible_at=FOLD1, **({} if kwargs.get("correlation_key") else kwargs)),
             gd.Spec(Plain, state={"p": 2}, eligible_at=FOLD1, **({} if kwargs.get("correlation_key") else kwargs))]
    ids = insert_and_check(specs)
    assert Instance.objects.get(id=ids[1]).eligible_at - Instance.objects.get(id=ids[0]).eligible_at == \
        dt.timedelta(hours=1)
