"""Queue groups on several databases (docs/scaling.md): a second alias, "other", with its
own test database; `rundurable --database ALIAS` serves it, and each database's rows stay
in it."""

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

import gen_durable as gd
from gen_durable.models import Instance
from tests.durable_app.durable import Counter
from tests.integration.test_rundurable import keep_signal_handlers  # noqa: F401  (fixture)

BOTH = ["default", "other"]


@pytest.fixture
def two_databases(transactional_db, django_db_blocker):
    """Committed rows in both databases (pytest-django flushes both after the test)."""
    for alias in BOTH:
        with connections[alias].cursor() as cur:
            cur.execute("TRUNCATE gen_durable, gen_durable_signals RESTART IDENTITY CASCADE")
    yield


pytestmark = pytest.mark.django_db(databases=BOTH, transaction=True)


def test_the_other_alias_is_its_own_database():
    assert connections["other"].settings_dict["NAME"] != connections["default"].settings_dict["NAME"]
    assert connections["other"].settings_dict["NAME"].endswith("_other")


def test_rows_inserted_on_other_stay_there_and_rundurable_database_other_runs_them(
        two_databases, keep_signal_handlers, queue_name):  # noqa: F811
    ids = gd.insert_all([gd.Spec(Counter, state={"target": 2}, queue=queue_name) for _ in range(5)], using="other")
    assert not Instance.objects.using("default").filter(queue=queue_name).exists()
    # A worker on the default database sees none of them: --burst refuses a queue with nothing in it.
    with pytest.raises(CommandError, match="no runnable instance is in it"):
        call_command("rundurable", "--burst", "--queue", f"{queue_name}=2", "--no-gc", verbosity=0)
    assert set(Instance.objects.using("other").filter(id__in=ids).values_list("status", flat=True)) == {"runnable"}

    call_command("rundurable", "--burst", "--database", "other", "--queue", f"{queue_name}=2", "--no-gc",
                 verbosity=0)
    rows = Instance.objects.using("other").filter(id__in=ids)
    assert {(r.status, r.result["count"]) for r in rows} == {("done", 2)}
    assert not Instance.objects.using("default").filter(queue=queue_name).exists()


def test_one_process_serves_both_databases(two_databases, keep_signal_handlers, queue_name, caplog):  # noqa: F811
    ids = {alias: gd.insert_all([gd.Spec(Counter, state={"target": 3}, queue=queue_name) for _ in range(4)],
                                using=alias) for alias in BOTH}
    with caplog.at_level("INFO", "gen_durable"):
        call_command("rundurable", "--burst", "--database", "default", "--database", "other",
                     "--queue", f"{queue_name}=2", "--no-gc", verbosity=1)
    for alias in BOTH:
        rows = Instance.objects.using(alias).filter(queue=queue_name)
        assert sorted(r.id for r in rows) == sorted(ids[alias])  # nothing crossed over
        assert {(r.status, r.result["count"]) for r in rows} == {("done", 3)}
    starts = [r.getMessage() for r in caplog.records if " starting: database " in r.getMessage()]
    assert sorted(m.split(" starting: database ")[1].split(" ")[0] for m in starts) == BOTH
    # Both aliases are on one server here: the budget line counts their connections together.
    budget = next(r.getMessage() for r in caplog.records if "database connections" in r.getMessage())
    assert "[databases default, other, one server]" in budget


