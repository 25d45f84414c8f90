"""`manage.py rundurable` (docs/design.md#worker): burst runs, argument validation, --processes."""

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.durable import Counter, Recorder

ROOT = Path(__file__).resolve().parents[2]
MANAGE = [sys.executable, str(ROOT / "tests" / "manage.py")]


@pytest.fixture
def keep_signal_handlers():
    """rundurable installs SIGTERM/SIGINT handlers in the process it runs in."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def child_env(**gen_durable):
    """Environment of a worker subprocess: the test database, optional GEN_DURABLE keys."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
    if gen_durable:
        env["GEN_DURABLE_TEST_SETTINGS"] = json.dumps(gen_durable)
    return env


def test_burst_runs_a_batch_to_completion_and_returns(committed, keep_signal_handlers, queue_name):
    ids = gd.insert_all([gd.Spec(Counter, state={"target": 3}, queue=queue_name) for _ in range(20)])
    call_command("rundurable", "--burst", "--queue", f"{queue_name}=2", "--no-gc", verbosity=0)
    rows = Instance.objects.filter(id__in=ids)
    assert {(r.status, r.result["count"]) for r in rows} == {("done", 3)}


def test_the_start_up_line_names_the_claim_settings(committed, keep_signal_handlers, queue_name, caplog):
    # PREFETCH and MIN_DEMAND change how a worker claims (docs/guide.md, "Tuning
    # throughput"); an operator reading the log must see what this process runs with.
    from django.test import override_settings

    gd.insert(Counter, state={"target": 1}, queue=queue_name)
    with override_settings(GEN_DURABLE={"PREFETCH": 7, "MIN_DEMAND": 3}), caplog.at_level("INFO", "gen_durable"):
        call_command("rundurable", "--burst", "--queue", f"{queue_name}=2", "--no-gc", verbosity=1)
    line = next(r.getMessage() for r in caplog.records if " starting: database " in r.getMessage())
    assert "prefetch 7, min demand 3" in line
    assert f"({connection.settings_dict['NAME']} on " in line  # which database it works on


def test_start_up_names_the_machines_and_warns_of_rows_nothing_will_run(committed, keep_signal_handlers,
                                                                      queue_name, caplog):
    # A durable.py that was not imported, an insert with a misspelt queue= or an
    # unconfigured rate limit must show at start-up, not only in `check --database`
    # (W006, W004).
    gd.insert(Counter, state={"target": 1}, queue=queue_name)
    from tests.factories import InstanceFactory

    stray = InstanceFactory(fsm="tests.Counter", state={"target": 1}, queue=f"{queue_name}-misspelt",
                            rate_limit=f"{queue_name}-rl").id  # a rate limit no longer configured
    try:
        with caplog.at_level("INFO", "gen_durable"):
            call_command("rundurable", "--burst", "--queue", f"{queue_name}=1", "--no-gc", verbosity=1)
        messages = [r.getMessage() for r in caplog.records]
        machines = next(m for m in messages if " machines: " in m)
        from gen_durable import registry

        # The line names the first machines by name, then "and N more".
        first, version = min(registry.all_machines())
        assert f"machines: {first} v{version} (queue " in machines and " more" in machines
        warning = next(r for r in caplog.records if "neither this worker nor" in r.getMessage())
        assert warning.levelname == "WARNING" and f"{queue_name}-misspelt (1 row, e.g. id {stray})" in warning.getMessage()
        limits = next(r for r in caplog.records if "GEN_DURABLE['RATE_LIMITS'] lacks" in r.getMessage())
        assert limits.levelname == "WARNING" and f"{queue_name}-rl (1 row, e.g. id {stray})" in limits.getMessage()
        assert Instance.objects.get(id=stray).status == "runnable"
    finally:
        Instance.objects.filter(id=stray).delete()


