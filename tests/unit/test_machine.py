"""Machines, jobs, the registry and backoff (docs/guide.md, docs/design.md#backoff).

Every class defined here registers itself in the process-wide registry, so each test
uses names of its own ("tests.unit.<something>").
"""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

import gen_durable as gd
from gen_durable import machine, registry
from gen_durable.calls import resolve_machine
from gen_durable.machine import Context, jittered
from gen_durable.outcomes import KEEP

ROOT = Path(__file__).resolve().parents[2]


class Greeter(gd.Machine):
    @gd.step
    def start(self, ctx):
        return gd.Done("hello")


class Once(gd.Job):
    def perform(self, args):
        return None


def ctx(state=None, attempt=0, step="perform"):
    return Context(id=1, step=step, state=state if state is not None else {}, attempt=attempt)


# --- names and registration ---------------------------------------------------------------

def test_default_name_is_module_dot_qualname():
    assert Greeter.name == "tests.unit.test_machine.Greeter"
    assert registry.get("tests.unit.test_machine.Greeter", 1) is Greeter


def test_nested_class_default_name_uses_its_qualname():
    class Inner(gd.Machine):
        @gd.step
        def start(self, ctx):
            return gd.Done()

    assert Inner.name == f"{__name__}.{Inner.__qualname__}"
    assert "<locals>.Inner" in Inner.name
    assert registry.get(Inner.name) is Inner


def test_custom_name_registers_under_that_name_only():
    class Custom(gd.Machine):
        name = "tests.unit.custom-greeter"

        @gd.step
        def start(self, ctx):
            return gd.Done()

    assert registry.get("tests.unit.custom-greeter", 1) is Custom
    with pytest.raises(gd.UnknownMachine):
        registry.get(f"{__name__}.{Custom.__qualname__}", 1)


def test_subclass_gets_its_own_default_name_not_its_parents():
    class Base(gd.Machine):
        name = "tests.unit.named-base"

        @gd.step
        def start(self, ctx):
            return gd.Done()

    class Derived(Base):
        pass

    # `name` set on a parent is not inherited: the subclass would otherwise overwrite
    # the parent's registration.
    assert Derived.name == f"{__name__}.{Derived.__qualname__}"
    assert registry.get("tests.unit.named-base") is Base
    assert registry.get(Derived.name) is Derived


def test_abstract_machines_do_not_register():
    before = registry.all_machines()

    class Mixin(gd.Machine):
        abstract = True

    assert registry.all_machines() == before
    assert Mixin.name == ""


def test_versions_coexist_and_latest_is_the_highest():
    class CheckoutV1(gd.Machine):
        name = "tests.unit.checkout"
        version = 1

        @gd.step
        def start(self, ctx):
            return gd.Done("v1")

    class CheckoutV2(gd.Machine):
        name = "tests.unit.checkout"
        version = 2

        @gd.step
        def start(self, ctx):
            return gd.Done("v2")

    assert registry.get("tests.unit.checkout", 1) is CheckoutV1
    assert registry.get("tests.unit.checkout", 2) is CheckoutV2
    assert registry.latest("tests.unit.checkout") is CheckoutV2
    # A name given to insert resolves to the newest version; old rows keep theirs.
    assert resolve_machine("tests.unit.checkout") is CheckoutV2
    with pytest.raises(gd.UnknownMachine, match="version 3"):
        registry.get("tests.unit.checkout", 3)


def test_unknown_machine_names_raise_lookup_errors():
    with pytest.raises(gd.UnknownMachine) as exc:
        registry.get("tests.unit.never-defined", 1)
    assert isinstance(exc.value, LookupError)
    assert (exc.value.name, exc.value.version) == ("tests.unit.never-defined", 1)
    with pytest.raises(gd.UnknownMachine):
        registry.latest("tests.unit.never-defined")


def test_a_second_class_with_the_same_name_and_version_is_improperly_configured():
    class First(gd.Machine):
        name = "tests.unit.clash"

        @gd.step
        def start(self, ctx):
            return gd.Done()

    with pytest.raises(ImproperlyConfigured, match="tests.unit.clash.*defined twice"):
        class Second(gd.Machine):
            name = "tests.unit.clash"

            @gd.step
            def start(self, ctx):
                return gd.Done()

    assert registry.get("tests.unit.clash", 1) is First


def test_redefining_a_class_in_the_same_place_replaces_it():
    # A module reloaded (autoreload, tests) defines the class again at the same place:
    # that is not a clash, and the registry keeps the newest definition.
    def define():
        class Reloaded(gd.Machine):
            name = "tests.unit.reloaded"

            @gd.step
            def start(self, ctx):
                return gd.Done()

        return Reloaded

    old, new = define(), define()
    assert old is not new
    assert registry.get("tests.unit.reloaded", 1) is new


