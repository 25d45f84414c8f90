"""Rolling deploys (docs/guide.md, "Deploying"): a worker that does not know a row's
machine, version or step hands it back untouched; a worker that knows it runs it.

The two "releases" are two worker processes with different registries
(tests/durable_app/deploy_machines.py: GEN_DURABLE_TEST_RELEASE=old lacks a machine, a
version and a step the new release has).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.deploy_machines import Added, Both, Evolving, EvolvingV2
from tests.integration.test_rundurable import keep_signal_handlers  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "tests" / "manage.py")]


def worker(queue, release, *extra):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"],
               GEN_DURABLE_TEST_SETTINGS='{"POLL_INTERVAL": 0.05, "MAX_POLL_INTERVAL": 0.2}')
    if release == "old":
        env["GEN_DURABLE_TEST_RELEASE"] = "old"
    else:
        env.pop("GEN_DURABLE_TEST_RELEASE", None)
    return subprocess.Popen(MANAGE + ["rundurable", "--queue", f"{queue}=2", "--no-gc", "--no-reaper", *extra],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def rows(ids):
    return list(Instance.objects.filter(id__in=ids).order_by("id"))


def test_an_old_worker_hands_back_what_it_does_not_know_and_the_new_one_runs_it(committed, queue_name):
    unknown = [gd.insert(Added, queue=queue_name) for _ in range(5)]
    unknown += [gd.insert(EvolvingV2, queue=queue_name) for _ in range(2)]
    unknown += [gd.insert(Evolving, step="pack", queue=queue_name) for _ in range(2)]
    known = [gd.insert(Both, queue=queue_name) for _ in range(3)]   # negative control: the old one runs these

    old = worker(queue_name, "old")
    new = None
    try:
        wait_until(lambda: all(r.status == "done" for r in rows(known)), timeout=30, what="the old worker's own rows")
        wait_until(lambda: all(r.unknown_since is not None for r in rows(unknown)), timeout=30,
                   what="the old worker to hand back every row it does not know")
        for r in rows(unknown):
            # Untouched: runnable, no attempt spent, no error, no lease.
            assert (r.status, r.attempt, r.last_error, r.locked_by) == ("runnable", 0, None, None), r.id
        assert all(r.result["ran"] == ["start@old"] for r in rows(known))

        # The deploy goes on: the new release starts beside the old one.
        new = worker(queue_name, "new")
        wait_until(lambda: all(r.status == "done" for r in rows(unknown)), timeout=30,
                   what="the new worker to run the rows the old one did not know")
        done = rows(unknown)
        assert all(r.attempt == 0 and r.last_error is None and r.unknown_since is None for r in done)
        assert sorted(r.result["ran"][0] for r in done) == ["pack@new"] * 2 + ["start@new"] * 7
    finally:
        old_log = stop(old)
        if new is not None:
            stop(new)
    # Said once per machine/version, naming what is missing.
    lines = [line for line in old_log.splitlines() if "handed back untouched" in line]
    assert sum("tests.deploy.Added v1" in line and "that machine" in line for line in lines) == 1, old_log
    assert sum("tests.deploy.Evolving v2" in line and "that version (it has v1)" in line for line in lines) == 1
    assert sum("tests.deploy.Evolving v1" in line and "that step" in line for line in lines) == 1


def test_a_burst_of_the_new_release_runs_every_row_the_old_one_handed_back(committed, queue_name, monkeypatch,
                                                                          keep_signal_handlers):  # noqa: F811
    """A burst adopts the handed-back rows it knows before it decides that nothing is left.
    Adoption comes in batches (ADOPT_BATCH, 2 here so that 30 rows take many) once a
    second from the pause read; a burst used to stop between two reads and exit 3, calling
    the rest unknown to "this release". Negative control: the idle check without the
    adoption (test_control_a_burst_that_does_not_adopt_exits_3_with_known_rows_left)."""
    from django.core.management import call_command

    from gen_durable.worker import scheduler

    unknown = handed_back_by_the_old_release(queue_name, 30)
    monkeypatch.setattr(scheduler, "ADOPT_BATCH", 2)
    call_command("rundurable", "--burst", "--queue", f"{queue_name}=2", "--no-gc", "--no-reaper", verbosity=0)
    assert {(r.status, r.attempt, r.unknown_since) for r in rows(unknown)} == {("done", 0, None)}


def test_control_a_burst_that_does_not_adopt_exits_3_with_known_rows_left(committed, queue_name, monkeypatch,
                                                                          keep_signal_handlers):  # noqa: F811
    from django.core.management import CommandError, call_command

    from gen_durable.worker import scheduler, supervisor

    unknown = handed_back_by_the_old_release(queue_name, 30)
    monkeypatch.setattr(scheduler, "ADOPT_BATCH", 2)
    monkeypatch.setattr(supervisor.Supervisor, "adopt_handed_back", lambda self: 0)
    with pytest.raises(CommandError, match="rows were left"):
        call_command("rundurable", "--burst", "--queue", f"{queue_name}=2", "--no-gc", "--no-reaper", verbosity=0)
    assert sum(r.status == "runnable" and r.unknown_since is not None for r in rows(unknown)) > 0


def handed_back_by_the_old_release(queue_name, n) -> list[int]:
    ids = gd.insert_all([gd.Spec(Added, queue=queue_name) for _ in range(n)])
    old = worker(queue_name, "old")
    try:
        wait_until(lambda: all(r.unknown_since is not None for r in rows(ids)), timeout=30,
                   what="the old worker to hand back every row it does not know")
    finally:
        stop(old)
    return ids


def test_the_pick_hands_back_what_this_process_does_not_know_without_failing_it(committed, queue_name,
                                                                                 monkeypatch):
    from gen_durable import registry
    from gen_durable.worker.claims import adopt_known, pick

    ids = [gd.insert(Added, queue=queue_name) for _ in range(3)] + [gd.insert(Both, queue=queue_name)]
    # This process "is" the old release: Added unregistered.
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))
    monkeypatch.setattr(registry, "_known", None)
    jobs = pick(queue_name, 10, "w-old", 30, stats=(stats := {}))
    assert [j.fsm for j in jobs] == ["tests.deploy.Both"] and stats["unknown"] == 3
    assert pick(queue_name, 10, "w-old", 30) == []                 # out of the pick's range now
    assert adopt_known(queue_name, 10) == []                       # nothing here knows them
    monkeypatch.undo()
    registry._known = None
    assert sorted(adopt_known(queue_name, 10)) == ids[:3]          # the new release adopts them
    again = pick(queue_name, 10, "w-new", 30)
    assert sorted(j.id for j in again) == ids[:3] and {j.attempt for j in again} == {0}


def _lock_row_at_hand_back(monkeypatch, row_id, hold, then=None):
    """Make the first hand-back meet a row lock on `row_id` another session holds for
    `hold` seconds (what a gd.signal, an admin action or a bulk call takes at that moment);
    `then`: SQL that session runs on the row (%s: its id) before it commits."""
    import psycopg

    from gen_durable.worker import claims

    original, held, first = claims.hand_back, threading.Event(), []

    def locker():
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        with psycopg.connect(**params) as other:
            other.execute("SELECT 1 FROM gen_durable WHERE id = %s FOR NO KEY UPDATE", [row_id])
            held.set()
            time.sleep(hold)
            if then:
                other.execute(then, [row_id])
            # the transaction ends (the lock goes) as the block exits

    def racing(jobs, worker, using=None):
        if not first:
            first.append(threading.Thread(target=locker, daemon=True))
            first[0].start()
            held.wait(10)
        return original(jobs, worker, using)

    monkeypatch.setattr(claims, "hand_back", racing)
    return first


def test_a_hand_back_that_meets_a_brief_row_lock_tries_again(committed, queue_name, monkeypatch):
    """hand_back.sql skips a locked row (SKIP LOCKED): the pick tries it again 20 ms later.
    Control: one pass left it executing under a lease nobody renewed, and the reaper
    returned it with an attempt spent and "the worker died" in last_error."""
    from gen_durable import registry
    from gen_durable.worker.claims import pick

    id_ = gd.insert(Added, queue=queue_name)
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))  # this process is the old release
    monkeypatch.setattr(registry, "_known", None)
    _lock_row_at_hand_back(monkeypatch, id_, hold=0.01)
    assert pick(queue_name, 10, "w-old", 30, stats=(stats := {})) == [] and stats["unhanded"] == []
    row = Instance.objects.get(id=id_)
    assert (row.status, row.locked_by, row.attempt, row.last_error) == ("runnable", None, 0, None)
    assert row.unknown_since is not None


def test_a_row_locked_through_the_hand_back_stays_leased_and_goes_back_once_free(committed, queue_name,
                                                                                 monkeypatch, engine):
    """Locked for 2 s (a signal inside a long transaction): the worker keeps the row,
    heartbeated, and hands it back once the lock goes; no attempt is spent. Control:
    dropped from the batch, it stayed executing until its lease (60 s) ran out."""
    from gen_durable import registry

    id_ = gd.insert(Added, queue=queue_name)
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))
    monkeypatch.setattr(registry, "_known", None)
    locker = _lock_row_at_hand_back(monkeypatch, id_, hold=2.0)
    engine({queue_name: 2})
    wait_until(lambda: locker and not locker[0].is_alive(), timeout=10, what="the lock taken and released")
    wait_until(lambda: Instance.objects.get(id=id_).unknown_since is not None, timeout=5,
               what="handed back once the lock went")
    row = Instance.objects.get(id=id_)
    assert (row.status, row.locked_by, row.attempt, row.last_error) == ("runnable", None, 0, None)


def test_a_held_back_row_cancelled_meanwhile_is_let_go(committed, queue_name, monkeypatch, engine):
    """The session that held the lock failed the row (an admin's cancel): it is no longer
    this worker's, so the scheduler stops handing it back and heartbeating it. Control:
    kept, it cost a statement per feeder tick for the life of the process."""
    from gen_durable import registry

    id_ = gd.insert(Added, queue=queue_name)
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))
    monkeypatch.setattr(registry, "_known", None)
    locker = _lock_row_at_hand_back(monkeypatch, id_, hold=0.5, then="UPDATE gen_durable SET status = 'failed', "
                                    "locked_by = NULL, lease_expires_at = NULL WHERE id = %s")
    sup = engine({queue_name: 2})
    sched = sup.schedulers[queue_name]
    wait_until(lambda: id_ in sched._unhanded, timeout=10, what="held back while locked")
    wait_until(lambda: not locker[0].is_alive(), timeout=10, what="the lock released, the row failed")
    wait_until(lambda: id_ not in sched._unhanded, timeout=5, what="let go")
    assert id_ not in sched.held_ids()
    assert Instance.objects.get(id=id_).status == "failed"


def test_a_held_back_claim_never_hands_back_a_newer_claim_of_the_same_row(committed, queue_name, monkeypatch):
    """A row held back (locked at its hand-back), then cancelled, retried at a step this
    worker knows and claimed again by this same worker: the old entry's hand-back must
    leave the newer claim alone — handing it back made the row runnable while its step
    ran, and another pick ran that step a second time at once. Control: without the
    claim in hand_back.sql's guard, the stale claim hands the running row back."""
    from gen_durable import registry
    from gen_durable.worker.claims import hand_back, pick

    id_ = gd.insert(Added, queue=queue_name)
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))  # this process is the old release
    monkeypatch.setattr(registry, "_known", None)
    _lock_row_at_hand_back(monkeypatch, id_, hold=0.3)
    assert pick(queue_name, 10, "w-old", 30, stats=(stats := {})) == []
    (held,) = stats["unhanded"]
    monkeypatch.undo()
    registry._known = None
    # The operator's rescue and this worker's new claim of the row (what pick.sql writes).
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET claim = claim + 1 WHERE id = %s AND locked_by = 'w-old' "
                    "RETURNING claim", [id_])
        (claim,) = cur.fetchone()
    assert claim == held.claim + 1
    assert hand_back([held], "w-old") == []
    row = Instance.objects.get(id=id_)
    assert (row.status, row.locked_by, row.claim, row.unknown_since) == ("executing", "w-old", claim, None)