def test_the_connection_budget_adds_up_the_databases_of_one_server(two_databases, keep_signal_handlers):  # noqa: F811
    from gen_durable.management.commands.rundurable import Command
    from gen_durable.worker.connections import connection_need, server_limit

    usable = server_limit("default")["usable"]
    fixed = connection_need({"default": 1}, reaper=True, gc=False)["total"] - 1  # all but the step threads
    queues = {"default": usable // 2 + 1 - fixed}  # one database's need fits, two on one server do not
    Command()._check_connection_budget(queues, 1, ["default"], reaper=True, gc=False)
    Command()._check_connection_budget(queues, 1, ["other"], reaper=True, gc=False)
    with pytest.raises(CommandError, match="share one server: their connections add up"):
        Command()._check_connection_budget(queues, 1, ["default", "other"], reaper=True, gc=False)


def test_an_unknown_database_alias_is_refused(keep_signal_handlers):  # noqa: F811
    with pytest.raises(CommandError, match=r"--database 'nope': not in DATABASES"):
        call_command("rundurable", "--burst", "--database", "nope", verbosity=0)


# Routing: GEN_DURABLE["DATABASES"] places a machine or a queue on an alias.

def routes(**sections):
    from django.test import override_settings
    from django.conf import settings

    return override_settings(GEN_DURABLE={**settings.GEN_DURABLE, "DATABASES": sections})


def test_insert_without_using_lands_where_the_queue_or_machine_is_routed(two_databases, queue_name):
    with routes(QUEUES={queue_name: "other"}):
        on_other = gd.insert(Counter, state={"target": 1}, queue=queue_name)
        batch = gd.insert_all([gd.Spec(Counter, state={"target": 1}, queue=queue_name) for _ in range(3)])
        unrouted = gd.insert(Counter, state={"target": 1}, queue=queue_name + "-x")
    assert set(Instance.objects.using("other").values_list("id", flat=True)) == {on_other, *batch}
    assert list(Instance.objects.using("default").values_list("id", flat=True)) == [unrouted]
    # A machine's route wins over its queue's; using= wins over both.
    with routes(MACHINES={"tests.Counter": "other"}, QUEUES={queue_name: "default"}):
        by_machine = gd.insert(Counter, state={"target": 1}, queue=queue_name)
        explicit = gd.insert(Counter, state={"target": 1}, queue=queue_name, using="default")
    assert Instance.objects.using("other").filter(id=by_machine).exists()
    assert Instance.objects.using("default").filter(id=explicit, queue=queue_name).exists()


def test_a_routed_insert_inside_atomic_on_another_alias_warns_that_it_commits_at_once(two_databases, queue_name):
    """Django's transactions are per database: a row routed to "other" from inside
    atomic() on "default" commits at once and survives that block's rollback. The call
    says so (RoutedOutsideTransactionWarning, pointing at the caller's line), and stays
    quiet where the routed alias has its own transaction or nothing is open."""
    import warnings

    from django.db import transaction

    with routes(QUEUES={queue_name: "other"}):
        with pytest.raises(RuntimeError), transaction.atomic():
            with pytest.warns(gd.RoutedOutsideTransactionWarning, match="routes 'tests.Counter' to database 'other'") as seen:
                survivor = gd.insert(Counter, state={"target": 1}, queue=queue_name)
            with pytest.warns(gd.RoutedOutsideTransactionWarning, match="^insert_all: .* open on 'default'"):
                batch = gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(2)])
            with pytest.warns(gd.RoutedOutsideTransactionWarning) as via_class:
                by_class = Counter.insert(queue=queue_name)
            rolled_back = gd.insert(Counter, state={"target": 1}, queue=queue_name, using="default")
            raise RuntimeError("roll the block back")
        # The warning names the caller's line, not gen_durable's.
        assert seen[0].filename == via_class[0].filename == __file__
        # What the warning said: the routed rows committed, the default one rolled back.
        assert set(Instance.objects.using("other").values_list("id", flat=True)) == {survivor, by_class, *batch}
        assert not Instance.objects.using("default").filter(id=rolled_back).exists()

        with warnings.catch_warnings():
            warnings.simplefilter("error", gd.RoutedOutsideTransactionWarning)
            gd.insert(Counter, queue=queue_name)  # no transaction anywhere
            with pytest.raises(RuntimeError), transaction.atomic(), transaction.atomic(using="other"):
                joined = gd.insert(Counter, queue=queue_name)  # the routed alias's own atomic(): joined
                gd.insert_all([gd.Spec(Counter, queue=queue_name)])
                raise RuntimeError("roll both back")
            with transaction.atomic():
                gd.insert(Counter, queue=queue_name, using="other")  # an explicit using= is the caller's choice
    assert not Instance.objects.using("other").filter(id=joined).exists()


