"""The defaults claim in batches sized from the step rate (docs/guide.md, "Tuning
throughput"): a backlog of short jobs is drained in picks of many rows, where a fixed
PREFETCH 0 (the control) claims at most the free slots at a time."""

import pytest

import gen_durable as gd
from gen_durable.conf import get_settings
from tests.conftest import wait_until
from tests.durable_app.durable import noop

N = 2_000
CONCURRENCY = 10


def drain_and_count_picks(engine, queue_name, events):
    gd.insert_all([gd.Spec(noop, args={}, queue=queue_name) for _ in range(N)])
    engine({queue_name: CONCURRENCY})

    def done():
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM gen_durable WHERE queue = %s AND status = 'done'", [queue_name])
            return cur.fetchone()[0] == N

    wait_until(done, timeout=120, what=f"{N} jobs done")
    return [ms["count"] for e, ms, m in events if e == "pick.stop" and m["queue"] == queue_name and ms["count"]]


def test_the_defaults_claim_short_jobs_in_batches(engine, queue_name, events):
    assert get_settings().PREFETCH is None and get_settings().MIN_DEMAND is None  # the defaults
    picks = drain_and_count_picks(engine, queue_name, events)
    assert sum(picks) == N
    assert max(picks) > 4 * CONCURRENCY, picks  # claimed well beyond the free slots
    assert len(picks) < N / (2 * CONCURRENCY), len(picks)  # at least twice fewer picks than the control's floor


def test_control_a_fixed_prefetch_0_claims_at_most_the_free_slots(engine, queue_name, events, settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 0, "MIN_DEMAND": 1}
    picks = drain_and_count_picks(engine, queue_name, events)
    assert sum(picks) == N
    assert max(picks) <= CONCURRENCY
    assert len(picks) >= N / CONCURRENCY


def test_rows_claimed_while_steps_were_short_are_handed_back_when_they_turn_long(engine, queue_name, events):
    """A backlog of no-op jobs drives the claim-ahead up; the long jobs claimed with them
    then wait behind each other in the buffer. Once the claim-ahead shrank and they waited
    HAND_BACK_AFTER, they go back to the queue untouched (no attempt) for any worker."""
    from gen_durable.models import Instance
    from tests.durable_app.durable import sleep_job

    gd.insert_all([gd.Spec(noop, args={}, queue=queue_name) for _ in range(300)])
    long_ids = gd.insert_all([gd.Spec(sleep_job, args={"sleep": 0.6}, queue=queue_name) for _ in range(5)])
    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.filter(id__in=long_ids, status="done").count() == 5, timeout=60,
               what="the long jobs done")
    handed = [ms["count"] for e, ms, m in events if e == "scheduler.handed_back" and m["queue"] == queue_name]
    assert sum(handed) >= 1, "the long rows waited in the buffer beyond the claim-ahead"
    assert set(Instance.objects.filter(id__in=long_ids).values_list("attempt", flat=True)) == {0}


def test_control_a_fixed_prefetch_keeps_its_rows(engine, queue_name, events, settings):
    from gen_durable.models import Instance
    from tests.durable_app.durable import sleep_job

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "PREFETCH": 10, "MIN_DEMAND": 1}
    long_ids = gd.insert_all([gd.Spec(sleep_job, args={"sleep": 0.6}, queue=queue_name) for _ in range(4)])
    engine({queue_name: 1})
    wait_until(lambda: Instance.objects.filter(id__in=long_ids, status="done").count() == 4, timeout=60,
               what="the long jobs done")
    assert not [e for e, _, m in events if e == "scheduler.handed_back" and m["queue"] == queue_name]
