"""Supervision of `rundurable --processes N` (docs/reliability.md "Processes"): a dead
child is restarted and its claims come back at once; children drain and exit when
their parent dies; a step that kills its process stops at max_attempts."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.supervision_machines import DiesInStep, Sleeper

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return sorted(out)


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline") as f:
        return f.read().replace("\0", " ").strip()


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def lines(log, what=None):
    if not log.exists():
        return []
    out = [line.split() for line in log.read_text().splitlines()]
    return [f for f in out if len(f) == 6 and (what is None or f[3] == what)]


@pytest.fixture
def host(tmp_path):
    """start(queue, processes, **GEN_DURABLE) -> a `rundurable --processes N` host; it and
    its children are killed at teardown."""
    from tests.integration.test_rundurable import child_env

    started = []

    def start(queue, processes=2, concurrency=2, **conf):
        out = open(tmp_path / f"host-{len(started)}.log", "w")
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable",
                                 "--processes", str(processes), "--queue", f"{queue}={concurrency}",
                                 "--verbosity", "1"], cwd=ROOT, env=child_env(**conf),
                                stdout=out, stderr=subprocess.STDOUT, text=True)
        out.close()
        proc.log_path = tmp_path / f"host-{len(started)}.log"
        started.append(proc)
        wait_until(lambda: len(children_of(proc.pid)) == processes, timeout=30, what="the children")
        return proc

    yield start
    for proc in started:
        kids = children_of(proc.pid)
        for pid in [proc.pid] + kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()


# A long lease and reaper interval: what comes back within seconds came back through
# the restarted child's start-up reclaim, not the reaper.
SLOW_LEASE = dict(LEASE_TTL=60, HEARTBEAT_INTERVAL=20, REAPER={"INTERVAL": 60})


def test_a_killed_child_is_restarted_and_its_claims_come_back_at_once(committed, host, queue_name, tmp_path):
    """On main the host ran on with one child and the dead child's rows stayed
    executing until the lease lapsed and a reaper — in the dead child only — ran."""
    log = tmp_path / "runs.log"
    ids = [gd.insert(Sleeper, args={"log": str(log), "sleep": 60, "once": True}, queue=queue_name)
           for _ in range(4)]
    proc = host(queue_name, **SLOW_LEASE)
    wait_until(lambda: len(lines(log, "start")) == 4, timeout=60, what="four steps running")
    victim = int(lines(log, "start")[0][4])
    victims = {int(f[0]) for f in lines(log, "start") if int(f[4]) == victim}
    os.kill(victim, signal.SIGKILL)
    # Taken back by the restarted child's start-up reclaim, not by a reaper after the lease:
    # the reclaim's own record is on every row, and they run again.
    wait_until(lambda: all("reclaimed at start-up" in (r or "") for r in
                           Instance.objects.filter(id__in=victims).values_list("last_error", flat=True)),
               timeout=45, what="the dead child's rows reclaimed")
    wait_until(lambda: len([f for f in lines(log, "start") if int(f[0]) in victims]) == 2 * len(victims),
               timeout=30, what="the dead child's rows running again")
    assert proc.poll() is None and len(children_of(proc.pid)) == 2
    text = proc.log_path.read_text()
    assert f"worker process {victim} (child" in text and "was killed by signal 9; restarting it in 1s" in text
    # The first children were forked from the set-up parent (its command line, no --child);
    # the replacement is a new interpreter, which loads the code on disk and runs the checks.
    survivor, replacement = sorted(children_of(proc.pid), key=lambda pid: "--predecessors" in cmdline(pid))
    assert cmdline(survivor) == cmdline(proc.pid) and f"is process {survivor} (forked" in text
    assert f"--predecessors={victim}" in cmdline(replacement) and f"is process {replacement} (a new interpreter)" in text
    assert "reclaimed" in text
    for r in Instance.objects.filter(id__in=victims):
        if len(victims) == 1:  # the dead child's only row: it is charged
            assert r.attempt == 1 and "the worker died during step perform (attempt 0)" in r.last_error
        else:  # several were running: none is known to have killed it (a kill -9 from outside)
            assert r.attempt == 0 and "(attempt 0 not counted:" in r.last_error


def test_children_drain_and_exit_when_their_parent_is_killed(committed, host, queue_name, tmp_path):
    """On main both children kept claiming as orphans (a restarted host ran a second
    set beside them)."""
    proc = host(queue_name, DRAIN_TIMEOUT=1)
    kids = children_of(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: not any(alive(k) for k in kids), timeout=30, what="the orphaned children exited")


def test_a_job_that_kills_its_worker_fails_at_max_attempts_and_the_host_runs_on(
        committed, host, queue_name, tmp_path):
    """On main a job that os._exit()s ran again at every lease (16 runs in 90 s for
    max_attempts 3), taking a bystander down each time."""
    log = tmp_path / "runs.log"
    rid = gd.insert(DiesInStep, args={"log": str(log), "exit": True}, queue=queue_name)
    proc = host(queue_name, **SLOW_LEASE)
    wait_until(lambda: Instance.objects.get(id=rid).status == "failed", timeout=90, what="the job failed")
    r = Instance.objects.get(id=rid)
    assert r.attempt == DiesInStep.max_attempts
    assert "reached max_attempts (3)" in r.last_error
    assert len(lines(log, "start")) == DiesInStep.max_attempts
    assert proc.poll() is None
    wait_until(lambda: len(children_of(proc.pid)) == 2, timeout=30, what="both children running again")


def test_the_host_exits_non_zero_when_a_child_keeps_dying(committed, queue_name, tmp_path):
    """Every run of the job kills its process: each slot dies again right after each
    restart, and after MAX_RAPID_DEATHS in a row the host stops and exits non-zero
    (quick constants: tests/faults/quick_supervision.py)."""
    from tests.durable_app.supervision_machines import AlwaysDies
    from tests.integration.test_rundurable import child_env

    log = tmp_path / "runs.log"
    gd.insert(AlwaysDies, args={"log": str(log), "exit": True}, queue=queue_name)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "faults" / "quick_supervision.py"), "rundurable",
                           "--processes", "2", "--queue", f"{queue_name}=1", "--verbosity", "1"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode != 0
    assert "3 deaths in a row" in done.stderr and "keeps dying" in done.stderr
    assert 3 <= len(lines(log, "start")) <= 5  # one slot's three deaths, the other's at most two


def test_children_are_new_interpreters_when_another_thread_runs_in_the_parent(committed, queue_name, tmp_path):
    """A fork copies only the calling thread: a lock another thread held would stay held
    in the child. With a thread running since start-up (tests/settings.py), both
    children are started as new processes of the same command line, and they drain."""
    from tests.integration.test_rundurable import child_env

    ids = gd.insert_all([gd.Spec(gd.registry.get("tests.noop"), queue=queue_name) for _ in range(20)])
    env = dict(child_env(), GEN_DURABLE_TEST_BACKGROUND_THREAD="1")
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable", "--processes", "2",
                           "--burst", "--queue", f"{queue_name}=2", "--verbosity", "1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("(a new interpreter)") == 2 and "(forked" not in done.stderr, done.stderr[-3000:]
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}


def test_a_forked_childs_exit_status_reaches_the_host(committed, queue_name, tmp_path):
    """Burst children that leave rows they cannot run (a paused queue) exit 3 (their
    CommandError's returncode); the host, having forked them, exits 3 as well."""
    from tests.integration.test_rundurable import child_env

    gd.insert_all([gd.Spec(gd.registry.get("tests.noop"), queue=queue_name) for _ in range(5)])
    gd.pause_queue(queue_name)
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable", "--processes", "2",
                           "--burst", "--queue", f"{queue_name}=2", "--verbosity", "1"],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.stderr.count("(forked from this one") == 2, done.stderr[-3000:]
    assert done.returncode == 3, done.stderr[-3000:]
    # Said once, by the parent; each child's log line names what it left and why.
    assert done.stderr.count("rows were left that") == 1, done.stderr[-3000:]
    assert "CommandError: burst: rows were left that the workers did not run" in done.stderr
    assert done.stderr.count("stopping (burst mode: done)") == 2, done.stderr[-3000:]


