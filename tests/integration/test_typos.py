"""A misspelt name is an error where it is written (docs/guide.md, "Queues" and
"Machines"): each refused call names the close match and writes nothing."""

import pytest
from django.db import connection
from django.test import override_settings

import gen_durable as gd
from gen_durable.models import Instance
from tests.durable_app.durable import Plain

STRICT = {"QUEUES": {"default": 4, "emails": 2}, "RATE_LIMITS": {"api": {"allowed": 10, "period": 1}}}


def table_counts():
    with connection.cursor() as cur:
        cur.execute("SELECT (SELECT count(*) FROM gen_durable), (SELECT count(*) FROM gen_durable_queue_pauses), "
                    "(SELECT count(*) FROM gen_durable_signals)")
        return cur.fetchone()


@pytest.mark.django_db
@override_settings(GEN_DURABLE=STRICT)
def test_an_undeclared_queue_is_refused_naming_the_close_match_and_nothing_is_written():
    before = table_counts()
    with pytest.raises(gd.InvalidInput, match=r"queue 'defualt' is not declared; did you mean 'default'\?"):
        gd.insert(Plain, queue="defualt")
    with pytest.raises(gd.InvalidInput, match="did you mean 'emails'"):
        gd.insert_all([gd.Spec(Plain), gd.Spec(Plain, queue="emials")])   # the whole batch is refused
    with pytest.raises(gd.InvalidInput, match="did you mean 'default'"):
        gd.pause_queue("defualt")
    with pytest.raises(gd.InvalidInput, match="GEN_DURABLE\\['EXTRA_QUEUES'\\]"):
        gd.insert(Plain, queue="nothing-like-it")
    assert table_counts() == before
    # Declared queues pass: QUEUES keys, and a registered machine's own queue.
    assert gd.insert(Plain, queue="emails") and gd.insert(Plain)
    assert gd.pause_queue("emails") is True


@pytest.mark.django_db
def test_extra_queues_declare_queues_other_deployments_serve():
    with override_settings(GEN_DURABLE={**STRICT, "EXTRA_QUEUES": ["reports", "tenant-*"]}):
        assert gd.insert(Plain, queue="reports")
        assert gd.insert(Plain, queue="tenant-42")
        assert gd.pause_queue("tenant-7") is True
        with pytest.raises(gd.InvalidInput, match="did you mean 'reports'"):
            gd.insert(Plain, queue="reprts")
    with override_settings(GEN_DURABLE={**STRICT, "EXTRA_QUEUES": ["*"]}):   # strictness off
        assert gd.insert(Plain, queue="anything")


@override_settings(GEN_DURABLE={**STRICT, "EXTRA_QUEUES": "reports"})
def test_extra_queues_is_validated():
    from gen_durable.checks import check_extra_queues

    assert [e.id for e in check_extra_queues()] == ["gen_durable.E062"]
    with override_settings(GEN_DURABLE={**STRICT, "EXTRA_QUEUES": ["", 3, "emails"]}):
        assert [e.id for e in check_extra_queues()] == ["gen_durable.E062", "gen_durable.E062", "gen_durable.W062"]
    with override_settings(GEN_DURABLE={**STRICT, "EXTRA_QUEUES": ["reports"]}):
        assert check_extra_queues() == []


@pytest.mark.django_db
@override_settings(GEN_DURABLE=STRICT)
def test_an_unconfigured_rate_limit_is_refused_naming_the_close_match_and_nothing_is_written():
    before = table_counts()
    with pytest.raises(gd.InvalidInput, match=r"rate_limit 'apj' is not configured; did you mean 'api'\?"):
        gd.insert(Plain, rate_limit="apj")
    with pytest.raises(gd.InvalidInput, match="rate_limit 'ghost' is not configured"):
        gd.insert_all([gd.Spec(Plain), gd.Spec(Plain, rate_limit=("ghost", "user-1"))])
    with pytest.raises(gd.InvalidInput, match="weight=2 without a rate_limit"):
        gd.insert(Plain, weight=2)
    with pytest.raises(gd.InvalidInput, match="Next weight=3 without a rate_limit"):
        gd.Next("start", weight=3)
    assert table_counts() == before
    assert gd.insert(Plain, rate_limit=("api", "user-1"), weight=2)
    assert gd.Next("start", rate_limit="api", weight=3).weight == 3.0


def test_misspelt_class_options_raise_at_class_definition():
    with pytest.raises(gd.InvalidInput, match=r"J\.max_attempt is not a gen_durable option; did you mean 'max_attempts'"):
        class J(gd.Job):
            name = "tests.typos.J"
            max_attempt = 3

            def perform(self, args):
                return None
    with pytest.raises(gd.InvalidInput, match=r"M\.timout is not a gen_durable option; did you mean 'timeout'"):
        class M(gd.Machine):
            name = "tests.typos.M"
            timout = 1

            @gd.step
            def start(self, ctx):
                return gd.Done()
    with pytest.raises(gd.InvalidInput, match="did you mean 'inline_execution'"):
        class I(gd.Machine):  # noqa: E742
            name = "tests.typos.I"
            inline_executon = True

            @gd.step
            def start(self, ctx):
                return gd.Done()

    class Own(gd.Machine):   # negative control: names of the user's own are left alone
        name = "tests.typos.Own"
        retries_left = 3
        endpoint = "https://example.com"

        @gd.step
        def start(self, ctx):
            return gd.Done()

    assert Own.retries_left == 3


