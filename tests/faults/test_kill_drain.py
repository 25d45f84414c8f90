"""kill -9 of random `rundurable` children every few seconds during a 3-step drain
(docs/reliability.md "Processes"): exact counts from a side record of executions."""

import os
import random
import signal
import time

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.supervision_machines import ThreeSteps
from tests.faults import runs as side
from tests.faults.test_supervision import alive, children_of, host  # noqa: F401  (fixture)

STEPS = ("start", "second", "third")


@pytest.mark.slow
def test_kill_9_of_random_children_during_a_three_step_drain(committed, host, queue_name, tmp_path):
    log = tmp_path / "runs.log"
    keys = [f"k{i}" for i in range(6)]
    ids = [gd.insert(ThreeSteps, state={"log": str(log), "sleep": 0.15}, queue=queue_name,
                     concurrency_key=keys[i % len(keys)] if i % 3 == 0 else None)
           for i in range(90)]
    proc = host(queue_name, processes=3, concurrency=4)
    rng, killed = random.Random(8), {}
    wait_until(lambda: len(side.read(log)) > 20, timeout=60, what="the drain under way")
    for _ in range(4):  # a child every ~2 s, while rows are in flight
        kids = [k for k in children_of(proc.pid) if k not in killed]
        if kids:
            victim = rng.choice(kids)
            killed[victim] = time.monotonic()
            os.kill(victim, signal.SIGKILL)
        time.sleep(2)
    wait_until(lambda: not Instance.objects.filter(id__in=ids).exclude(status="done").exists(),
               timeout=120, what="every instance done")
    time.sleep(0.5)  # a cut-off step of a killed child may still be logging

    # Every instance exactly one terminal status; nothing runnable or executing left.
    assert Instance.objects.filter(id__in=ids, status="done").count() == len(ids)
    assert not Instance.objects.filter(queue=queue_name).exclude(status="done").exists()
    assert len(killed) == 4 and proc.poll() is None
    wait_until(lambda: len(children_of(proc.pid)) == 3, timeout=30, what="three children again")

    by_step = side.runs(log, killed)
    assert set(by_step) == {(i, s) for i in ids for s in STEPS}  # every step ran
    for (id_, step), done in by_step.items():
        # Re-runs only for steps in flight at a kill: every run but the last was cut off
        # by a kill — its process is one we killed (it had not logged its end, or its
        # outcome was not yet committed). Which process, not when: a killed process
        # logs nothing after its death.
        *cut, last = done
        assert last[2] is not None, (id_, step, done)
        for pid, _start, _end in cut:
            assert pid in killed, (id_, step, done)
        # Never two runs of one step at once (a re-run starts after its process died).
        assert not side.overlaps([(s, e, p) for p, s, e in done]), (id_, step, done)
    # K=1: never two instances of one key running at once.
    key_of = dict(Instance.objects.filter(id__in=ids).values_list("id", "concurrency_key"))
    for key in keys:
        spans = [(s, e, (i, st, p)) for (i, st), done in by_step.items() if key_of[i] == key for p, s, e in done]
        assert not side.overlaps(spans), (key, side.overlaps(spans)[:3])
    # The kills did cut steps off (else the test proves nothing), each re-run once.
    assert sum(len(done) - 1 for done in by_step.values()) >= 1