@pytest.mark.parametrize("version", [0, -1, "2", True, 2 ** 31, 202612071230])
def test_version_must_be_a_positive_int(version):
    with pytest.raises(gd.InvalidInput, match="version"):
        type("BadVersion", (gd.Machine,), {"version": version, "start": gd.step(lambda self, ctx: gd.Done())})


@pytest.mark.parametrize("name, says", [(42, "non-empty string"), ("a\x00b", "NUL"), ("x" * 256, "256 characters")])
def test_name_must_be_a_text_postgres_can_store(name, says):
    with pytest.raises(gd.InvalidInput, match=f"BadName.name.*{says}"):
        type("BadName", (gd.Machine,), {"name": name, "start": gd.step(lambda self, ctx: gd.Done())})


@pytest.mark.parametrize("source", ["def start(self): pass", "def start(self, ctx, extra): pass",
                                    "def start(ctx): pass"])
def test_a_step_must_take_self_and_ctx(source):
    space = {}
    exec(source, space)
    with pytest.raises(gd.InvalidInput, match=r"step 'start' must take \(self, ctx\); it is start\("):
        gd.step(space["start"])


def test_a_step_may_take_more_with_defaults_or_star_args():
    def start(self, ctx, retries=3):
        return gd.Done()

    def other(*args, **kwargs):
        return gd.Done()

    assert gd.step(start)._gd_step is True and gd.step(other)._gd_step is True


def test_only_what_gd_step_marked_is_a_step():
    """An attribute that answers any getattr (a mock, a proxy) is not taken for a step."""
    class Anything:
        def __getattr__(self, attr):
            return "yes"

    class WithProxy(gd.Machine):
        name = "tests.unit.with_proxy"
        client = Anything()

        @gd.step
        def start(self, ctx):
            return gd.Done()

    assert set(WithProxy.steps) == {"start"}


def test_initial_that_is_not_a_step_is_invalid():
    with pytest.raises(gd.InvalidInput, match=r"initial is 'begin'.*\['start'\]"):
        class NoBegin(gd.Machine):
            initial = "begin"

            @gd.step
            def start(self, ctx):
                return gd.Done()


def test_undecorated_method_is_not_a_step():
    with pytest.raises(gd.InvalidInput, match="initial is 'start'"):
        class Forgot(gd.Machine):
            def start(self, ctx):
                return gd.Done()


def test_steps_are_collected_from_decorated_methods_including_inherited_ones():
    class Parent(gd.Machine):
        @gd.step
        def start(self, ctx):
            return gd.Next("finish")

        def helper(self):
            return None

    class Child(Parent):
        @gd.step
        def finish(self, ctx):
            return gd.Done()

    assert set(Parent.steps) == {"start"}
    assert set(Child.steps) == {"start", "finish"}


def test_custom_initial_step():
    class Custom(gd.Machine):
        initial = "begin"

        @gd.step
        def begin(self, ctx):
            return gd.Done()

    assert Custom.initial == "begin" and "begin" in Custom.steps


# --- jobs -------------------------------------------------------------------------------

def test_job_without_perform_is_invalid():
    with pytest.raises(gd.InvalidInput, match="must define perform"):
        class Lazy(gd.Job):
            pass


def test_job_with_perform_and_steps_is_invalid():
    # never both. The steps of a Job would silently never run.
    with pytest.raises(gd.InvalidInput, match=r"perform and @gd.step methods \['start'\]"):
        class Both(gd.Job):
            def perform(self, args):
                return None

            @gd.step
            def start(self, ctx):
                return gd.Done()


def test_job_perform_with_args_only_gets_the_args():
    class Echo(gd.Job):
        def perform(self, args):
            return {"echo": args}

    assert Echo().run_perform(ctx({"x": 1})) == gd.Done({"echo": {"x": 1}})
    assert Echo.initial == "perform" and Echo.steps == {"perform": "run_perform"}
    assert Echo.max_attempts == 20


def test_job_perform_with_ctx_gets_the_context():
    class WithCtx(gd.Job):
        def perform(self, args, ctx):
            return {"attempt": ctx.attempt, "args": args}

    assert WithCtx().run_perform(ctx({"x": 2}, attempt=3)) == gd.Done({"attempt": 3, "args": {"x": 2}})