def test_burst_exits_past_a_row_that_names_an_unconfigured_rate_limit_and_says_so(
        committed, keep_signal_handlers, queue_name, caplog):
    # Such a row is never admitted: waiting for it, --burst would never exit.
    done = gd.insert(Counter, state={"target": 1}, queue=queue_name)
    from tests.factories import InstanceFactory

    stranded = InstanceFactory(fsm="tests.Counter", state={"target": 1}, queue=queue_name,
                               rate_limit=f"{queue_name}-nolimit").id  # a rate limit no longer configured
    try:
        with caplog.at_level("INFO", "gen_durable"), pytest.raises(CommandError) as exc:
            call_command("rundurable", "--burst", "--queue", f"{queue_name}=1", "--no-gc", verbosity=1)
        assert exc.value.returncode == 3  # distinct: it left rows it cannot run
        assert Instance.objects.get(id=done).status == "done"
        assert Instance.objects.get(id=stranded).status == "runnable"
        messages = [r.getMessage() for r in caplog.records]
        stop = messages.index(next(m for m in messages if m.startswith("burst mode: nothing left that this worker can run")))
        assert queue_name in messages[stop]
        # Named again on the way out, after the stop line, with what it leaves behind.
        assert any(f"{queue_name}-nolimit" in m and "RATE_LIMITS" in m for m in messages[stop:])
        summary = next(m for m in messages if m.startswith("burst mode: leaving rows"))
        assert f"queue {queue_name}: 1 row, e.g. id {stranded}: they name a rate limit" in summary
    finally:
        Instance.objects.filter(id=stranded).delete()


def test_burst_exits_3_past_a_paused_queue_and_a_machine_it_does_not_know(committed, keep_signal_handlers,
                                                                          queue_name, caplog):
    from tests.factories import HandedBackFactory

    paused_q = f"{queue_name}-held"
    done = gd.insert(Counter, state={"target": 1}, queue=queue_name)
    held = gd.insert(Counter, state={"target": 1}, queue=paused_q)
    foreign = HandedBackFactory(fsm="shop.Gone", queue=queue_name)
    gd.pause_queue(paused_q)
    try:
        with caplog.at_level("INFO", "gen_durable"), pytest.raises(CommandError) as exc:
            call_command("rundurable", "--burst", "--queue", f"{queue_name}=1", "--queue", f"{paused_q}=1",
                         "--no-gc", verbosity=1)
        assert exc.value.returncode == 3
        assert Instance.objects.get(id=done).status == "done"
        assert Instance.objects.get(id=held).status == "runnable"
        summary = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("burst mode: leaving rows"))
        assert f"queue {paused_q}: 1 row, e.g. id {held}: the queue is paused" in summary
        assert f"queue {queue_name}: 1 row, e.g. id {foreign.id}: no worker of this release knows" in summary
    finally:
        gd.resume_queue(paused_q)


def test_burst_max_wait_stops_waiting_for_rows_deferred_past_it(committed, keep_signal_handlers, queue_name,
                                                                 caplog):
    later = gd.insert(Counter, state={"target": 1}, queue=queue_name, schedule_in=3600)
    with caplog.at_level("INFO", "gen_durable"), pytest.raises(CommandError) as exc:
        call_command("rundurable", "--burst", "--max-wait", "0.5", "--queue", f"{queue_name}=1", "--no-gc",
                     verbosity=1)
    assert exc.value.returncode == 3 and Instance.objects.get(id=later).status == "runnable"
    messages = [r.getMessage() for r in caplog.records]
    assert any("no progress for --max-wait 0.5 s" in m for m in messages)
    assert any(f"queue {queue_name}: 1 row, e.g. id {later}: due later" in m for m in messages)


@pytest.mark.django_db
def test_max_wait_needs_burst():
    with pytest.raises(CommandError, match="--max-wait needs --burst"):
        call_command("rundurable", "--max-wait", "5")