def test_forked_children_write_their_own_buffered_log_records_and_never_a_copy_of_the_parents(
        committed, queue_name, tmp_path):
    """gen_durable's records go to a MemoryHandler that writes them out at exit
    (tests/settings.py). The parent's records buffered before a fork are written before
    it, so no child copies them; each child flushes its handlers (logging.shutdown)
    before it leaves. Without that, both children's records were lost and the parent's
    were written up to three times. The parent's own exit functions (here one that
    writes a file, as a pid file's clean-up would remove one) run once, in the parent."""
    from tests.integration.test_rundurable import child_env

    gd.insert_all([gd.Spec(gd.registry.get("tests.noop"), queue=queue_name) for _ in range(20)])
    log = tmp_path / "buffered.log"
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "manage.py"), "rundurable", "--processes", "2",
                           "--burst", "--queue", f"{queue_name}=2", "--verbosity", "1"],
                          cwd=ROOT, env=dict(child_env(), GEN_DURABLE_TEST_LOG_BUFFER=str(log)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    text = log.read_text()
    children = re.findall(r"child \d is process (\d+) \(forked", text)
    assert len(children) == 2 and text.count("needs up to") == 1, text
    for pid in children:  # each child's own first and last record
        assert f"worker {pid}-" in text and re.search(rf"worker {pid}-\w+ stopped", text), text
    ran_exit_functions = (tmp_path / "buffered.log.atexit").read_text().split()
    assert len(ran_exit_functions) == 1 and ran_exit_functions[0] not in children, ran_exit_functions  # the parent


def test_a_forked_child_is_reaped_once_whatever_polls_it(tmp_path):
    """ForkedChild as the supervisor's loop and its signal handler use it: a poll that
    finds another in progress (the handler interrupting the loop's) returns None instead
    of reaping twice; the next one reads the status; a child reaped elsewhere counts as
    dead (255), never as running for ever."""
    from gen_durable.management.commands.rundurable import ForkedChild

    pid = os.fork()
    if pid == 0:
        os._exit(7)
    child = ForkedChild(pid)
    with child._reaping:  # the loop's poll, interrupted
        assert child.poll() is None
    assert child.wait() == 7 and child.poll() == 7
    child.send_signal(signal.SIGTERM)  # a dead child is not signalled (its pid may be reused)

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)  # reaped by someone else
    assert ForkedChild(pid).poll() == 255