def test_job_function_with_one_parameter():
    @gd.job(queue="email", max_attempts=3)
    def send_receipt(args):
        return {"sent": args["to"]}

    assert issubclass(send_receipt, gd.Job)
    assert (send_receipt.queue, send_receipt.max_attempts) == ("email", 3)
    assert send_receipt.name == f"{__name__}.{send_receipt.__qualname__}"
    assert registry.get(send_receipt.name, 1) is send_receipt
    assert send_receipt().run_perform(ctx({"to": "a@b"})) == gd.Done({"sent": "a@b"})


def test_job_function_with_two_parameters_gets_the_context():
    @gd.job(name="tests.unit.job-with-ctx")
    def with_ctx(args, ctx):
        return {"id": ctx.id, "n": args["n"]}

    assert registry.get("tests.unit.job-with-ctx", 1) is with_ctx
    assert with_ctx().run_perform(ctx({"n": 5})) == gd.Done({"id": 1, "n": 5})


def test_bare_job_decorator_uses_defaults():
    @gd.job
    def bare(args):
        return None

    assert (bare.queue, bare.max_attempts, bare.version) == ("default", 20, 1)
    assert bare().run_perform(ctx()) == gd.Done(None)
    assert bare.func(7) is None  # the original function stays reachable


def test_job_returning_error_retries_with_backoff_then_stops():
    class Flaky(gd.Job):
        max_attempts = 3

        def perform(self, args):
            return gd.Error("boom")

    first = Flaky().run_perform(ctx(attempt=0))
    assert isinstance(first, gd.Retry) and 0.75 <= first.delay <= 1.0
    assert first.state is KEEP  # a job's retry keeps its args
    assert Flaky().run_perform(ctx(attempt=2)) == gd.Stop("boom")


def test_job_raising_is_handled_like_an_error():
    class Raises(gd.Job):
        max_attempts = 2

        def perform(self, args):
            raise RuntimeError("nope")

    job = Raises()
    with pytest.raises(RuntimeError):
        job.run_perform(ctx())
    assert isinstance(job.handle(RuntimeError("nope"), ctx(attempt=0)), gd.Retry)
    assert job.handle(RuntimeError("nope"), ctx(attempt=1)) == gd.Stop("RuntimeError: nope")


def test_job_returning_cancel_fails_at_once():
    class Cancels(gd.Job):
        def perform(self, args):
            return gd.Cancel("not wanted")

    assert Cancels().run_perform(ctx(attempt=0)) == gd.Stop("not wanted")


@pytest.mark.parametrize("max_attempts", [0, -1, "3"])
def test_job_max_attempts_must_be_a_positive_int(max_attempts):
    with pytest.raises(gd.InvalidInput, match="max_attempts"):
        type("BadAttempts", (gd.Job,), {"max_attempts": max_attempts, "perform": lambda self, args: None})


# --- backoff and jitter (docs/guide.md, docs/design.md#backoff) ------------------------------

@pytest.mark.parametrize("attempt, seconds", [
    (0, 1), (1, 2), (2, 4), (3, 8), (8, 256), (9, 300), (20, 300), (2000, 300), (10**12, 300),
])
def test_default_backoff_doubles_and_caps_at_300_seconds(attempt, seconds):
    delay = Once().backoff(attempt)
    assert delay == seconds and isinstance(delay, float)


def test_backoff_is_overridable_per_class():
    class Patient(gd.Job):
        max_attempts = 5

        def perform(self, args):
            return gd.Error("later")

        def backoff(self, attempt):
            return 40.0

    out = Patient().run_perform(ctx(attempt=1))
    assert 30.0 <= out.delay <= 40.0


def test_jitter_spans_three_quarters_to_all_of_the_delay(monkeypatch):
    monkeypatch.setattr(machine.random, "random", lambda: 0.0)
    assert jittered(300) == 225.0
    monkeypatch.setattr(machine.random, "random", lambda: 0.999999)
    assert 299.99 < jittered(300) <= 300.0


def test_jitter_of_300_stays_in_range_and_varies():
    draws = [jittered(300) for _ in range(200)]
    assert all(225.0 <= d <= 300.0 for d in draws)
    assert len(set(draws)) > 1  # actually jittered, not a constant


def test_jitter_clamps_negative_and_absurd_delays():
    assert jittered(-5) == 0.0
    assert jittered(1e300) <= 10 * 365 * 86400.0


# --- autodiscovery (durable.py modules of installed apps; docs/guide.md) -----------------