def test_insert_all_refuses_a_batch_that_spans_databases(two_databases, queue_name):
    with routes(QUEUES={queue_name: "other"}), pytest.raises(gd.InvalidInput, match="different databases"):
        gd.insert_all([gd.Spec(Counter, queue=queue_name), gd.Spec(Counter, queue=queue_name + "-x")])
    assert not Instance.objects.using("default").exists() and not Instance.objects.using("other").exists()


def test_the_producer_writes_each_database_its_rows(two_databases, queue_name):
    from gen_durable.producer import Producer

    with routes(QUEUES={queue_name: "other"}):
        producer = Producer(max_batch=10, max_delay=0.01)
        for i in range(3):
            producer.insert(Counter, state={"target": 1}, queue=queue_name)
            producer.insert(Counter, state={"target": 1}, queue=queue_name + "-x")
        producer.flush()
        producer.close()
    assert Instance.objects.using("other").filter(queue=queue_name).count() == 3
    assert Instance.objects.using("default").filter(queue=queue_name + "-x").count() == 3
    assert not Instance.objects.using("other").filter(queue=queue_name + "-x").exists()


def test_children_stay_on_the_parents_database_and_a_cross_database_child_is_a_clear_error(
        two_databases, queue_name):
    from gen_durable.testing import drain
    from tests.durable_app.signal_machines import FanOut

    kids = [{"i": 0}, {"i": 1}]
    with routes(QUEUES={queue_name: "other"}):
        # Routed parent, children in the parent's own queue: all on "other", joined there.
        parent = gd.insert(FanOut, state={"kids": kids}, queue=queue_name)
        drain(queue_name, using="other")
        row = Instance.objects.using("other").get(id=parent)
        assert row.status == "done" and row.result["children"] == 2 and row.result["done"] == 2
        assert Instance.objects.using("other").filter(parent_id=parent).count() == 2
        # A parent on default whose children are routed to "other": refused, nothing spawned.
        stray = gd.insert(FanOut, state={"kids": kids, "kid_queue": queue_name}, queue=queue_name + "-p")
        drain(queue_name + "-p", max_steps=20)
    row = Instance.objects.using("default").get(id=stray)
    assert row.status == "failed", (row.status, row.last_error)
    assert "routes to database 'other'" in row.last_error and "parent and its children live" in row.last_error
    assert not Instance.objects.using("default").filter(parent_id=stray).exists()
    # (ids are per database: "other" still holds only the first parent and its two children)
    assert Instance.objects.using("other").count() == 3


def test_the_routes_are_validated_by_system_checks():
    from gen_durable.checks import check_database_routes

    with routes(QUEUES={"q": "nope"}, MACHINES={"tests.Countr": "other", "tests.Counter": 3}, EXTRA={}):
        found = {(m.id, m.msg.split(":")[0]) for m in check_database_routes()}
    assert ("gen_durable.E091", "GEN_DURABLE['DATABASES']['QUEUES']['q'] routes to database 'nope', "
                                "which DATABASES lacks.") in found
    assert ("gen_durable.E090", "GEN_DURABLE['DATABASES'] has an unknown key 'EXTRA'.") in found
    assert ("gen_durable.E090", "GEN_DURABLE['DATABASES']['MACHINES']['tests.Counter'] must map a non-empty "
                                "name to a database alias (a string).") in found
    assert ("gen_durable.W090", "GEN_DURABLE['DATABASES']['MACHINES']['tests.Countr']") in found
    # A queue route no insert can use (inserts refuse an undeclared queue): a typo.
    with routes(QUEUES={"defualt": "other"}):
        [w] = check_database_routes()
    assert (w.id, w.hint) == ("gen_durable.W091", "Did you mean 'default'?")
    assert w.msg.startswith("GEN_DURABLE['DATABASES']['QUEUES']['defualt']: no one declares queue 'defualt'")
    with routes(QUEUES={"default": "other"}, MACHINES={"tests.Counter": "other"}):
        assert check_database_routes() == []  # the negative control: good routes pass


