"""Inline continuation: a Next that runs the next step in the same worker, on the claim
it holds, after committing the transition (docs/guide.md "Inline continuation").

Engine-level tests run an in-process worker (the `engine` fixture); flush-level tests
call flusher.flush on rows claimed through the real pick. Step logs are files
(tests/durable_app/inline_machines.py).
"""

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.test import override_settings

import gen_durable as gd
from gen_durable.conf import get_settings
from gen_durable.limiter import Admission, Limiter
from gen_durable.models import Instance
from gen_durable.outcomes import Next
from gen_durable.worker import claims, executor
from gen_durable.worker import flusher as flusher_module
from gen_durable.worker.flusher import flush
from tests.conftest import wait_until
from tests.helpers import record_rechecks
from tests.durable_app.inline_machines import InlineBoundary, InlineChain, InlineCounter, InlineOptIn
from tests.integration.test_statements import statements

WORKER = "inline-worker"


def log_lines(path):
    """(id, step, attempt, thread, pid) per line of an inline machine's log."""
    if not Path(path).exists():
        return []
    return [(int(i), s, int(a), int(t), int(p)) for i, s, a, t, p in
            (line.split() for line in Path(path).read_text().splitlines())]


def steps_of(path, id_):
    return [s for i, s, *_ in log_lines(path) if i == id_]


def status(id_):
    return Instance.objects.get(id=id_).status


class SpyLimiter(Limiter):
    """Needs admission for every job; records what it saw; denies the first `deny` calls."""

    def __init__(self, deny=0):
        self.calls, self.deny = [], deny

    def needs_admission(self, job):
        # The pick admits claimed rows too (configured limits); these tests watch the
        # admissions of continuations, so the spy leaves the first, picked step alone.
        return job.step != "a"

    def admit(self, jobs, queue):
        # What the row looks like when admission runs: the transition must be committed.
        with connection.cursor() as cur:
            cur.execute("SELECT status, step, locked_by FROM gen_durable WHERE id = %s", [jobs[0].id])
            self.calls.append((jobs[0].id, jobs[0].step, cur.fetchone()))
        if self.deny > 0:
            self.deny -= 1
            return Admission(denied=[j.id for j in jobs])
        return Admission(admitted={j.id: None for j in jobs})


def use_limiter(sup, limiter):
    for sched in sup.schedulers.values():
        sched.limiter = limiter


# --- the flush of an inline transition -------------------------------------------------

def test_inline_flush_keeps_the_claim_and_loads_the_next_inputs_in_bounded_statements(
        committed, django_assert_num_queries, queue_name):
    """The flush of N inline outcomes of rows without children: one statement for any N,
    the guarded UPDATE returning the inboxes the next steps start with (with children,
    see the next test); with `alone` it is the only round trip (no BEGIN, no COMMIT)."""
    for n, alone in ((2, False), (40, False), (3, True)):
        q = f"{queue_name}_{n}"
        gd.insert_all([gd.Spec(InlineChain, queue=q) for _ in range(n)])
        jobs = claims.pick(q, n, WORKER, 60)
        with connection.cursor() as cur:  # a heartbeat's worth of the lease spent: the flush must extend it
            cur.execute("UPDATE gen_durable SET lease_expires_at = now() + interval '1 second' WHERE queue = %s", [q])
        handed = gd.signal(jobs[0].id, "x", {"v": 1})
        later = gd.signal(jobs[0].id, "y", {"v": 2})
        jobs[0].awaits, jobs[0].inbox = ["x"], [gd.machine.Signal(handed, "x", {"v": 1}, None)]
        entries = [executor.to_entry(Next("b", state={"k": 1}, rate_limit="r"), InlineChain, j, consumed=(
            (handed,) if j is jobs[0] else ()), presented=(), inline=True) for j in jobs]
        assert {e.kind for e in entries} == {"inline"}
        with django_assert_num_queries(1 if alone else 3) as captured:  # [BEGIN,] flush[, COMMIT]
            result = flush(entries, alone=alone)
        assert len(statements(captured)) == 1
        assert set(result.committed.values()) == {"executing"} and result.stale == []
        with connection.cursor() as cur:
            cur.execute("SELECT DISTINCT status::text, step, state, locked_by, attempt, rate_limit, "
                        "lease_expires_at > now() + interval '2 seconds' FROM gen_durable WHERE queue = %s", [q])
            assert cur.fetchall() == [("executing", "b", '{"k": 1}', WORKER, 0, "r", True)]
            cur.execute("SELECT id FROM gen_durable_signals WHERE target_id = %s", [jobs[0].id])
            assert cur.fetchall() == [(later,)], "the handed signal is consumed as by a requeued Next"
        # The next step's inputs, as a re-pick would load them.
        assert [s.id for s in entries[0].inputs[0]] == [later] and not entries[0].inputs[1]
        # the same signals, field for field, as the pick's load reads them
        assert list(entries[0].inputs[0]) == claims.load_inputs([jobs[0].id], [jobs[0].id])[jobs[0].id][0]
        assert all(not inbox and not children for inbox, children in (e.inputs for e in entries[1:]))
        nxt = executor.continuation(jobs[0], entries[0])
        assert (nxt.step, nxt.state, nxt.attempt, [s.name for s in nxt.inbox]) == ("b", {"k": 1}, 0, ["y"])