@pytest.mark.parametrize("argv, message", [
    (["--queue", "=3"], "--queue needs a name"),
    (["--queue", "a=0"], "needs N >= 1"),
    (["--queue", "a=x"], "needs an integer N"),
    (["--processes", "0"], "expected a positive integer"),
])
def test_bad_arguments_are_argparse_errors(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("rundurable", *argv)


def test_two_processes_in_burst_mode_exit_0_with_every_row_done(committed, queue_name, tmp_path):
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()  # first runs wait while it exists: both processes must be running steps
    ids = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 60},
                                 queue=queue_name) for _ in range(30)])
    proc = subprocess.Popen(MANAGE + ["rundurable", "--processes", "2", "--burst", "--queue", f"{queue_name}=3",
                                      "--verbosity", "0"],
                            cwd=ROOT, env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: len(steps(log, "start")) == 2 and sum(map(len, steps(log, "start").values())) == 6,
                   timeout=60, what="three steps running in each of two processes")
    finally:
        hold.unlink()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
    ended = [i for ran in steps(log, "end").values() for i in ran]
    assert sorted(ended) == sorted(ids)  # each step completed once


def test_a_burst_stopped_by_sigterm_with_rows_left_exits_3_naming_them(committed, queue_name, tmp_path):
    """SIGTERM stops a burst before its queue is done: it drains as any worker does, then
    exits 3 with a line naming what it leaves — never 0, which a deploy script or a cron
    job would read as "all done" (it exited 0 before)."""
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()  # the first step runs until the file is gone: the burst cannot finish
    ids = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 60},
                                 queue=queue_name) for _ in range(4)])
    proc = subprocess.Popen(MANAGE + ["rundurable", "--burst", "--queue", f"{queue_name}=1", "--verbosity", "1"],
                            cwd=ROOT, env=child_env(DRAIN_TIMEOUT=0.5), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: sum(map(len, steps(log, "start").values())) == 1, timeout=60, what="a step running")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        hold.unlink()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, err[-3000:]
    assert "burst mode: stopped (received SIGTERM) before its queues were done: leaving " in err, err[-3000:]
    assert f"queue {queue_name}: 4 rows" in err and "due now: the worker was stopped first" in err, err[-3000:]
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"runnable"}


def test_a_burst_whose_last_step_finishes_in_the_drain_exits_0(committed, queue_name, tmp_path):
    """The negative control: SIGTERM while the burst's last step runs, and that step
    finishes within DRAIN_TIMEOUT (its outcome commits in the drain): nothing is left, so
    the stopped burst exits 0."""
    log, hold = tmp_path / "steps.log", tmp_path / "hold"
    hold.touch()
    (id_,) = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 60},
                                    queue=queue_name)])
    proc = subprocess.Popen(MANAGE + ["rundurable", "--burst", "--queue", f"{queue_name}=1", "--verbosity", "1"],
                            cwd=ROOT, env=child_env(DRAIN_TIMEOUT=30), stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: steps(log, "start"), timeout=60, what="the step running")
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the worker takes the signal and starts its drain; the step still runs
        hold.unlink()  # the step ends within the drain
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopping (received SIGTERM)" in err, err[-3000:]
    assert proc.returncode == 0, err[-3000:]
    assert "before its queues were done" not in err, err[-3000:]
    assert Instance.objects.get(id=id_).status == "done"


def steps(log, what):
    """pid -> ids of the Recorder log lines of kind `what`."""
    by_pid = defaultdict(list)
    if log.exists():
        for fields in (line.split() for line in log.read_text().splitlines()):
            if len(fields) != 4:
                continue  # a line still being written
            id_, _attempt, kind, pid = fields
            if kind == what:
                by_pid[pid].append(int(id_))
    return by_pid


def test_a_queue_nothing_uses_is_refused_with_burst_and_warned_about_without(transactional_db, queue_name):
    from io import StringIO

    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=f"'{queue_name}'.*no registered machine uses"):
        call_command("rundurable", "--burst", "--queue", queue_name, "--no-gc", "--no-reaper", verbosity=0)
    err = StringIO()
    with pytest.raises(CommandError, match="refusing --burst"):
        call_command("rundurable", "--burst", "--queue", "emial", "--queue", "default", verbosity=0, stderr=err)