# The Tasks backend per database: OPTIONS["DATABASE"] (tests/settings.py's "other" backend).

def test_a_task_backend_on_other_enqueues_and_reads_there(two_databases, keep_signal_handlers):  # noqa: F811
    from gen_durable.tasks import TaskResultDoesNotExist, enqueue_all
    from tests.durable_app import tasks as t

    on_other = t.add.using(backend="other")
    result = on_other.enqueue(2, 3)
    assert Instance.objects.using("other").filter(id=int(result.id)).exists()
    both = enqueue_all([(on_other, [1, 1], {}), (t.add, [4, 4], {})])  # one statement per database
    assert Instance.objects.using("other").filter(id=int(both[0].id), fsm=t.add.module_path).exists()
    assert Instance.objects.using("default").filter(id=int(both[1].id), fsm=t.add.module_path).exists()
    call_command("rundurable", "--burst", "--database", "other", "--queue", "default=2", "--no-gc", verbosity=0)
    assert on_other.get_result(result.id).return_value == 5
    assert on_other.get_result(both[0].id).return_value == 2
    # default's task is still waiting: the worker served "other" only
    assert Instance.objects.using("default").get(id=int(both[1].id)).status == "runnable"
    with pytest.raises(TaskResultDoesNotExist):
        on_other.get_result(str(10**12))


def test_a_task_enqueued_on_another_database_inside_atomic_warns_that_it_commits_at_once(two_databases):
    """The backend's OPTIONS["DATABASE"] chose "other", not the caller: as for a routed
    gd.insert, an atomic() on default only does not hold the task back, and the caller is
    told. Controls: atomic() on "other" too, or a backend on default, warn of nothing."""
    import warnings

    from django.db import transaction

    from gen_durable.tasks import enqueue_all
    from tests.durable_app import tasks as t

    on_other = t.add.using(backend="other")
    with pytest.raises(RuntimeError), transaction.atomic():
        with pytest.warns(gd.RoutedOutsideTransactionWarning,
                          match=r"enqueue: TASKS\['other'\] puts its tasks on database 'other' "
                                r"\(OPTIONS\['DATABASE'\]\), which has no transaction open") as caught:
            kept = on_other.enqueue(1, 2)
        assert caught[0].filename == __file__
        with pytest.warns(gd.RoutedOutsideTransactionWarning, match=r"^enqueue_all: "):
            enqueue_all([(on_other, [3, 4], {})])
        raise RuntimeError("roll back")
    assert Instance.objects.using("other").filter(id=int(kept.id)).exists()  # what the warning said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with transaction.atomic(), transaction.atomic(using="other"):
            on_other.enqueue(1, 2)
        with transaction.atomic():
            t.add.enqueue(1, 2)


def test_a_task_backend_naming_an_unknown_database_is_e060():
    from django.core.checks import run_checks
    from django.test import override_settings
    from django.conf import settings


    bad = {**settings.TASKS, "other": {**settings.TASKS["other"], "OPTIONS": {"DATABASE": "nope"}}}
    with override_settings(TASKS=bad):
        errors = [e for e in run_checks() if e.id == "gen_durable.E060"]
    assert any("['OPTIONS']['DATABASE'] must be an alias of DATABASES" in e.msg for e in errors), errors


# Cron per database: each schedule fires in the database its machine is routed to.