def test_durable_modules_of_installed_apps_are_autodiscovered():
    # In a fresh interpreter nothing but django.setup() runs, so the machines can only
    # be there because apps.ready() imported tests/durable_app/durable.py.
    code = (
        "import sys, django; django.setup();"
        "from gen_durable import registry;"
        "print('tests.durable_app.durable' in sys.modules);"
        "print(sorted(n for n, v in registry.all_machines()))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "example_project")])}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    imported, names = out.stdout.strip().splitlines()
    assert imported == "True"
    assert {"tests.Counter", "tests.Plain", "tests.noop"} <= set(ast.literal_eval(names))


def test_autodiscovered_machines_are_in_this_process_registry_too():
    machines = registry.all_machines()
    assert machines[("tests.Counter", 1)].__module__ == "tests.durable_app.durable"
    assert ("tests.Plain", 1) in machines


def test_max_attempts_true_is_not_an_int():
    import gen_durable as gd

    with pytest.raises(gd.InvalidInput, match="max_attempts"):
        class BoolAttempts(gd.Job):
            max_attempts = True

            def perform(self, args, ctx):
                return None


def test_job_decorator_takes_a_backoff_function():
    import gen_durable as gd

    @gd.job(name="tests.unit.quick_backoff", backoff=lambda attempt: 0.1 * (attempt + 1))
    def quick(args):
        return None

    assert quick().backoff(0) == 0.1 and quick().backoff(4) == 0.5


def test_a_backoff_that_is_not_callable_is_refused():
    with pytest.raises(gd.InvalidInput, match=r"@gd.job\(backoff=\) takes a function"):
        gd.job(backoff=5)
    with pytest.raises(gd.InvalidInput, match="BadBackoff.backoff must be a method"):
        type("BadBackoff", (gd.Job,), {"name": "tests.unit.bad_backoff", "backoff": 5,
                                       "perform": lambda self, args: None})


def test_a_version_past_a_postgres_integer_says_why():
    with pytest.raises(gd.InvalidInput, match=r"version is 202612071230; the largest is 2147483647"):
        type("Dated", (gd.Machine,), {"version": 202612071230, "start": gd.step(lambda self, ctx: gd.Done())})


def test_an_unknown_name_suggests_the_registered_one_it_is_nearest():
    with pytest.raises(gd.UnknownMachine, match=r"'tests\.unit\.checkuot' \(did you mean 'tests\.unit\.checkout'\?\)"):
        registry.latest("tests.unit.checkuot")
    with pytest.raises(gd.UnknownMachine) as exc:  # nothing close: no guess
        registry.latest("zzz.qqq")
    assert "did you mean" not in str(exc.value)


@pytest.mark.parametrize("source, takes_ctx", [
    ("def f(args): pass", False), ("def f(args, ctx): pass", True), ("def f(args, context): pass", True),
    ("def f(args, c: 'gd.Context'): pass", True), ("def f(args, retries=3): pass", False),
    ("def f(*args): pass", False), ("def f(args, ctx, extra=1): pass", True),
    ("def f(args, _ctx): pass", True), ("def f(args, _): pass", True),
    ("def f(args, c: 'gd.Context | None' = None): pass", True),
    ("def f(*a, **k): pass", True),  # a decorator's wrapper without functools.wraps: as before
    ("def f(args, *rest): pass", True)])
def test_a_job_function_takes_args_and_optionally_ctx(source, takes_ctx):
    space = {}
    exec(source, space)
    made = gd.job(space["f"], name=f"tests.unit.jobsig.{abs(hash(source))}")
    assert made.perform._gd_takes_ctx is takes_ctx  # `retries` is no longer handed the ctx


@pytest.mark.parametrize("source, why", [
    ("def f(to, subject): pass", "f(to, subject): a job function"), ("def f(): pass", "cannot take the job's args"),
    ("def f(args, ctx, extra): pass", "extra would get no value"),
    ("def f(args, *, to): pass", "keyword-only to would get no value")])
def test_a_job_function_the_job_cannot_call_is_refused_saying_how_it_is_called(source, why):
    """A Celery-style `def send(to, subject)` was accepted and called as send(args, ctx):
    `to` got the whole dict and `subject` the Context, and it finished `done`."""
    space = {}
    exec(source, space)
    with pytest.raises(gd.InvalidInput, match=r"^@gd\.job f\(.*\).*def f\(args\) or def f\(args, ctx\)") as exc:
        gd.job(space["f"], name="tests.unit.jobsig.refused")
    assert why in str(exc.value)


def test_calling_a_job_as_the_function_says_how_to_insert_it_or_call_the_function():
    @gd.job(name="tests.unit.jobsig.called")
    def send_welcome(args):
        return args["to"]

    with pytest.raises(TypeError, match=r"send_welcome is a gen_durable job .* send_welcome\.insert\(args=\{\.\.\.\}\)"
                                        r".* send_welcome\.func\(args\)"):
        send_welcome({"to": "a@example.com"})
    assert send_welcome.func({"to": "a@example.com"}) == "a@example.com"
    assert isinstance(send_welcome(), gd.Job)  # the engine's own call
