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