def test_each_schedule_fires_once_in_its_own_database(two_databases):
    from gen_durable import schedules
    from gen_durable.worker.supervisor import Supervisor, WorkerConfig

    cron = {
        "here": {"cron": "* * * * *", "machine": "tests.Plain", "timezone": "UTC"},
        "there": {"cron": "* * * * *", "machine": "tests.Counter", "timezone": "UTC", "state": {"target": 1}},
    }
    for alias in BOTH:
        with connections[alias].cursor() as cur:
            cur.execute("TRUNCATE gen_durable_schedules")
    from django.conf import settings
    from django.test import override_settings

    with override_settings(GEN_DURABLE={**settings.GEN_DURABLE, "SCHEDULES": cron,
                                        "DATABASES": {"MACHINES": {"tests.Counter": "other"}}}):
        # What a worker on each database takes on (its Timer fires only these).
        per = {alias: Supervisor(WorkerConfig(queues={}, using=alias)).cron for alias in BOTH}
        assert {alias: sorted(c) for alias, c in per.items()} == {"default": ["here"], "other": ["there"]}
        fired = {}
        for alias, mine in per.items():
            schedules.sync(mine, alias)
            with connections[alias].cursor() as cur:
                cur.execute("UPDATE gen_durable_schedules SET next_run_at = date_trunc('minute', now())")
            fired[alias] = schedules.fire_due(mine, alias)
            assert schedules.fire_due(mine, alias) == []  # the same tick does not fire twice
    assert [f[0] for f in fired["default"]] == ["here"] and [f[0] for f in fired["other"]] == ["there"]
    assert list(Instance.objects.using("default").values_list("fsm", flat=True)) == ["tests.Plain"]
    assert list(Instance.objects.using("other").values_list("fsm", flat=True)) == ["tests.Counter"]
    for alias in BOTH:
        with connections[alias].cursor() as cur:
            cur.execute("TRUNCATE gen_durable_schedules")


def test_processes_children_each_serve_every_database(two_databases, queue_name):
    """`--processes 2 --database default --database other`: the children get the aliases
    with the rest of the command line, and drain both databases."""
    import subprocess

    from tests.integration.test_rundurable import MANAGE, ROOT, child_env

    ids = {alias: gd.insert_all([gd.Spec(Counter, state={"target": 2}, queue=queue_name) for _ in range(6)],
                                using=alias) for alias in BOTH}
    env = dict(child_env(), GEN_DURABLE_TEST_OTHER_DB_NAME=connections["other"].settings_dict["NAME"])
    proc = subprocess.run(MANAGE + ["rundurable", "--burst", "--processes", "2", "--database", "default",
                                    "--database", "other", "--queue", f"{queue_name}=2", "--no-gc"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for alias in BOTH:
        rows = Instance.objects.using(alias).filter(id__in=ids[alias], queue=queue_name)
        assert {(r.status, r.result["count"]) for r in rows} == {("done", 2)} and rows.count() == 6
    # 2 processes × 2 databases: four workers started, two on each database
    starts = [line for line in proc.stderr.splitlines() if " starting: database " in line]
    assert sorted(line.split(" starting: database ")[1].split(" ")[0] for line in starts) == [
        "default", "default", "other", "other"]


def test_a_step_signals_within_its_own_database_through_ctx_database(two_databases, queue_name):
    from gen_durable.testing import drain
    from tests.durable_app.multihost_machines import SignalsSibling
    from tests.durable_app.signal_machines import Recorder

    key = f"{queue_name}:waiter"
    waiter = gd.insert(Recorder, state={"names": ["go"]}, queue=queue_name, correlation_key=key, using="other")
    drain(queue_name, using="other")  # parks on "go"
    sender = gd.insert(SignalsSibling, state={"target": key}, queue=queue_name, using="other")
    # The same key in default names nothing: a sender there gets NoTarget, stores nothing.
    lone = gd.insert(SignalsSibling, state={"target": key}, queue=queue_name)
    drain(queue_name, using="other")
    drain(queue_name)
    assert Instance.objects.using("other").get(id=sender).result == {"database": "other", "sent": True}
    assert Instance.objects.using("other").get(id=waiter).status == "done"
    assert Instance.objects.using("default").get(id=lone).result == {"database": "default", "sent": False}


def test_rundurable_names_routed_databases_it_does_not_serve(two_databases, keep_signal_handlers, caplog):  # noqa: F811
    with routes(QUEUES={"elsewhere": "other"}), caplog.at_level("INFO", "gen_durable"):
        call_command("rundurable", "--burst", "--queue", "default=1", "--no-gc", verbosity=1)
        noted = [r.getMessage() for r in caplog.records if "which this host does not serve" in r.getMessage()]
        assert noted == ["GEN_DURABLE['DATABASES'] routes work to other, which this host does not serve "
                         "(serving default); run `rundurable --database ALIAS` for each somewhere"]
        caplog.clear()
        call_command("rundurable", "--burst", "--database", "default", "--database", "other", "--queue", "default=1",
                     "--no-gc", verbosity=1)
        assert not [r for r in caplog.records if "which this host does not serve" in r.getMessage()]


def test_worker_metrics_of_a_process_serving_two_databases_carry_each_databases_queue_gauges(
        two_databases, queue_name):
    """`rundurable --database default --database other --metrics-port`: the queue gauges
    read every served database, each point labelled with its database. On main they read
    the first alias only, so the other database's backlog never showed."""
    from gen_durable import telemetry
    from gen_durable.integrations import prometheus
    from tests.integration.test_prometheus import free_port, scrape, value

    gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(2)], using="default")
    gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(3)], using="other")
    served = prometheus.serve_worker_metrics(free_port(), using=BOTH)
    try:
        telemetry.emit("scheduler.saturation", {"in_flight": 0, "buffer": 0}, {"queue": queue_name})
        samples = scrape(served.url)
    finally:
        served.close()
    assert value(samples, "gen_durable_queue_depth", queue=queue_name, database="default") == 2
    assert value(samples, "gen_durable_queue_depth", queue=queue_name, database="other") == 3
    assert len([s for s in samples["gen_durable_queue_lag_seconds"] if s[0]["queue"] == queue_name]) == 2


