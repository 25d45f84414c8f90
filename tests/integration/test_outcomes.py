"""Outcomes at the flush level and through the executor (docs/design.md#outcomes, docs/design.md#outcomes, docs/design.md#reliability-bars).

Rows are claimed with the production pick for a named worker, outcomes are built with
`executor.to_entry` (or `executor.execute`) and committed with `flusher.flush` — the
same path the engine takes, one call at a time.
"""

import dataclasses
import datetime as dt
import logging

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance, Signal
from gen_durable.testing import drain
from gen_durable.worker import claims, executor, maintenance
from gen_durable.worker.flusher import flush
from tests.conftest import wait_until
from tests.durable_app.durable import BadResult, BadReturn, Flow, Handled, HandleRaises, SendsMail
from tests.factories import InstanceFactory, SignalFactory

W = "worker-a"


def db_now():
    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        return cur.fetchone()[0]


def rows(queue, n, **kw):
    return [InstanceFactory(fsm="tests.Flow", queue=queue, **kw) for _ in range(n)]


def claim(queue, worker=W, ttl=60, limit=100):
    return {j.id: j for j in claims.pick(queue, limit, worker, ttl)}


def entry(outcome, job, consumed=()):
    return executor.to_entry(outcome, Flow, job, consumed=consumed, presented=consumed)


# --- flush level ---------------------------------------------------------------------

@pytest.mark.django_db
def test_mixed_batch_of_next_retry_done_stop_commits_each_row_in_one_flush(queue_name):
    a, b, c, d = rows(queue_name, 4, state={"n": 0})
    jobs = claim(queue_name)
    result = flush([
        entry(gd.Next("second", state={"n": 1}), jobs[a.id]),
        entry(gd.Retry(state={"n": 2}), jobs[b.id]),
        entry(gd.Done({"ok": True}), jobs[c.id]),
        entry(gd.Stop("boom"), jobs[d.id]),
    ])
    assert result.committed == {a.id: "runnable", b.id: "runnable", c.id: "done", d.id: "failed"}
    assert result.stale == []
    got = {r.id: r for r in Instance.objects.filter(id__in=[a.id, b.id, c.id, d.id])}
    assert (got[a.id].step, got[a.id].state, got[a.id].attempt) == ("second", {"n": 1}, 0)
    assert (got[b.id].step, got[b.id].state, got[b.id].attempt) == ("start", {"n": 2}, 1)
    assert (got[c.id].status, got[c.id].result) == ("done", {"ok": True})
    assert (got[d.id].status, got[d.id].last_error) == ("failed", "boom")
    assert all(r.locked_by is None and r.lease_expires_at is None for r in got.values())


@pytest.mark.django_db
def test_columns_one_outcome_sets_are_kept_in_a_batch_where_the_others_leave_them_null(queue_name):
    """A column most outcomes of a batch leave NULL travels as an array only when one sets
    it (worker/flusher.py `_arrays`): a retry's delay, a new concurrency key and a weight
    land on their own rows; the others keep theirs. The delay is read against the flush's
    own now() (updated_at, same transaction): exact, no clock."""
    a, b, c = rows(queue_name, 3, state={"n": 0})
    jobs = claim(queue_name)
    result = flush([
        entry(gd.Retry(delay=30), jobs[a.id]),
        entry(gd.Next("second", concurrency_key="acct:7", rate_limit="r", weight=2), jobs[b.id]),
        entry(gd.Next("second"), jobs[c.id]),
    ])
    assert result.committed == {a.id: "runnable", b.id: "runnable", c.id: "runnable"}
    got = {r.id: r for r in Instance.objects.filter(id__in=[a.id, b.id, c.id])}
    assert got[a.id].eligible_at - got[a.id].updated_at == dt.timedelta(seconds=30)
    assert (got[b.id].concurrency_key, got[b.id].weight, got[b.id].eligible_at) == \
        ("acct:7", 2.0, got[b.id].updated_at)
    assert (got[c.id].concurrency_key, got[c.id].weight, got[c.id].step, got[c.id].eligible_at) == \
        (None, 1.0, "second", got[c.id].updated_at)