def test_inline_flush_loads_children_only_for_rows_that_have_them(committed, django_assert_num_queries, queue_name):
    """A row gets children only from its own ScheduleChildren, which parks it: a chain
    claimed without children never has any, so its flush does not look for them. A
    row claimed with children has them reloaded for its next step (their status may
    have moved): one more statement, for those rows only."""
    parent, lone = gd.insert_all([gd.Spec(InlineChain, queue=queue_name) for _ in range(2)])
    child = gd.insert(InlineChain, queue=f"{queue_name}_children")
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET parent_id = %s WHERE id = %s", [parent, child])
    jobs = {j.id: j for j in claims.pick(queue_name, 2, WORKER, 60)}
    assert [c.id for c in jobs[parent].children] == [child] and jobs[lone].children == []
    with connection.cursor() as cur:  # the child moves on while the parent runs
        cur.execute("UPDATE gen_durable SET status = 'done' WHERE id = %s", [child])
    entries = {i: executor.to_entry(Next("b"), InlineChain, j, consumed=(), presented=(), inline=True)
               for i, j in jobs.items()}
    assert (entries[parent].has_children, entries[lone].has_children) == (True, False)
    with django_assert_num_queries(4) as captured:  # BEGIN, flush, children, COMMIT — even alone
        flush(list(entries.values()), alone=True)
    assert len(statements(captured)) == 2
    assert [(c.id, c.status) for c in entries[parent].inputs[1]] == [(child, "done")]
    assert not entries[lone].inputs[1]
    nxt = executor.continuation(jobs[parent], entries[parent])
    assert [c.status for c in nxt.children] == ["done"]
    again = executor.to_entry(Next("c"), InlineChain, nxt, consumed=(), presented=(), inline=True)
    assert again.has_children, "the children stay with the chain"

    entries = [executor.to_entry(Next("c"), InlineChain, executor.continuation(jobs[lone], entries[lone]),
                                 consumed=(), presented=(), inline=True)]
    with django_assert_num_queries(1):  # flush alone: no children to look for
        flush(entries, alone=True)


def test_an_inline_transition_is_a_hot_update_that_keeps_lease_and_claim_time(committed, queue_name):
    """While less than a heartbeat interval of its lease is spent, an inline commit
    changes no indexed column: lease_expires_at, updated_at (the claim) and eligible_at
    stay as they were, so Postgres writes it as a HOT update — no index entries
    (bench/results/history.md, round 8). Past that it renews the lease: the heartbeat skips a
    row a flush holds, so a chain of quick steps could otherwise miss every renewal
    (tests/races/test_inline_leases.py)."""
    s = get_settings()
    ttl, beat = s.LEASE_TTL, s.HEARTBEAT_INTERVAL
    gd.insert_all([gd.Spec(InlineChain, queue=queue_name) for _ in range(3)])
    fresh, spent, _ = claims.pick(queue_name, 3, WORKER, ttl)
    read = ("SELECT id, lease_expires_at, updated_at, eligible_at FROM gen_durable "
            "WHERE id = ANY (%s) ORDER BY id")
    hot = "SELECT pg_stat_get_xact_tuples_hot_updated('gen_durable'::regclass)"
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET lease_expires_at = now() + make_interval(secs => %s) WHERE id = %s",
                    [ttl - beat * 1.5, spent.id])
        cur.execute(read, [[fresh.id, spent.id]])
        before = {r[0]: r[1:] for r in cur.fetchall()}
        with transaction.atomic():  # the flush nests; the counter is this transaction's
            cur.execute(hot)
            hot_before = cur.fetchone()[0]
            result = flush([executor.to_entry(Next("b", state={"k": 1}), InlineChain, j, consumed=(),
                                              presented=(), inline=True) for j in (fresh, spent)])
            cur.execute(hot)
            hot_updates = cur.fetchone()[0] - hot_before
        cur.execute(read, [[fresh.id, spent.id]])
        after = {r[0]: r[1:] for r in cur.fetchall()}
    assert result.committed == {fresh.id: "executing", spent.id: "executing"}
    assert after[fresh.id] == before[fresh.id], "lease, claim time and eligible_at untouched"
    assert after[spent.id][1:] == before[spent.id][1:]
    assert after[spent.id][0] > before[spent.id][0], "a heartbeat's worth spent: renewed"
    assert hot_updates == 1, "the untouched row's transition is HOT; the renewed one is not"