def test_rundurable_points_the_opentelemetry_gauges_at_the_databases_it_serves(
        two_databases, keep_signal_handlers, queue_name):  # noqa: F811
    """OPENTELEMETRY's handler is installed at start-up with no database; a worker on
    `--database other` makes it observe the queue gauges there. On main it read
    GEN_DURABLE['DATABASE'] (default), where this queue has no row."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from gen_durable.integrations import otel
    from tests.integration.test_otel import _points

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel.install(traces=False, metrics=True, meter_provider=provider)
    try:
        gd.insert_all([gd.Spec(Counter, state={"target": 1}, queue=queue_name)], using="other")
        call_command("rundurable", "--burst", "--database", "other", "--queue", f"{queue_name}=1", "--no-gc",
                     verbosity=0)
        gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(4)], using="other")  # a backlog there
        depth = {a["queue"]: p.value for a, p in _points(reader)["gen_durable.queue.depth"]}
        # A second run in the same process, on the default database, moves them there.
        gd.insert_all([gd.Spec(Counter, state={"target": 1}, queue=queue_name)], using="default")
        call_command("rundurable", "--burst", "--database", "default", "--queue", f"{queue_name}=1", "--no-gc",
                     verbosity=0)
        gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(2)], using="default")
        again = {a["queue"]: p.value for a, p in _points(reader)["gen_durable.queue.depth"]}
    finally:
        otel.uninstall()
        provider.shutdown()
    assert depth[queue_name] == 4
    assert again[queue_name] == 2


def test_a_locked_database_costs_only_its_own_gauges(two_databases, queue_name, monkeypatch, caplog):
    """A collection reads every served database within GAUGE_BUDGET together: with
    gen_durable locked on `other` (a REINDEX, a migration), the scrape still answers
    with default's gauges and a warning. On main it waited for the lock until the SDK's
    10 s collection timeout failed the whole scrape (HTTP 500: no metric at all)."""
    import psycopg

    from gen_durable import telemetry
    from gen_durable.integrations import otel, prometheus
    from tests.integration.test_prometheus import free_port, scrape, value

    monkeypatch.setattr(otel, "GAUGE_BUDGET", 1.5)
    gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(3)], using="default")
    params = connections["other"].get_connection_params()
    locker = psycopg.connect(**{k: v for k, v in params.items() if k not in ("cursor_factory", "context")})
    served = prometheus.serve_worker_metrics(free_port(), using=BOTH)
    try:
        locker.execute("LOCK TABLE gen_durable IN ACCESS EXCLUSIVE MODE")  # held until the rollback below
        telemetry.emit("scheduler.saturation", {"in_flight": 0, "buffer": 0}, {"queue": queue_name})
        with caplog.at_level("WARNING", "gen_durable"):
            samples = scrape(served.url)
    finally:
        locker.rollback()
        locker.close()
        served.close()
    assert value(samples, "gen_durable_queue_depth", queue=queue_name, database="default") == 3
    assert not [ls for ls, _ in samples.get("gen_durable_queue_depth", []) if ls.get("database") == "other"]
    assert "queue gauges of database 'other'" in caplog.text


def test_a_burst_that_leaves_rows_in_one_database_lets_the_others_finish(
        two_databases, keep_signal_handlers, queue_name, tmp_path, caplog):  # noqa: F811
    """`--burst --database default --database other`: default's queue is paused, so its
    worker stops at its first idle check and exits 3; other's slow jobs still run to the
    end, and the command exits 3. On main the first worker's exit 3 stopped the other
    too, leaving its rows runnable."""
    from tests.durable_app.supervision_machines import Sleeper

    gd.insert_all([gd.Spec(Counter, queue=queue_name) for _ in range(2)], using="default")
    gd.pause_queue(queue_name, using="default")
    log = tmp_path / "runs.log"
    slow = gd.insert_all([gd.Spec(Sleeper, args={"log": str(log), "sleep": 0.5}, queue=queue_name)
                          for _ in range(6)], using="other")
    with caplog.at_level("INFO", "gen_durable"), pytest.raises(CommandError) as raised:
        call_command("rundurable", "--burst", "--database", "default", "--database", "other",
                     "--queue", f"{queue_name}=1", "--no-gc", verbosity=1)
    assert raised.value.returncode == 3
    assert set(Instance.objects.using("other").filter(id__in=slow).values_list("status", flat=True)) == {"done"}
    assert set(Instance.objects.using("default").filter(queue=queue_name).values_list("status", flat=True)) \
        == {"runnable"}
    assert caplog.text.count("stopping (burst mode: done)") == 2, caplog.text[-3000:]


def test_the_stranded_rows_warning_names_the_database_the_worker_serves(
        two_databases, keep_signal_handlers, queue_name, caplog):  # noqa: F811
    """A worker on `--database other` that finds rows in a queue nobody serves points at
    `check --database other`, where W006 lists them (it said `default` whatever it served)."""
    from tests.factories import InstanceFactory

    gd.insert_all([gd.Spec(Counter, state={"target": 1}, queue=queue_name)], using="other")
    InstanceFactory._meta.database = "other"
    try:
        InstanceFactory(fsm="tests.Counter", state={"target": 1}, queue=f"{queue_name}-misspelt")
    finally:
        InstanceFactory._meta.database = "default"
    with caplog.at_level("INFO", "gen_durable"):
        call_command("rundurable", "--burst", "--database", "other", "--queue", f"{queue_name}=1", "--no-gc",
                     verbosity=1)
    warning = next(r.getMessage() for r in caplog.records if "neither this worker nor" in r.getMessage())
    assert f"{queue_name}-misspelt" in warning and "`manage.py check --database other`" in warning


def test_a_worker_serving_only_other_starts_while_default_is_unreachable(two_databases, queue_name):
    """`rundurable --database other` with 'default' down: Django's unapplied-migrations
    note (which always reads 'default') costs a warning line, not the start-up — it
    exited 1 with an OperationalError traceback before — and the rows of 'other' run."""
    import json
    import socket
    import subprocess

    from tests.integration.test_rundurable import MANAGE, ROOT, child_env

    ids = gd.insert_all([gd.Spec(Counter, state={"target": 2}, queue=queue_name) for _ in range(3)], using="other")
    with socket.socket() as s:  # a port nothing listens on: 'default' refuses connections
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = dict(child_env(), GEN_DURABLE_TEST_OTHER_DB_NAME=connections["other"].settings_dict["NAME"],
               GEN_DURABLE_TEST_DB_OVERRIDE=json.dumps({"HOST": "127.0.0.1", "PORT": str(closed)}))
    proc = subprocess.run(MANAGE + ["rundurable", "--burst", "--database", "other", "--queue", f"{queue_name}=2",
                                    "--no-gc"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert ("could not read the migrations applied on database 'default' (connection failed" in proc.stderr
            ), proc.stderr[-3000:]
    rows = Instance.objects.using("other").filter(id__in=ids)
    assert {(r.status, r.result["count"]) for r in rows} == {("done", 2)}


@pytest.mark.parametrize("how", ["max_wait", "sigterm"])
def test_a_burst_whose_second_database_never_comes_up_exits_3(two_databases, queue_name, how, tmp_path):
    """`rundurable --burst --database default --database other` with 'other' refusing
    connections: 'default' is drained, and the command exits 3 (its rows on 'other' never
    ran) once --max-wait has passed, or when SIGTERM stops the wait. Before, --max-wait
    did not bound the wait (it waited for ever) and SIGTERM ended it with 0."""
    import json
    import signal
    import socket
    import subprocess

    from tests.conftest import wait_until
    from tests.integration.test_rundurable import MANAGE, ROOT, child_env

    ids = gd.insert_all([gd.Spec(Counter, state={"target": 1}, queue=queue_name) for _ in range(3)])
    with socket.socket() as s:  # a port nothing listens on: 'other' refuses connections
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = dict(child_env(), GEN_DURABLE_TEST_OTHER_DB_OVERRIDE=json.dumps({"HOST": "127.0.0.1", "PORT": str(closed)}))
    args = MANAGE + ["rundurable", "--burst", "--database", "default", "--database", "other",
                     "--queue", f"{queue_name}=2", "--no-gc"] + (["--max-wait", "3"] if how == "max_wait" else [])
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stderr=out, text=True)
    try:
        if how == "sigterm":
            wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 3 or proc.poll()
                       is not None, timeout=60, what="'default' drained")
            wait_until(lambda: "burst mode: nothing left" in open(log).read() or proc.poll() is not None,
                       timeout=60, what="the burst of 'default' to stop while the wait for 'other' goes on")
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = log.read_text()
    assert proc.returncode == 3, err[-3000:]
    assert {r.status for r in Instance.objects.filter(id__in=ids)} == {"done"}  # 'default' was served
    said = ("is still down after --max-wait 3 s" if how == "max_wait" else "was stopped before it came up")
    assert f"burst mode: database 'other' {said}; its rows were not run (exit status 3)" in err, err[-3000:]


def _result_listeners(alias):
    with connections[alias].cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'gen_durable listener gen_durable_result%%'")
        return cur.fetchone()[0]


def test_await_result_listens_on_each_database_it_waits_on_and_on_none_for_a_settled_row(
        two_databases, queue_name):
    """A settled row is one read: no LISTEN connection. A wait on each database listens on
    that database (the first database's listener hears none of the other's notifications:
    a wait there could only poll). stop_result_watchers() closes them all."""
    from gen_durable.testing import drain, stop_result_watchers
    from tests.conftest import wait_until
    from tests.durable_app.signal_machines import Recorder

    stop_result_watchers()
    done = gd.insert(Counter, state={"target": 1}, queue=queue_name, using="other")
    drain(queue_name, using="other")
    assert gd.await_result(done, timeout=5, using="other").status == "done"
    assert [_result_listeners(a) for a in BOTH] == [0, 0]
    for alias in BOTH:
        parked = gd.insert(Recorder, state={"names": ["go"]}, queue=queue_name, using=alias)
        assert gd.await_result(parked, timeout=0.2, using=alias).status == "busy"  # no worker: it waited
    wait_until(lambda: [_result_listeners(a) for a in BOTH] == [1, 1], what="a listener on each database")
    stop_result_watchers()
    wait_until(lambda: [_result_listeners(a) for a in BOTH] == [0, 0], what="both closed")