@pytest.mark.django_db
def test_stale_outcome_after_reap_commits_nothing_and_emits_outcome_stale(queue_name, events):
    a, b = rows(queue_name, 2, state={"n": 0})
    keep = SignalFactory(target=a, name="go")
    SignalFactory(target=b, name="noise")
    old = claim(queue_name, worker="old-worker", ttl=-1)  # an already-expired lease
    assert sorted(maintenance.reap()) == sorted([a.id, b.id])
    # A more urgent row claimed by the current worker shares the flush with the stale ones.
    fresh = InstanceFactory(fsm="tests.Flow", queue=queue_name, priority=-1)
    live = claim(queue_name, worker="new-worker", limit=1)
    assert list(live) == [fresh.id]

    result = flush([
        entry(gd.Next("second", state={"n": 1}), old[a.id], consumed=(keep.id,)),
        entry(gd.Done({"late": True}), old[b.id]),
        entry(gd.Next("second"), live[fresh.id]),  # still commits
    ])
    assert sorted(e.id for e in result.stale) == sorted([a.id, b.id])
    assert result.committed == {fresh.id: "runnable"}
    for r in Instance.objects.filter(id__in=[a.id, b.id]):
        assert (r.status, r.step, r.state, r.attempt, r.result) == ("runnable", "start", {"n": 0}, 1, None)
    # No rider ran for the stale rows: neither the consume nor the terminal purge.
    assert sorted(Signal.objects.filter(target_id__in=[a.id, b.id]).values_list("name", flat=True)) == \
        ["go", "noise"]
    stale_events = [(m, md) for e, m, md in events if e == "outcome.stale"]
    assert sorted((md["id"], md["kind"]) for _, md in stale_events) == [(a.id, "next"), (b.id, "done")]
    assert all(m == {"count": 1} and md["fsm"] == "tests.Flow" and md["step"] == "start"
               for m, md in stale_events)


@pytest.mark.django_db
def test_stale_terminal_outcome_does_not_purge_the_inbox(queue_name, events):
    (a,) = rows(queue_name, 1)
    SignalFactory(target=a, name="keep")
    old = claim(queue_name, worker="old-worker", ttl=-1)
    maintenance.reap()
    result = flush([entry(gd.Done({}), old[a.id])])
    assert result.committed == {} and [e.id for e in result.stale] == [a.id]
    assert Instance.objects.get(id=a.id).status == "runnable"
    assert list(Signal.objects.filter(target_id=a.id).values_list("name", flat=True)) == ["keep"]
    assert [(e, md["kind"]) for e, _, md in events if e == "outcome.stale"] == [("outcome.stale", "done")]


@pytest.mark.django_db
def test_outcome_of_another_worker_is_stale_and_the_row_stays_executing(queue_name):
    (a,) = rows(queue_name, 1)
    jobs = claim(queue_name)
    forged = entry(gd.Done({}), jobs[a.id])
    forged.worker = "someone-else"
    result = flush([forged])
    assert result.committed == {} and [e.id for e in result.stale] == [a.id]
    r = Instance.objects.get(id=a.id)
    assert (r.status, r.locked_by) == ("executing", W)


@pytest.mark.django_db
def test_next_releases_switches_or_keeps_the_concurrency_key(queue_name):
    released = InstanceFactory(fsm="tests.Flow", queue=queue_name, concurrency_key="a")
    switched = InstanceFactory(fsm="tests.Flow", queue=queue_name, concurrency_key="b")
    kept = InstanceFactory(fsm="tests.Flow", queue=queue_name, concurrency_key="c")
    jobs = claim(queue_name)
    flush([
        entry(gd.Next("second", concurrency_key=None), jobs[released.id]),
        entry(gd.Next("second", concurrency_key="b2"), jobs[switched.id]),
        entry(gd.Next("second"), jobs[kept.id]),
    ])
    keys = dict(Instance.objects.filter(queue=queue_name).values_list("id", "concurrency_key"))
    assert keys == {released.id: None, switched.id: "b2", kept.id: "c"}
    # The released key is free: a sibling on "a" is claimable while the first row runs on.
    sibling = InstanceFactory(fsm="tests.Flow", queue=queue_name, concurrency_key="a")
    assert sibling.id in claim(queue_name)


@pytest.mark.django_db
def test_retry_keeps_awaits_rate_limit_and_signals_and_schedules_by_the_db_clock(queue_name):
    (a,) = rows(queue_name, 1, awaits=["go", "stop"], rate_limit="api:7", weight=2.0)
    go = SignalFactory(target=a, name="go")
    jobs = claim(queue_name)
    result = flush([entry(gd.Retry(delay=dt.timedelta(seconds=5)), jobs[a.id])])
    assert result.committed == {a.id: "runnable"}
    r = Instance.objects.get(id=a.id)
    assert (r.awaits, r.rate_limit, r.weight, r.attempt, r.step) == (["go", "stop"], "api:7", 2.0, 1, "start")
    # One transaction, one now(): the flush's eligible_at is exactly now() + delay.
    assert r.eligible_at - db_now() == dt.timedelta(seconds=5)
    assert list(Signal.objects.filter(target_id=a.id).values_list("id", flat=True)) == [go.id]