def _other_snapshots() -> int:
    """Sessions that keep the claim's dead versions from being pruned: a snapshot in this
    database, or a transaction with an xid in any database — a statement's snapshot
    starts at the oldest xid still running on the whole server, and nothing newer than
    that is pruned without a fresh look (another suite's test transaction on the same
    server is enough)."""
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
                    "AND ((datname = current_database() AND backend_xmin IS NOT NULL) OR backend_xid IS NOT NULL)")
        return cur.fetchone()[0]


@pytest.mark.parametrize("fillfactor", [None, 80])
def test_a_wave_of_inline_transitions_is_hot_at_the_tables_fillfactor(committed, queue_name, fillfactor):
    """Rows inserted and claimed together sit side by side and commit their inline
    transitions in the same flush: each page must hold the next version of every one of
    its rows. The table's fillfactor (50, migration 0007) leaves that room: nearly all
    are HOT updates. The negative control, the earlier 80, leaves room for a few
    (bench/results/history.md, round 10)."""
    n = 200
    with connection.cursor() as cur:
        cur.execute("SELECT reloptions FROM pg_class WHERE oid = 'gen_durable'::regclass")
        table_options = cur.fetchone()[0]
        if fillfactor is not None:  # committed (the table was just truncated); restored below
            cur.execute(f"ALTER TABLE gen_durable SET (fillfactor = {fillfactor})")
    # A page is pruned of the claim's dead versions only when no other session holds them
    # (`_other_snapshots`): a worker of an earlier test that is still leaving, or another
    # suite on the same server whose transaction starts between the check and the flush,
    # makes the flush's versions miss the page. So the wave runs up to five times, each on
    # new rows: too little room on the pages (the control's fillfactor) fails every one, a
    # passing transaction only the one it met.
    tries = []
    try:
        for _ in range(5 if fillfactor is None else 1):
            wait_until(lambda: _other_snapshots() == 0, timeout=60,
                       what="no other session holds a snapshot here or an xid anywhere on the server")
            gd.insert_all([gd.Spec(InlineChain, queue=queue_name, state={"pad": "x" * 40}) for _ in range(n)])
            jobs = claims.pick(queue_name, n, WORKER, 60)
            assert len(jobs) == n
            entries = [executor.to_entry(Next("b", state={"k": j.id}), InlineChain, j, consumed=(), presented=(),
                                         inline=True) for j in jobs]
            with connection.cursor() as cur, transaction.atomic():  # the counter is this transaction's
                cur.execute("SELECT pg_stat_get_xact_tuples_hot_updated('gen_durable'::regclass)")
                before = cur.fetchone()[0]
                result = flush(entries)
                cur.execute("SELECT pg_stat_get_xact_tuples_hot_updated('gen_durable'::regclass)")
                tries.append(cur.fetchone()[0] - before)
            assert len(result.committed) == n
            if tries[-1] >= 0.9 * n:
                break
    finally:
        if fillfactor is not None:
            with connection.cursor() as cur:
                restore = dict(o.split("=", 1) for o in table_options)["fillfactor"]
                cur.execute(f"ALTER TABLE gen_durable SET (fillfactor = {int(restore)})")
    if fillfactor is None:
        assert max(tries) >= 0.9 * n, f"{tries} of {n} inline transitions HOT (each try)"
    else:
        assert tries[0] < 0.8 * n, f"{tries[0]} of {n} HOT at fillfactor {fillfactor}"


