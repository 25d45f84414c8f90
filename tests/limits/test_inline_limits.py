"""Inline continuation under configured limits (docs/guide.md "Inline continuation"):
a chain keeps its gate slot without ever exceeding the gate, and a continued step's rate
limit is admitted after the transition commits — a denial requeues it. Both backends."""

from django.db import connection

import gen_durable as gd
from gen_durable.models import Instance
from tests.conftest import wait_until
from tests.durable_app.inline_machines import InlineChain, InlineCounter
from tests.limits.conftest import buckets, collapse


def status(id_):
    return Instance.objects.get(id=id_).status


def chains(queue, key, tag, n=2):
    return gd.insert_all([gd.Spec(InlineCounter, queue=queue, concurrency_key=key,
                                  state={"target": 3, "sleep": 0.1, "tag": tag}) for _ in range(n)])


def test_a_chain_holds_its_gate_slot_and_never_exceeds_the_gate(configure, engine, queue_name, events):
    configure(gates={"pool": {"limit": 1}, "wide": {"limit": 2}})
    InlineCounter.PEAK.clear()
    ids = chains(queue_name, "pool:x", "pool") + chains(queue_name, "wide:x", "wide")
    engine({queue_name: 4}, gc=False)  # no reconciler: the counters must be right on their own
    wait_until(lambda: all(status(i) == "done" for i in ids), timeout=30, what="all done")
    assert InlineCounter.PEAK["pool"] == 1, "a limit-1 gate ran two chains at once"
    assert InlineCounter.PEAK["wide"] == 2, "control: a gate of 2 does let two chains overlap"
    assert sum(1 for e, _, m in events if e == "inline.continue" and m["id"] in ids) == 2 * len(ids)
    if configure.backend == "postgres":
        assert {(k, cap, avail) for k, _, cap, avail in buckets()} == {("pool", 1.0, 1.0), ("wide", 2.0, 2.0)}, \
            "every held slot was credited exactly once, at the end of its chain"


def test_a_continued_steps_rate_limit_is_admitted_after_the_commit_and_a_denial_requeues(
        configure, engine, queue_name, events):
    configure(rates={"tight": {"allowed": 1, "period": 3600, "burst": 1}})
    first = gd.insert(InlineChain, queue=queue_name, state={"rate": "tight"})
    engine({queue_name: 2})
    wait_until(lambda: status(first) == "done", what="the first chain, on the one token")
    second = gd.insert(InlineChain, queue=queue_name, state={"rate": "tight"})
    wait_until(lambda: any(e == "inline.yield" and m["id"] == second for e, _, m in events), what="denied")
    assert [m["reason"] for e, _, m in events if e == "inline.yield" and m["id"] == second] == ["throttled"]
    with connection.cursor() as cur:
        cur.execute("SELECT status::text, step, rate_limit FROM gen_durable WHERE id = %s", [second])
        row = cur.fetchone()
    # Runnable (deferred until a token), or for a moment claimed by a pick that denies it.
    assert row[1:] == ("b", "tight") and row[0] in ("runnable", "executing"), \
        "requeued at the committed step b with its rate limit, for the pick to admit"
    assert status(second) != "done"


def test_an_inline_outcome_that_cannot_be_stored_gives_its_chains_gate_slot_back(configure, committed, queue_name):
    """A chain holds its gate slot across steps (an inline commit credits nothing). When
    its inline outcome cannot be stored (here a state Postgres' jsonb refuses), the
    flusher fails the instance with a Stop — and that Stop must give the slot back, or
    the gate stays full until the GC's reconcile (found by a review)."""
    from gen_durable.outcomes import Next
    from gen_durable.worker import claims, executor
    from gen_durable.worker.flusher import Flusher

    limiter = configure(gates={"pool": {"limit": 1}})
    first, second = (gd.insert(InlineChain, queue=queue_name, concurrency_key="pool:x") for _ in range(2))
    (job,) = claims.pick(queue_name, 2, "slot-worker", 60, gates=limiter.gate_names(), limiter=limiter)
    assert job.id == first and job.slot is not None, "the gate admits one"
    entry = executor.to_entry(Next("b"), InlineChain, job, consumed=(), presented=(), inline=True)
    assert entry.kind == "inline"
    entry.state = '{"text": "\\u0000"}'  # valid JSON that jsonb cannot hold
    Flusher(limiter=limiter)._flush([(entry, None)])
    row = Instance.objects.get(id=first)
    assert row.status == "failed" and row.last_error.startswith("outcome could not be stored")
    collapse(queue_name)  # the pick deferred the row the full gate denied
    (nxt,) = claims.pick(queue_name, 2, "slot-worker", 60, gates=limiter.gate_names(), limiter=limiter)
    assert nxt.id == second, "the failed chain's slot was given back: the gate admits the next row"