def test_a_head_of_rows_another_release_runs_is_handed_back_a_window_at_a_time(committed, queue_name,
                                                                               monkeypatch):
    """The web tier deployed first: 1,200 rows of a machine the old workers lack sit ahead of
    rows they know. Each pick that hands back foreign rows is followed at once by a pick
    of a wide window (as after limiter denials), so the known rows start after a few
    picks. Control: picks of `demand` rows, each counted as an empty queue (the poll
    interval doubling), took ~18 minutes at production poll settings for 3,000 such rows."""
    from gen_durable import registry
    from gen_durable.conf import get_settings
    from gen_durable.limiter import get_limiter
    from gen_durable.worker.scheduler import Scheduler

    foreign = gd.insert_all([gd.Spec(Added, queue=queue_name) for _ in range(1200)])
    known = gd.insert_all([gd.Spec(Both, queue=queue_name) for _ in range(3)])
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))  # this process is the old release
    monkeypatch.setattr(registry, "_known", None)
    sch = Scheduler(queue_name, 2, worker_id="w-old", prefix="w-old", flusher=None,
                    limiter=get_limiter(None), settings=get_settings())
    sch._dispatch_locked = lambda: None  # the rows stay buffered: this test only counts picks
    ticks, picked_again_at_once = 0, []
    while not sch.buffer and ticks < 50:
        sch.run_once()
        ticks += 1
        picked_again_at_once.append(getattr(sch, "_foreign_head", None))
    assert sorted(j.id for j in sch.buffer) == known[:2] and ticks == 4  # 2, 500, 500, then 198 + the known
    assert picked_again_at_once == [True] * 4
    sch.run_once()  # no free slot: no pick, so no pick at once either (never a busy loop)
    assert sch._foreign_head is False
    assert Instance.objects.filter(id__in=foreign, unknown_since__isnull=False, attempt=0).count() == 1200