@pytest.mark.django_db
def test_next_clears_awaits_and_takes_the_new_steps_rate_limit(queue_name):
    (a,) = rows(queue_name, 1, awaits=["go"], rate_limit="api:7", weight=2.0)
    jobs = claim(queue_name)
    flush([entry(gd.Next("second", rate_limit=("stripe", 3), weight=4), jobs[a.id])])
    r = Instance.objects.get(id=a.id)
    assert (r.awaits, r.rate_limit, r.weight, r.attempt) == (None, "stripe:3", 4.0, 0)


@pytest.mark.django_db
def test_done_and_stop_purge_the_whole_inbox_and_next_consumes_exactly_its_ids(queue_name):
    done, stopped, progressed = rows(queue_name, 3, awaits=["go"])
    for r in (done, stopped, progressed):
        SignalFactory(target=r, name="go")
        SignalFactory(target=r, name="other")
    bystander = InstanceFactory(queue=queue_name + "-other")
    SignalFactory(target=bystander, name="go")
    jobs = claim(queue_name)
    handed = tuple(s.id for s in jobs[progressed.id].inbox if s.name == "go")
    flush([
        entry(gd.Done({}), jobs[done.id]),
        entry(gd.Stop("x"), jobs[stopped.id]),
        entry(gd.Next("second"), jobs[progressed.id], consumed=handed),
    ])
    names = lambda r: list(Signal.objects.filter(target_id=r.id).values_list("name", flat=True))  # noqa: E731
    assert names(done) == [] and names(stopped) == []
    assert names(progressed) == ["other"]
    assert names(bystander) == ["go"]


# --- executor ------------------------------------------------------------------------

@pytest.mark.django_db
def test_an_exception_in_a_step_goes_to_handle_with_no_inputs(queue_name):
    a = InstanceFactory(fsm="tests.Handled", queue=queue_name, awaits=["go"])
    SignalFactory(target=a, name="go")
    (job,) = claims.pick(queue_name, 1, W, 60)
    assert [s.name for s in job.inbox] == ["go"]
    e = executor.execute(job)
    assert e.kind == "done" and e.consumed == ()
    assert flush([e]).committed == {a.id: "done"}
    result = Instance.objects.get(id=a.id).result
    assert "step boom" in result["error"] and (result["awaited"], result["all"]) == (0, 0)


@pytest.mark.django_db
def test_handle_raising_fails_the_instance_with_handles_message(queue_name):
    id_ = gd.insert(HandleRaises, queue=queue_name)
    assert drain(queue=queue_name)["stop"] == 1
    r = Instance.objects.get(id=id_)
    assert (r.status, r.attempt) == ("failed", 0)
    assert "handle boom" in r.last_error and "step boom" in r.last_error


@pytest.mark.django_db
def test_invalid_return_value_reaches_handle_as_a_type_error_naming_machine_and_step(queue_name):
    id_ = gd.insert(BadReturn, queue=queue_name)
    drain(queue=queue_name)
    r = Instance.objects.get(id=id_)
    assert r.status == "failed"
    assert r.last_error.startswith("handled InvalidOutcome (TypeError: True)")
    assert "tests.BadReturn.start returned 42" in r.last_error


@pytest.mark.django_db
def test_unencodable_done_result_fails_promptly_with_a_json_message(queue_name):
    id_ = gd.insert(BadResult, queue=queue_name)
    (job,) = claims.pick(queue_name, 1, W, 60)
    e = executor.execute(job)  # serialisation happens inside the guarded region
    assert e.kind == "stop"
    flush([e])
    r = Instance.objects.get(id=id_)
    assert (r.status, r.attempt) == ("failed", 0)
    assert "JSON" in r.last_error and "tests.BadResult" in r.last_error
    assert r.last_error.endswith(f"(returned by BadResult.start, defined at {BadResult.start.__code__.co_filename}:"
                                 f"{BadResult.start.__code__.co_firstlineno})")


@gd.job(name="tests.outcomes.unstorable", max_attempts=1)
def unstorable(args):
    return {"handle": object()}  # not JSON