def test_a_machine_timeout_bounds_each_step_without_its_own():
    class Timed(gd.Machine):
        name = "tests.typos.Timed"
        timeout = 5

        @gd.step
        def start(self, ctx):
            return gd.Next("slow")

        @gd.step(timeout=30)
        def slow(self, ctx):
            return gd.Done()

    from gen_durable.worker.executor import step_timeout

    assert (step_timeout(Timed, "start"), step_timeout(Timed, "slow")) == (5.0, 30.0)
    with pytest.raises(gd.InvalidInput, match="Bad.timeout must be a number of seconds > 0"):
        class Bad(gd.Machine):
            name = "tests.typos.Bad"
            timeout = "5"

            @gd.step
            def start(self, ctx):
                return gd.Done()


def test_child_with_using_is_refused_where_it_is_written():
    with pytest.raises(TypeError, match="gd.Child\\(\\) takes no using="):
        gd.Child(Plain, using="other")
    with pytest.raises(TypeError, match="did you mean 'queue'"):
        gd.Child(Plain, queu="default")
    assert isinstance(gd.Child(Plain, state={"a": 1}), gd.Spec)


@pytest.mark.django_db
def test_a_str_target_is_always_a_correlation_key_and_the_error_says_how_to_use_an_id():
    id_ = gd.insert(Plain)
    before = table_counts()
    with pytest.raises(gd.NoTarget, match=rf"a str target is always a correlation key .* pass an int: int\('{id_}'\)"):
        gd.signal(str(id_), "go")
    with pytest.raises(gd.NoTarget, match="pass an int"):
        gd.cancel(str(id_))
    assert table_counts() == before and Instance.objects.get(id=id_).status == "runnable"
    assert gd.signal(id_, "go")                                   # by id: an int
    keyed = gd.insert(Plain, correlation_key="337")
    assert gd.signal("337", "go") and gd.get("337").id == keyed   # a str: the key, even all digits


def test_transaction_left_open_is_exported():
    from gen_durable.exceptions import TransactionLeftOpen

    assert gd.TransactionLeftOpen is TransactionLeftOpen and "TransactionLeftOpen" in gd.__all__


@pytest.mark.django_db
def test_a_job_returning_a_machine_outcome_fails_with_a_specific_error():
    from gen_durable import testing

    id_ = gd.insert(ReturnsNext)
    testing.drain()
    row = Instance.objects.get(id=id_)
    assert row.status == "failed" and row.attempt == 0
    assert "perform returned gd.Next, a Machine step's outcome" in row.last_error
    assert "not JSON serializable" not in row.last_error


class ReturnsNext(gd.Job):
    name = "tests.typos.ReturnsNext"

    def perform(self, args):
        return gd.Next("elsewhere")


@pytest.mark.django_db(transaction=True)
def test_a_signal_its_target_can_never_await_warns_at_the_callers_line_and_is_stored():
    """A typo of a signal name leaves the instance parked until its Await times out: the
    send says so, with the close match, at the caller's line — and stores the signal as
    before. Controls: the right name, and a machine whose names are built at run time
    (Recorder), warn of nothing."""
    import asyncio
    import warnings

    from asgiref.sync import sync_to_async
    from django.db import connections

    from tests.durable_app.durable import Confirms, Recorder

    id_ = gd.insert(Confirms)
    with pytest.warns(gd.UnawaitedSignalWarning, match=r"await only 'confirmed' — did you mean 'confirmed'\?") as caught:
        assert gd.signal(id_, "confirmd") is not None
    assert caught[0].filename == __file__
    assert "gd.signal(..., 'confirmd')" in str(caught[0].message)

    async def twin():  # from a coroutine: at the caller's line, not in asgiref's thread
        try:
            return await gd.asignal(id_, "confirmd", dedup_key="once")
        finally:
            await sync_to_async(connections.close_all)()

    with pytest.warns(gd.UnawaitedSignalWarning, match=r"gd\.asignal") as caught:
        assert asyncio.run(twin()) is not None
    assert caught[0].filename == __file__
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM gen_durable_signals WHERE target_id = %s AND name = 'confirmd'", [id_])
        assert cur.fetchone()[0] == 2  # stored all the same
    dynamic = gd.insert(Recorder, state={"names": ["go"]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gd.signal(id_, "confirmed")
        gd.signal(dynamic, "anything")


@gd.job(name="tests.typos.no_ctx")
def no_ctx(args):
    return None


@pytest.mark.django_db
def test_a_signal_to_a_job_whose_code_takes_no_ctx_warns():
    id_ = gd.insert(no_ctx)
    with pytest.warns(gd.UnawaitedSignalWarning, match=r"never sees signals \(its code takes no ctx\)"):
        gd.signal(id_, "go")