def test_the_overview_says_which_rows_wait_for_a_worker_that_knows_them(admin_client, queue_name):
    from django.urls import reverse

    from tests.factories import HandedBackFactory

    HandedBackFactory.create_batch(3, fsm="shop.Checkout", fsm_version=2, queue=queue_name)
    HandedBackFactory(fsm="tests.deploy.Added", queue=queue_name)
    body = admin_client.get(reverse("admin:gen_durable_queueoverview_changelist")).content.decode()
    assert "3 rows wait for a worker that knows shop.Checkout v2" in body
    assert "no class registered in this release has it" in body
    assert "1 row waits for a worker that knows tests.deploy.Added v1" in body
    assert "this release knows it" in body


def test_a_handed_back_rows_page_says_what_it_waits_for_not_its_far_future_eligible_at(admin_client, queue_name):
    """eligible_at of such a row is the sentinel that keeps it out of the pick (9999-01-01):
    the detail page says instead what the row waits for. Control: a plain row's time."""
    from django.urls import reverse
    from django.utils import timezone

    from tests.factories import HandedBackFactory, InstanceFactory

    unknown = HandedBackFactory(fsm="shop.Checkout", fsm_version=2, step="ship", queue=queue_name)
    known = HandedBackFactory(fsm="tests.deploy.Added", queue=queue_name)
    plain = InstanceFactory(queue=queue_name)
    page = {row.id: admin_client.get(reverse("admin:gen_durable_instance_change", args=[row.id])).content.decode()
            for row in (unknown, known, plain)}
    assert "waiting for a worker that knows shop.Checkout v2 (step ship)" in page[unknown.id]
    assert "no class of this release has it" in page[unknown.id] and "9999" not in page[unknown.id]
    assert "this release knows it" in page[known.id]
    assert "waiting for a worker" not in page[plain.id]
    assert timezone.localtime(plain.eligible_at).isoformat(sep=" ", timespec="seconds") in page[plain.id]


