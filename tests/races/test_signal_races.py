"""Hammer: a signal racing the park is never lost (docs/design.md#signals).

Thousands of rounds of one race: an instance is claimed, runs a step returning
`Await("go")`, and its flush parks it and rechecks the inbox — while its "go" is being
delivered at a random moment around that park, from threads of this process and from
a second OS process. Whatever the interleaving (delivered before the park → the
recheck wakes it; during the park → the wake queues behind the row lock and flips the
parked row; after → a plain wake), every instance must finish.

The module is imported by the spawned signaller process too: keep its top level free
of anything that needs django.setup().
"""

import multiprocessing
import os
import queue as queue_mod
import random
import threading
import time

import gen_durable as gd
from django.db import connection
from gen_durable.worker import flusher
from gen_durable.worker.claims import pick
from gen_durable.worker.executor import execute
from tests.conftest import wait_until
from tests.durable_app.signal_machines import HammerAwait

ROUNDS = 2400
WORKER_THREADS = 2
BATCH = 4  # rows per claim, flushed together as the engine's group commit does
SIGNALLER_THREADS = 2
MAX_JITTER = 0.003  # seconds after the claim at which the signal is sent (the park takes ~1 ms)
DB_ENV = "GD_TEST_DB_NAME"


def _async_commits():
    """Stop this session's commits waiting for the WAL fsync (≈3 ms each here).

    Locks are still released and rows become visible exactly at commit, so every
    interleaving of the race is unchanged; only durability against a server crash —
    not under test here — is relaxed. Without it the hammer is fsync-bound.
    """
    with connection.cursor() as cur:
        cur.execute("SET synchronous_commit TO off")


def _signal_process(ids, out):
    """The second OS process: deliver "go" to each (id, at) it is handed, at `at`."""
    import django
    from django.conf import settings

    settings.DATABASES["default"]["NAME"] = os.environ[DB_ENV]  # the test database
    django.setup()
    from django.db import connections

    sent = 0
    try:
        _async_commits()
        out.put(("ready", os.getpid()))
        while True:
            item = ids.get()
            if item is None:
                break
            id_, delay = item
            time.sleep(delay)
            gd.signal(id_, "go", {"id": id_, "by": "process"})
            sent += 1
        out.put(("done", sent))
    except BaseException as exc:  # reported to the test
        out.put(("error", repr(exc)))
    finally:
        connections.close_all()


def _count(sql_text, params=()):
    with connection.cursor() as cur:
        cur.execute(sql_text, params)
        return cur.fetchone()[0]


def test_a_signal_racing_the_park_is_never_lost(transactional_db, queue_name, monkeypatch):
    ids = gd.insert_all([gd.Spec(HammerAwait, queue=queue_name) for _ in range(ROUNDS)])

    # the second OS process, on the same test database
    monkeypatch.setenv(DB_ENV, connection.settings_dict["NAME"])
    ctx = multiprocessing.get_context("spawn")
    proc_ids, proc_out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_signal_process, args=(proc_ids, proc_out), daemon=True)
    proc.start()
    try:
        kind, _ = proc_out.get(timeout=60)
        assert kind == "ready", "the signaller process did not start"

        lanes = [queue_mod.Queue() for _ in range(SIGNALLER_THREADS)]
        stop = threading.Event()
        errors, sent, parked_first, recheck_woke = [], [0], [0], [0]
        tally_lock = threading.Lock()

        def signaller(lane):
            try:
                _async_commits()
                while True:
                    item = lane.get()
                    if item is None:
                        return
                    id_, at = item
                    left = at - time.monotonic()
                    if left > 0:
                        time.sleep(left)
                    gd.signal(id_, "go", {"id": id_, "by": "thread"})
                    with tally_lock:
                        sent[0] += 1
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        def dispatch(id_, rng):
            delay = rng.uniform(0, MAX_JITTER)
            lane = rng.randrange(SIGNALLER_THREADS + 1)
            if lane == SIGNALLER_THREADS:
                proc_ids.put((id_, delay))
            else:
                lanes[lane].put((id_, time.monotonic() + delay))

        def worker(n):
            rng = random.Random(n)
            name = f"hammer-{n}"
            try:
                _async_commits()
                while not stop.is_set():
                    jobs = pick(queue_name, BATCH, name, 60)
                    if not jobs:
                        stop.wait(0.001)
                        continue
                    for job in jobs:
                        if job.step == "start":
                            dispatch(job.id, rng)  # the signals are on their way ...
                    entries = [execute(job) for job in jobs]
                    result = flusher.flush(entries)  # ... while the steps park (group commit)
                    assert not result.stale, "a hammer outcome lost its claim"
                    with tally_lock:
                        for entry in entries:
                            if entry.kind == "await":
                                if result.committed[entry.id] == "runnable":
                                    recheck_woke[0] += 1
                                else:
                                    parked_first[0] += 1
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=signaller, args=(lane,), daemon=True) for lane in lanes]
        threads += [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(WORKER_THREADS)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: errors or recheck_woke[0] + parked_first[0] >= ROUNDS, timeout=120,
                       what="every instance to run its Await step")
            for lane in lanes:
                lane.put(None)
            proc_ids.put(None)
            kind, proc_sent = proc_out.get(timeout=60)
            assert kind == "done", f"signaller process failed: {proc_sent}"
            for t in threads[:SIGNALLER_THREADS]:
                t.join(60)
            # every signal is committed; the system is quiescent once nothing is runnable/executing
            wait_until(lambda: errors or _count(
                "SELECT count(*) FROM gen_durable WHERE queue = %s AND status IN ('runnable', 'executing')",
                [queue_name]) == 0, timeout=60, what="the woken instances to finish")
        finally:
            stop.set()
            for lane in lanes:
                lane.put(None)
            for t in threads:
                t.join(30)
        assert not errors, errors
    finally:
        proc_ids.put(None)
        proc.join(30)
        if proc.is_alive():
            proc.kill()

    assert sent[0] + proc_sent == ROUNDS
    assert proc_sent > 0 and sent[0] > 0
    lost = _count(
        "SELECT count(*) FROM gen_durable g WHERE g.queue = %s AND g.status = 'awaiting_signal' "
        "AND EXISTS (SELECT 1 FROM gen_durable_signals s WHERE s.target_id = g.id AND s.name = ANY (g.awaits))",
        [queue_name])
    assert lost == 0, f"{lost} lost wake-ups (parked with a matching signal in the inbox)"
    assert _count("SELECT count(*) FROM gen_durable WHERE queue = %s AND status = 'done'", [queue_name]) == ROUNDS
    assert _count(
        "SELECT count(*) FROM gen_durable WHERE queue = %s AND (result->'got'->>'id')::bigint = id",
        [queue_name]) == ROUNDS
    assert _count("SELECT count(*) FROM gen_durable_signals s JOIN gen_durable g ON g.id = s.target_id "
                  "WHERE g.queue = %s", [queue_name]) == 0
    # both sides of the race were exercised: signals that beat the park (caught by the
    # recheck) and parks that the signal had to wake
    assert recheck_woke[0] > 0 and parked_first[0] > 0, (recheck_woke[0], parked_first[0])
    assert len(ids) == ROUNDS