@pytest.mark.django_db
def test_a_jobs_unstorable_result_names_its_function(queue_name):
    id_ = gd.insert(unstorable, queue=queue_name)
    drain(queue=queue_name)
    r = Instance.objects.get(id=id_)
    code = unstorable.func.__code__
    assert r.status == "failed"
    assert r.last_error.endswith(f"(returned by unstorable, defined at {code.co_filename}:{code.co_firstlineno})")


@gd.job(name="tests.outcomes.unstorable_retried", max_attempts=5, backoff=lambda attempt: 0)
def unstorable_retried(args):
    return {"when": object()}


@pytest.mark.django_db
def test_a_jobs_unstorable_result_fails_at_once_not_after_every_attempt(queue_name):
    """Running perform again would return the same value: the default handle() fails the
    job on its first attempt. Control: an error it raises is retried (max_attempts 5)."""
    id_ = gd.insert(unstorable_retried, queue=queue_name)
    raises = gd.insert(SendsMail, queue=queue_name)  # max_attempts 2, backoff 0
    drain(queue=queue_name)
    r = Instance.objects.get(id=id_)
    assert (r.status, r.attempt) == ("failed", 0) and "not JSON" in r.last_error
    assert Instance.objects.get(id=raises).attempt == 1  # the control: retried once, then failed


class HandleReturnsWrong(gd.Machine):
    """A step that raises; handle() returns state["give"]: None (forgot the return) or
    the class gd.Done itself (not called)."""

    name = "tests.outcomes.HandleReturnsWrong"

    @gd.step
    def start(self, ctx):
        raise RuntimeError("boom")

    def handle(self, error, ctx):
        return gd.Done if ctx.state.get("give") == "class" else None


@pytest.mark.django_db
def test_a_bad_value_from_handle_names_handle_and_where_it_is_defined(queue_name):
    none = gd.insert(HandleReturnsWrong, queue=queue_name)
    cls = gd.insert(HandleReturnsWrong, queue=queue_name, state={"give": "class"})
    drain(queue=queue_name)
    code = HandleReturnsWrong.handle.__code__
    where = f"(returned by HandleReturnsWrong.handle, defined at {code.co_filename}:{code.co_firstlineno})"
    assert Instance.objects.get(id=none).last_error == (
        "handle() failed: InvalidOutcome: tests.outcomes.HandleReturnsWrong.handle() (handling step 'start') "
        "returned None, which is not an outcome (Next, Retry, Await, ScheduleChildren, Done or Stop) "
        f"{where} (while handling RuntimeError: boom)")
    assert ("returned <class 'gen_durable.outcomes.Done'>, which is not an outcome (Next, Retry, Await, "
            f"ScheduleChildren, Done or Stop): call it, gd.Done(...) {where}") in Instance.objects.get(id=cls).last_error


@pytest.mark.django_db
def test_handled_step_runs_through_drain(queue_name):
    id_ = gd.insert(Handled, queue=queue_name)
    assert drain(queue=queue_name)["done"] == 1
    assert "step boom" in Instance.objects.get(id=id_).result["error"]


def test_an_unknown_machine_waits_untouched_and_the_engine_keeps_going(committed, engine, queue_name):
    # A worker that does not know a row's machine never fails it (a rolling deploy:
    # docs/guide.md, "Deploying"): it hands it back untouched and runs the others.
    unknown = InstanceFactory(fsm="nope.Nope", queue=queue_name)
    plain = [gd.insert(Flow, queue=queue_name) for _ in range(5)]
    engine({queue_name: 2})
    wait_until(lambda: Instance.objects.filter(id__in=plain, status="done").count() == 5, what="the five known rows done")
    wait_until(lambda: Instance.objects.get(id=unknown.id).unknown_since is not None, what="the unknown row handed back")
    r = Instance.objects.get(id=unknown.id)
    assert (r.status, r.attempt, r.last_error, r.locked_by) == ("runnable", 0, None, None)
    later = gd.insert(Flow, queue=queue_name)
    wait_until(lambda: Instance.objects.get(id=later).status == "done", what="a later row done")


class MisspeltNext(gd.Machine):
    name = "tests.outcomes.MisspeltNext"

    @gd.step
    def start(self, ctx):
        return gd.Next(ctx.state["to"])

    @gd.step
    def ship(self, ctx):
        return gd.Done()

    def refund(self, ctx):  # not decorated: not a step
        return gd.Done()