def test_inline_flush_of_a_row_we_no_longer_own_commits_nothing(committed, queue_name):
    gd.insert(InlineChain, queue=queue_name)
    (job,) = claims.pick(queue_name, 1, WORKER, 60)
    gd.cancel(job.id, "cancelled by test")
    entry = executor.to_entry(Next("b"), InlineChain, job, consumed=(), presented=(), inline=True)
    result = flush([entry])
    assert result.committed == {} and [e.id for e in result.stale] == [job.id]
    row = Instance.objects.get(id=job.id)
    assert (row.status, row.step, row.locked_by) == ("failed", "a", None)


def test_inline_is_refused_for_a_new_key_and_outside_a_worker(db, queue_name):
    gd.insert(InlineChain, queue=queue_name, concurrency_key="k1")
    (job,) = claims.pick(queue_name, 1, WORKER, 60)
    mk = lambda outcome, inline=True: executor.to_entry(outcome, InlineChain, job, consumed=(),  # noqa: E731
                                                          presented=(), inline=inline)
    assert mk(Next("b")).kind == "inline"
    assert mk(Next("b", concurrency_key=None)).kind == "inline"      # released, no gate slot held
    assert mk(Next("b", concurrency_key="k2")).kind == "next"        # a new key goes to the pick
    assert mk(Next("b", inline=False)).kind == "next"
    assert mk(Next("b"), inline=False).kind == "next"                # the drain / the chain bound
    job.slot = ("gate", 0)
    e = mk(Next("b", concurrency_key=None))
    assert (e.kind, e.slot) == ("next", ("gate", 0))                  # a held slot is credited by a requeue
    e = mk(Next("b"))
    assert (e.kind, e.slot) == ("inline", ("gate", 0))                # ...and kept by a continuation
    assert flusher_module._credited([e]) == []                        # (its commit credits nothing)


# --- the engine ------------------------------------------------------------------------

def test_a_chain_runs_in_one_worker_on_one_claim(engine, queue_name, tmp_path, events):
    log = tmp_path / "log"
    id_ = gd.insert(InlineChain, queue=queue_name, state={"log": str(log)})
    engine({queue_name: 2})
    wait_until(lambda: status(id_) == "done", what="done")
    lines = log_lines(log)
    assert [s for _, s, *_ in lines] == ["a", "b", "c"]
    assert len({p for *_, p in lines}) == 1, "one worker process ran the whole chain"
    cont = [(m["from"], m["to"]) for e, _, m in events if e == "inline.continue" and m["id"] == id_]
    assert cont == [("a", "b"), ("b", "c")]
    claimed = [ms["count"] for e, ms, m in events if e == "pick.stop" and m["queue"] == queue_name and ms["count"]]
    assert claimed == [1], "no requeue and re-pick between the steps"


def test_boundary_opt_out_and_single_opt_in(engine, queue_name, tmp_path, events):
    log = tmp_path / "log"
    b = gd.insert(InlineBoundary, queue=queue_name, state={"log": str(log)})
    o = gd.insert(InlineOptIn, queue=queue_name, state={"log": str(log), "orig": 1})
    engine({queue_name: 2})
    wait_until(lambda: status(b) == status(o) == "done", what="both done")
    cont = {(m["id"], m["from"], m["to"]) for e, _, m in events if e == "inline.continue"}
    assert cont == {(b, "b", "c"), (o, "a", "b")}
    # The continued step started from the committed state, not the step's in-place edit.
    assert Instance.objects.get(id=o).result == {"log": str(log), "orig": 1, "b_saw_mutation": False}


@pytest.mark.parametrize("orphan", ["cancelled", "reclaimed"])
def test_an_orphaned_continuation_commits_nothing_and_runs_nothing(engine, queue_name, tmp_path, events, orphan):
    log, held = tmp_path / "log", tmp_path / "hold"
    held.touch()
    spy = SpyLimiter()
    sup = engine({queue_name: 2})
    use_limiter(sup, spy)
    id_ = gd.insert(InlineChain, queue=queue_name, state={"log": str(log), "hold": str(held)})
    wait_until(lambda: steps_of(log, id_) == ["a"], what="step a running")
    with connection.cursor() as cur:
        if orphan == "cancelled":
            gd.cancel(id_, "cancelled mid-step")
        else:  # its lease lapsed and another worker re-claimed it
            cur.execute("UPDATE gen_durable SET locked_by = 'other-worker' WHERE id = %s", [id_])
    held.unlink()
    wait_until(lambda: any(e == "outcome.stale" and m["id"] == id_ for e, _, m in events), what="stale outcome")
    sup.stop()
    row = Instance.objects.get(id=id_)
    assert row.step == "a", "the transition to b was not committed"
    assert (row.status, row.locked_by) == (("failed", None) if orphan == "cancelled" else ("executing", "other-worker"))
    assert steps_of(log, id_) == ["a"], "b never ran"
    assert spy.calls == [], "an orphan never reaches the limiter"
    assert not any(e == "inline.continue" for e, _, _ in events)