def test_the_overview_shows_no_deploy_section_without_such_rows(admin_client, queue_name):
    from django.urls import reverse

    gd.insert(Both, queue=queue_name)
    body = admin_client.get(reverse("admin:gen_durable_queueoverview_changelist")).content.decode()
    assert 'id="gd-unknown"' not in body and "Queues" in body



# --- W060 and `manage.py durable_versions` ---------------------------------------------
@pytest.mark.django_db
def test_w060_lists_live_rows_no_registered_class_has(queue_name):
    from gen_durable.checks import check_unknown_machines
    from tests.factories import InstanceFactory, TerminalFactory

    InstanceFactory(fsm="shop.Gone", queue=queue_name)
    InstanceFactory.create_batch(2, fsm="tests.deploy.Evolving", fsm_version=3, queue=queue_name)
    InstanceFactory(fsm="tests.deploy.Evolving", step="pak", queue=queue_name, status="awaiting_signal")
    InstanceFactory(fsm="tests.deploy.Both", queue=queue_name)                 # known: not listed
    TerminalFactory(fsm="shop.Finished", queue=queue_name)                      # done: not live
    assert check_unknown_machines() == []                                       # only with --database
    warnings = check_unknown_machines(databases=["default"])
    text = "\n".join(w.msg for w in warnings)
    assert {w.id for w in warnings} == {"gen_durable.W060"} and len(warnings) == 3, text
    assert "1 runnable row of shop.Gone v1 at step 'start'" in text and "no registered machine is named" in text
    assert "2 runnable rows of tests.deploy.Evolving v3" in text and "has versions v1, v2 here, not v3" in text
    assert "no step 'pak'" in text and "renamed from 'pak' to 'pack'?" in text
    assert "shop.Finished" not in text and "tests.deploy.Both" not in text