@pytest.mark.django_db
def test_a_next_to_a_misspelt_step_fails_naming_the_close_one(queue_name):
    typo = gd.insert(MisspeltNext, queue=queue_name, state={"to": "shipp"})
    unlike = gd.insert(MisspeltNext, queue=queue_name, state={"to": "archive"})  # nothing close: no guess
    undecorated = gd.insert(MisspeltNext, queue=queue_name, state={"to": "refund"})
    drain(queue=queue_name)
    assert Instance.objects.get(id=typo).status == "failed"
    # Raised after the step returned: the message names where the step is defined.
    where = f"(returned by MisspeltNext.start, defined at {__file__}:{MisspeltNext.start.__code__.co_firstlineno})"
    assert ("InvalidOutcome: tests.outcomes.MisspeltNext: Next names unknown step 'shipp'; did you mean 'ship'? "
            f"(steps are ['ship', 'start']) {where}") == Instance.objects.get(id=typo).last_error
    assert Instance.objects.get(id=unlike).last_error.endswith(
        f"Next names unknown step 'archive' (steps are ['ship', 'start']) {where}")
    assert Instance.objects.get(id=undecorated).last_error.endswith(
        "Next names unknown step 'refund'; tests.outcomes.MisspeltNext.refund is a method but not a step: "
        f"decorate it with @gd.step (steps are ['ship', 'start']) {where}")


class EditsInPlace(gd.Machine):
    """Edits ctx.state in place, then returns Next("second") with or without state=
    (state["keep"]), or edits nothing (state["touch"] False)."""

    name = "tests.outcomes.EditsInPlace"

    @gd.step
    def start(self, ctx):
        if ctx.state.get("touch", True):
            ctx.state["counter"] = 1
        return gd.Next("second", state=ctx.state) if ctx.state.get("keep") else gd.Next("second")

    @gd.step
    def second(self, ctx):
        return gd.Done({"counter": ctx.state.get("counter")})


@pytest.mark.django_db
def test_a_state_edit_an_outcome_does_not_keep_is_warned_of_once_per_step(queue_name, caplog):
    """The edit is not stored (the documented rule: Next without state= keeps the
    committed state), and the worker says so, once. Controls: state= given, or no edit."""
    from gen_durable.worker.executor import _dropped_warned

    caplog.set_level(logging.WARNING, logger="gen_durable.worker")
    _dropped_warned.discard((EditsInPlace.name, "start"))  # once per process: this test's first
    kept = gd.insert(EditsInPlace, queue=queue_name, state={"keep": True})
    untouched = gd.insert(EditsInPlace, queue=queue_name, state={"touch": False})
    drain(queue=queue_name)
    assert [r for r in caplog.records if "changed ctx.state" in r.getMessage()] == []
    assert Instance.objects.get(id=kept).result == {"counter": 1}
    lost = [gd.insert(EditsInPlace, queue=queue_name) for _ in range(2)]
    drain(queue=queue_name)
    assert [Instance.objects.get(id=i).result for i in lost] == [{"counter": None}] * 2  # not stored
    [record] = [r for r in caplog.records if "changed ctx.state" in r.getMessage()]
    assert record.getMessage().startswith(
        f"tests.outcomes.EditsInPlace#{lost[0]} step start changed ctx.state but returned gd.Next without state=")
    assert "Return gd.Next(..., state=ctx.state) to keep it" in record.getMessage()
    assert Instance.objects.get(id=untouched).result == {"counter": None}


@dataclasses.dataclass(eq=False)
class _Unequal:
    n: int = 0


class TypedKeeps(gd.Machine):
    """A typed State whose decoded instances never compare equal (eq=False): a step that
    edits nothing and keeps the state must not be taken for one that dropped an edit."""

    name = "tests.outcomes.TypedKeeps"
    State = _Unequal

    @gd.step
    def start(self, ctx):
        return gd.Next("second")

    @gd.step
    def second(self, ctx):
        return gd.Done({"n": ctx.state.n})


@pytest.mark.django_db
def test_a_typed_state_kept_unedited_is_not_warned_of(queue_name, caplog):
    caplog.set_level(logging.WARNING, logger="gen_durable.worker")
    id_ = gd.insert(TypedKeeps, queue=queue_name, state=_Unequal(n=2))
    drain(queue=queue_name)
    assert Instance.objects.get(id=id_).result == {"n": 2}
    assert not [r for r in caplog.records if "changed ctx.state" in r.getMessage()]