def test_control_the_same_chain_not_orphaned_runs_on_and_admits_after_the_commit(engine, queue_name, tmp_path):
    log, held = tmp_path / "log", tmp_path / "hold"
    held.touch()
    spy = SpyLimiter()
    sup = engine({queue_name: 2})
    use_limiter(sup, spy)
    id_ = gd.insert(InlineChain, queue=queue_name, state={"log": str(log), "hold": str(held)})
    wait_until(lambda: steps_of(log, id_) == ["a"], what="step a running")
    held.unlink()
    wait_until(lambda: status(id_) == "done", what="done")
    assert steps_of(log, id_) == ["a", "b", "c"]
    worker = sup.schedulers[queue_name].worker_id
    # Admission ran after each transition had committed (the row at the next step, still ours).
    assert spy.calls == [(id_, "b", ("executing", "b", worker)), (id_, "c", ("executing", "c", worker))]


def test_a_denied_admission_requeues_through_the_pick(engine, queue_name, tmp_path, events):
    log = tmp_path / "log"
    spy = SpyLimiter(deny=1)
    sup = engine({queue_name: 2})
    use_limiter(sup, spy)
    id_ = gd.insert(InlineChain, queue=queue_name, state={"log": str(log), "rate": "api"})
    wait_until(lambda: status(id_) == "done", what="done")
    assert steps_of(log, id_) == ["a", "b", "c"]
    yields = [(m["step"], m["reason"]) for e, _, m in events if e == "inline.yield" and m["id"] == id_]
    assert yields == [("b", "throttled")]
    claimed = [ms["count"] for e, ms, m in events if e == "pick.stop" and m["queue"] == queue_name and ms["count"]]
    assert claimed == [1, 1], "b was requeued and claimed again by the pick"
    threads = {t for *_, t, _ in log_lines(log)}
    assert len(threads) <= 2


@override_settings(GEN_DURABLE={"EXTRA_QUEUES": ["q*"], "QUEUES": {"default": 4}, "INLINE": {"MAX_STEPS": 3}, "LEASE_TTL": 3,
                                "HEARTBEAT_INTERVAL": 0.5, "POLL_INTERVAL": 0.05, "MAX_POLL_INTERVAL": 0.2})
def test_a_chain_yields_after_max_steps(engine, queue_name, events):
    id_ = gd.insert(InlineCounter, queue=queue_name, state={"target": 7})
    engine({queue_name: 2})
    wait_until(lambda: status(id_) == "done", what="done")
    yields = [(ms["steps"], m["reason"]) for e, ms, m in events if e == "inline.yield" and m["id"] == id_]
    assert yields == [(3, "bound"), (3, "bound")]
    assert len([1 for e, _, m in events if e == "inline.continue" and m["id"] == id_]) == 4


def test_a_new_concurrency_key_yields_to_the_pick(engine, queue_name, events):
    id_ = gd.insert(InlineCounter, queue=queue_name, state={"target": 2, "switch_to": "other:1"},
                    concurrency_key="mine:1")
    engine({queue_name: 2})
    wait_until(lambda: status(id_) == "done", what="done")
    assert [m["reason"] for e, _, m in events if e == "inline.yield" and m["id"] == id_] == ["key"]
    assert Instance.objects.get(id=id_).concurrency_key == "other:1"


def test_k1_key_stays_held_across_the_chain(engine, queue_name):
    InlineCounter.PEAK.clear()
    ids = gd.insert_all([gd.Spec(InlineCounter, queue=queue_name, concurrency_key="solo:x",
                                 state={"target": 3, "sleep": 0.1, "tag": queue_name}) for _ in range(2)])
    ctl = gd.insert_all([gd.Spec(InlineCounter, queue=queue_name,
                                 state={"target": 3, "sleep": 0.1, "tag": queue_name + "ctl"}) for _ in range(2)])
    engine({queue_name: 4})
    wait_until(lambda: all(status(i) == "done" for i in ids + ctl), what="all done")
    assert InlineCounter.PEAK[queue_name] == 1, "two chains of one K=1 key overlapped"
    assert InlineCounter.PEAK[queue_name + "ctl"] == 2, "control: unkeyed chains do run side by side"