@pytest.mark.django_db
def test_durable_versions_lists_live_rows_per_machine_version_and_step(queue_name):
    from io import StringIO

    from django.core.management import CommandError, call_command

    from tests.factories import HandedBackFactory, InstanceFactory

    InstanceFactory.create_batch(2, fsm="tests.deploy.Evolving", queue=queue_name)
    HandedBackFactory(fsm="tests.deploy.Evolving", fsm_version=3, queue=queue_name)
    out = StringIO()
    call_command("durable_versions", "--machine", "tests.deploy.Evolving", stdout=out)
    lines = out.getvalue().splitlines()
    v1 = next(line for line in lines if " v1 " in line)
    assert "start" in v1 and "runnable" in v1 and " 2 " in v1 and "runs it" in v1
    v3 = next(line for line in lines if " v3 " in line)
    assert " 1 " in v3 and "not v3" in v3
    assert not any("may be removed" in line for line in lines)    # v1 has live rows, v2 is the newest
    out = StringIO()
    call_command("durable_versions", "--unknown", stdout=out)
    assert " v1 " not in out.getvalue() and " v3 " in out.getvalue()
    Instance.objects.filter(fsm="tests.deploy.Evolving", fsm_version=1).update(status="done")  # v1 drained
    out = StringIO()
    call_command("durable_versions", "--machine", "tests.deploy.Evolving", stdout=out)
    assert out.getvalue().splitlines()[-1] == "no live rows (an older version may be removed): tests.deploy.Evolving v1"
    with pytest.raises(CommandError, match="did you mean 'tests.deploy.Evolving'"):
        call_command("durable_versions", "--machine", "tests.deploy.Evolvin")


# --- evolving a machine: step aliases, retry at a step -------------------------------
class Renamed(gd.Machine):
    """`ship` was called `send` in the release before: rows parked under it still run."""

    name = "tests.deploy.Renamed"
    step_aliases = {"send": "ship"}

    @gd.step
    def start(self, ctx):
        return gd.Next("ship")

    @gd.step
    def ship(self, ctx):
        return gd.Done({"step": ctx.step, "state": ctx.state})


@pytest.mark.django_db
def test_a_row_parked_under_a_renamed_steps_old_name_runs_the_new_step(queue_name):
    from gen_durable import registry, testing
    from tests.factories import InstanceFactory

    old = InstanceFactory(fsm="tests.deploy.Renamed", step="send", queue=queue_name, state={"n": 1})
    assert registry.knows("tests.deploy.Renamed", 1, "send")
    testing.drain(queue_name)
    r = Instance.objects.get(id=old.id)
    assert (r.status, r.result) == ("done", {"step": "send", "state": {"n": 1}})


def test_step_aliases_are_checked_at_class_definition():
    with pytest.raises(gd.InvalidInput, match="maps 'a' to 'nope', which is not a step"):
        class Bad(gd.Machine):
            name = "tests.deploy.BadAlias"
            step_aliases = {"a": "nope"}

            @gd.step
            def start(self, ctx):
                return gd.Done()
    with pytest.raises(gd.InvalidInput, match="renames 'start', which is still a step"):
        class Bad2(gd.Machine):
            name = "tests.deploy.BadAlias2"
            step_aliases = {"start": "start"}

            @gd.step
            def start(self, ctx):
                return gd.Done()


@pytest.mark.django_db
def test_retry_resumes_a_failed_instance_at_a_chosen_step_with_its_state(queue_name):
    from gen_durable import testing
    from tests.factories import InstanceFactory

    failed = InstanceFactory(fsm="tests.deploy.Evolving", step="gone", queue=queue_name, status="failed",
                             state={"order": 7}, attempt=3, last_error="x")
    with pytest.raises(gd.InvalidInput, match="has no step 'pak'; did you mean 'pack'"):
        gd.retry(failed.id, step="pak")
    assert Instance.objects.get(id=failed.id).status == "failed"          # refused: nothing written
    assert gd.retry(failed.id, step="pack") == failed.id
    r = Instance.objects.get(id=failed.id)
    assert (r.status, r.step, r.attempt) == ("runnable", "pack", 0)
    testing.drain(queue_name)
    r = Instance.objects.get(id=failed.id)
    assert r.status == "done" and r.result == {"order": 7, "ran": ["pack@new"]}