def test_a_queue_nothing_uses_gets_a_did_you_mean(transactional_db):
    """`--queue defualt` names the close queue a machine uses (the warning and the refusal)."""
    from io import StringIO

    from django.core.management.base import CommandError

    from gen_durable.management.commands.rundurable import Command

    err = StringIO()
    Command(stderr=err)._check_queues(["defualt"], burst=False)
    assert "no registered machine uses this queue" in err.getvalue()
    assert err.getvalue().rstrip().endswith("did you mean 'default'?")
    with pytest.raises(CommandError, match=r"did you mean 'default' for 'defualt'\?; refusing --burst"):
        call_command("rundurable", "--burst", "--queue", "defualt", "--queue", "zzqx", verbosity=0)
    err = StringIO()
    Command(stderr=err)._check_queues(["zzqx"], burst=False)  # nothing close: no suggestion
    assert "no registered machine uses" in err.getvalue() and "did you mean" not in err.getvalue()


def test_an_unmigrated_database_is_refused_at_start_up(transactional_db):
    """Without gen_durable's tables every pick and sweep would fail forever: refuse to start."""
    # Named after the test database, so the suite creates only databases named like its own.
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with connection.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS {name}")
        cur.execute(f"CREATE DATABASE {name}")
    try:
        env = dict(child_env(), GEN_DURABLE_TEST_DB_NAME=name)
        proc = subprocess.run(MANAGE + ["rundurable", "--burst"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert "migrations are not applied" in proc.stderr and "manage.py migrate" in proc.stderr
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            cur.execute("SELECT count(*) FROM pg_database WHERE datname = %s", [name])
            assert cur.fetchone()[0] == 0


def test_a_database_that_does_not_exist_is_a_clear_error_not_an_endless_wait(transactional_db):
    """On main rundurable retried 'database … does not exist' for ever (capped back-off)."""
    env = dict(child_env(), GEN_DURABLE_TEST_DB_NAME=f"gd_missing_{os.getpid()}")
    proc = subprocess.run(MANAGE + ["rundurable", "--burst"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "does not exist — not retrying: create the database" in proc.stderr, proc.stderr[-2000:]
    assert "retrying in" not in proc.stderr  # not one back-off round


def test_a_supervised_child_skips_the_checks_its_parent_ran_and_a_restarted_one_runs_them(
        transactional_db, monkeypatch):
    """`--processes N` runs the system and migration checks in the parent before it spawns
    the children; a first child (--parent, no --predecessors) does not repeat them, a
    restarted one (--predecessors: the code may have changed since) and a plain
    `rundurable` do. Counted per invocation."""
    from django.core.management import call_command
    from django.core.management.base import BaseCommand

    ran = []
    real_check, real_migrations = BaseCommand.check, BaseCommand.check_migrations
    monkeypatch.setattr(BaseCommand, "check", lambda self, *a, **k: ran.append("check") or real_check(self, *a, **k))
    monkeypatch.setattr(BaseCommand, "check_migrations",
                        lambda self: ran.append("migrations") or real_migrations(self))
    base = ["rundurable", "--burst", "--queue", "default=1", "--no-gc", "--no-reaper"]
    parent = f"--parent={os.getppid()}"  # alive for the whole call: the child does not drain early
    for extra, expected in (([], ["check", "migrations"]),
                            (["--child=0", parent], []),
                            (["--child=0", parent, "--predecessors=999999"], ["check", "migrations"])):
        ran.clear()
        call_command(*base, *extra, skip_checks=False, verbosity=0)
        assert ran == expected, extra


def test_a_running_worker_warns_of_rows_that_arrive_later_in_a_queue_no_one_serves(engine, settings, queue_name,
                                                                                   caplog):
    """A machine with a misspelt `queue` accepts inserts (the machine declares it); the
    rows inserted after the workers started are reported by the next reaper sweep, once
    per queue while it stays unserved — not only at a worker's start-up."""
    from tests.factories import InstanceFactory

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "REAPER": {"INTERVAL": 0.2}}
    stray_queue = f"unserved-{queue_name}"  # no EXTRA_QUEUES pattern of the test settings matches it
    elsewhere = f"{queue_name}-elsewhere"  # matches "q*" of EXTRA_QUEUES: another deployment serves it

    def warnings():
        return [r.getMessage() for r in caplog.records
                if "neither this worker nor" in r.getMessage() and stray_queue in r.getMessage()]

    def sweeps(reaper, n):
        """Wait until `n` more reaper sweeps have ended (each one's start is its last_ok)."""
        for _ in range(n):
            mark = reaper.last_ok
            wait_until(lambda: reaper.last_ok > mark, what="a reaper sweep")

    with caplog.at_level("WARNING", "gen_durable"):
        sup = engine({queue_name: 1}, gc=False)
        reaper = next(r for r in sup._roles if getattr(r, "name", None) == "reaper")
        sweeps(reaper, 2)  # nothing stranded: nothing logged
        assert warnings() == []
        stray = InstanceFactory(fsm="tests.Counter", state={"target": 1}, queue=stray_queue).id
        served_elsewhere = InstanceFactory(fsm="tests.Counter", state={"target": 1}, queue=elsewhere).id
        sweeps(reaper, 2)
        assert len(warnings()) == 1 and f"{stray_queue} (1 row, e.g. id {stray})" in warnings()[0]
        assert elsewhere not in caplog.text
        # Emptied and filled again: not logged again (once per queue in a process's life).
        Instance.objects.filter(id=stray).delete()
        sweeps(reaper, 2)
        again = InstanceFactory(fsm="tests.Counter", state={"target": 1}, queue=stray_queue).id
        sweeps(reaper, 2)
        assert len(warnings()) == 1
    Instance.objects.filter(id__in=[again, served_elsewhere]).delete()


@pytest.mark.django_db
def test_reload_is_refused_with_options_it_cannot_serve():
    with pytest.raises(CommandError, match=r"--reload runs one worker process .*: not with --processes or --burst"):
        call_command("rundurable", "--reload", "--processes", "2", "--burst", verbosity=0)


def test_reload_drains_the_worker_on_a_file_change_and_starts_a_new_one(committed, queue_name, tmp_path):
    """`rundurable --reload`: a changed Python file of the project restarts the worker
    process, as runserver does, but the running worker drains first — the step that runs
    at the change finishes and commits (attempt 0: not handed back to the reaper). The new
    process runs what comes next; SIGINT (Ctrl-C) drains and ends both, status 0."""
    log, hold, out = tmp_path / "steps.log", tmp_path / "hold", tmp_path / "worker.log"
    hold.touch()
    (running,) = gd.insert_all([gd.Spec(Recorder, state={"log": str(log), "hold": str(hold), "sleep": 60},
                                        queue=queue_name)])
    watched = ROOT / "tests" / "durable_app" / "durable.py"  # a module the worker imported
    with open(out, "w") as sink:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--reload", "--queue", f"{queue_name}=1", "--no-gc",
                                          "--verbosity", "1"],
                                cwd=ROOT, env=child_env(DRAIN_TIMEOUT=30), stderr=sink, stdout=sink, text=True)
    try:
        text = out.read_text
        wait_until(lambda: steps(log, "start"), timeout=60, what="the step running")
        (first,) = [pid for pid, ids in steps(log, "start").items() if running in ids]
        time.sleep(2)  # the reloader's first pass (once a second) records the files' times
        os.utime(watched)
        wait_until(lambda: "durable.py changed: reloading" in text(), timeout=30, what="the reload's drain")
        assert Instance.objects.get(id=running).status == "executing"  # the drain waits for it
        hold.unlink()  # the step ends within the drain
        wait_until(lambda: text().count("watching for file changes") == 2, timeout=60, what="a new worker")
        row = Instance.objects.get(id=running)
        assert (row.status, row.attempt) == ("done", 0), text()[-3000:]
        after = gd.insert(Recorder, state={"log": str(log)}, queue=queue_name)
        wait_until(lambda: Instance.objects.get(id=after).status == "done", timeout=60, what="the new worker's step")
        (second,) = [pid for pid, ids in steps(log, "start").items() if after in ids]
        assert second != first  # another process ran it
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if hold.exists():
            hold.unlink()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, text()[-3000:]
    assert "stopping (received SIGINT)" in text(), text()[-3000:]