@pytest.mark.slow
def test_a_crash_mid_chain_reruns_the_committed_step_once(committed, engine, queue_name, tmp_path):
    from tests.races.test_faults import RUNDURABLE, ROOT  # the rundurable child-process setup

    import subprocess
    import sys  # noqa: F401

    log, kill = tmp_path / "log", tmp_path / "kill"
    kill.touch()
    id_ = gd.insert(InlineChain, queue=queue_name, state={"log": str(log), "kill": str(kill)})
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               GEN_DURABLE_TEST_DB_NAME=connection.settings_dict["NAME"])
    proc = subprocess.Popen(RUNDURABLE + ["--queue", f"{queue_name}=2", "--no-gc"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert proc.wait(60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    row = Instance.objects.get(id=id_)
    assert (row.status, row.step, row.state.get("a")) == ("executing", "b", True), "a's transition was durable"
    engine({queue_name: 2})  # a new worker: the reaper returns the row; b re-runs
    wait_until(lambda: status(id_) == "done", timeout=30, what="done")
    runs = Counter(s for s in steps_of(log, id_))
    assert runs == {"a": 1, "b": 2, "c": 1}, "the committed step a never re-ran; b re-ran once"
    assert [a for _, s, a, *_ in log_lines(log) if s == "b"] == [0, 1]


def test_a_continuation_is_not_rechecked_its_flush_proved_it_ours(engine, queue_name, tmp_path, settings,
                                                                   monkeypatch):
    """A prefetched chain re-checks its claim once, when it leaves the buffer; the commit
    of each inline transition proves the row ours again (guarded by locked_by), so a
    continuation starts without a still_owned round trip even when its step ran past
    RECHECK_FRESH."""
    from gen_durable.worker import scheduler

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 5}
    calls = record_rechecks(monkeypatch)
    log, first_hold, second_hold = (str(tmp_path / n) for n in ("log", "hold1", "hold2"))
    Path(first_hold).touch()
    Path(second_hold).touch()
    first = gd.insert(InlineChain, state={"log": log, "hold": first_hold}, queue=queue_name)
    engine({queue_name: 1})
    wait_until(lambda: steps_of(log, first) == ["a"], what="first chain holding in a")
    # The one slot is busy: the second row is claimed into the buffer (prefetched).
    second = gd.insert(InlineChain, state={"log": log, "hold": second_hold}, queue=queue_name)
    wait_until(lambda: status(second) == "executing", what="second row claimed into the buffer")
    time.sleep(scheduler.RECHECK_FRESH * 3)  # it waits past the window: re-checked as it starts
    os.unlink(first_hold)
    wait_until(lambda: steps_of(log, second) == ["a"], what="second chain holding in a")
    assert calls == [[second]]
    # a runs past RECHECK_FRESH: without the commit's proof, b would be re-checked.
    time.sleep(scheduler.RECHECK_FRESH * 3)
    os.unlink(second_hold)
    wait_until(lambda: status(first) == "done" and status(second) == "done", what="both chains done")
    assert steps_of(log, second) == ["a", "b", "c"]
    assert calls == [[second]]


def test_rows_buffered_behind_inline_chains_are_rechecked_about_once(engine, queue_name, settings, monkeypatch):
    """Prefetched rows wait behind the chains' continuations (which go first) for many
    RECHECK_FRESH windows. A re-check covers only the buffered rows expected to start
    while it is fresh (the start rate of re-checked rows), so each row is probed about
    once — a re-check of the whole buffer made every row go stale again before it
    started and be probed once per window it waited through (~8 probes a row here)."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 200}
    calls = record_rechecks(monkeypatch)
    n = 120
    ids = gd.insert_all([gd.Spec(InlineCounter, state={"target": 3, "sleep": 0.002}, queue=queue_name)
                         for _ in range(n)])
    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == n, timeout=120,
               what="every chain done")
    probes = Counter(i for call in calls for i in call)
    assert set(probes) <= set(ids)
    assert len(probes) >= n // 2, "the rows waited past RECHECK_FRESH: most are re-checked"
    assert sum(probes.values()) <= 2 * n, f"{sum(probes.values())} probes for {len(probes)} rows"