@pytest.mark.django_db
def test_control_without_the_hand_back_the_old_release_fails_the_row_at_attempt_0(queue_name, monkeypatch):
    """Negative control of the hand-back: when the pick does not sort out the rows this
    process lacks (as before), executing one fails it at once — what the deploy test
    above proves no longer happens."""
    from gen_durable import registry
    from gen_durable.worker.claims import pick
    from gen_durable.worker.executor import execute
    from gen_durable.worker.flusher import flush

    id_ = gd.insert(Added, queue=queue_name)
    monkeypatch.delitem(registry._machines, ("tests.deploy.Added", 1))
    monkeypatch.setattr(registry, "knows", lambda *a: True)   # the pick no longer hands anything back
    [job] = pick(queue_name, 10, "w-old", 30)
    flush([execute(job)])
    r = Instance.objects.get(id=id_)
    assert (r.status, r.attempt) == ("failed", 0) and "no gen_durable machine registered" in r.last_error


@pytest.mark.django_db
def test_durable_versions_lists_a_removed_machines_live_rows(queue_name):
    """A machine removed from this release has no class here, but its rows are what the
    operator checks before deleting it: --machine lists them; a typo is still an error."""
    from io import StringIO

    from django.core.management import CommandError, call_command
    from django.db import connection

    from tests.durable_app.durable import noop

    id_ = gd.insert(noop, args={}, queue=queue_name)
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET fsm = 'tests.removed.Gone' WHERE id = %s", [id_])
    out = StringIO()
    call_command("durable_versions", "--machine", "tests.removed.Gone", stdout=out)
    assert "tests.removed.Gone" in out.getvalue() and str(id_) in out.getvalue()
    with pytest.raises(CommandError, match="did you mean 'tests.noop'"):
        call_command("durable_versions", "--machine", "tests.noopp")


def _buffered_scheduler(queue_name, n):
    """A scheduler (in this process) that has claimed `n` rows into its buffer and runs no
    step: the shutdown's release is all that happens to them."""
    from gen_durable.conf import get_settings
    from gen_durable.limiter import get_limiter
    from gen_durable.worker.scheduler import Scheduler

    sch = Scheduler(queue_name, n, worker_id="w-stop", prefix="w-stop", flusher=None,
                    limiter=get_limiter(None), settings=get_settings())
    sch._dispatch_locked = lambda: None
    sch._thread = threading.Thread(target=lambda: None)  # stop() joins the feeder thread
    sch._thread.start()
    sch.run_once()
    assert len(sch.buffer) == n
    return sch


def _hold_lock(row_id, seconds):
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    held = threading.Event()

    def locker():
        with psycopg.connect(**params) as other:  # a gd.signal inside a long transaction
            other.execute("SELECT 1 FROM gen_durable WHERE id = %s FOR NO KEY UPDATE", [row_id])
            held.set()
            time.sleep(seconds)

    thread = threading.Thread(target=locker, daemon=True)
    thread.start()
    held.wait(10)
    return thread


def test_shutdown_waits_for_a_buffered_row_another_session_holds_locked(committed, queue_name):
    """SIGTERM while a web request's transaction holds a buffered row locked (it signalled
    the row): the shutdown's last release waits for the lock, within the drain, so the
    row goes back runnable with no attempt spent. Control: the quick SKIP LOCKED passes
    alone left it executing, and the next start charged an attempt ("the worker died")."""
    ids = gd.insert_all([gd.Spec(Both, queue=queue_name) for _ in range(2)])
    sch = _buffered_scheduler(queue_name, 2)
    locker = _hold_lock(ids[1], 0.8)
    assert sch.stop(drain_timeout=5)["released"] == 2
    locker.join()
    assert [(r.status, r.locked_by, r.attempt) for r in rows(ids)] == [("runnable", None, 0)] * 2


def test_a_row_locked_past_the_drain_is_named_in_a_warning(committed, queue_name, caplog):
    ids = gd.insert_all([gd.Spec(Both, queue=queue_name) for _ in range(2)])
    sch = _buffered_scheduler(queue_name, 2)
    locker = _hold_lock(ids[0], 3.0)
    with caplog.at_level("WARNING", logger="gen_durable.worker"):
        assert sch.stop(drain_timeout=0)["released"] == 1
    locker.join()
    assert "1 unstarted row(s) stayed locked by another session for 1.0s" in caplog.text
    assert f"(ids {ids[0]})" in caplog.text
    assert [r.status for r in rows(ids)] == ["executing", "runnable"]
