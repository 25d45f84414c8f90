"""A chain's lease under load (docs/design.md "Inline and async", "Leases").

An inline commit keeps the lease (a HOT update) until a heartbeat interval of it is
spent, then renews it. The heartbeat skips a row a flush holds (SKIP LOCKED), and a chain
of quick steps is in nearly every flush, so the heartbeat alone misses such rows; the
renewal in the commit must keep them looking renewed at every heartbeat, because a worker
process starting on the same host (`Scheduler.reclaim`) takes this host's rows whose lease
has not been renewed for two heartbeats — from under the live chain, which then runs a
step again. Negative control: the same load with the lease kept down to half of it (the
first form of the change, found by a review) lets live chains fall into reclaim's range
within about a second.
"""

import time

import pytest
from django.db import connection
from django.test import override_settings

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker import flusher
from gen_durable.worker.claims import reclaim
from gen_durable.worker.supervisor import worker_prefix
from tests.conftest import wait_until
from tests.durable_app.inline_machines import InlineCounter

LEASES = {"QUEUES": {"default": 4}, "LEASE_TTL": 3, "HEARTBEAT_INTERVAL": 0.5, "POLL_INTERVAL": 0.05,
          "MAX_POLL_INTERVAL": 0.2, "INLINE": {"MAX_STEPS": 10 ** 9, "MAX_SECONDS": 1000}, "DRAIN_TIMEOUT": 2}
MARGIN = 3 - 2 * 0.5  # Scheduler.reclaim's: LEASE_TTL - 2 x HEARTBEAT_INTERVAL
WATCH = 6.0  # seconds of chains hammering the flush


def _leases_left(ids):
    with connection.cursor() as cur:
        cur.execute("SELECT extract(epoch FROM lease_expires_at - clock_timestamp())::float8 FROM gen_durable "
                    "WHERE id = ANY (%s) AND status = 'executing'", [list(ids)])
        return [r[0] for r in cur.fetchall()]


def _hammer(engine, queue):
    """Run 8 endless chains of no-op steps; whenever a chain's lease falls into reclaim's
    range, reclaim as a sibling starting on this host would. Returns (what it took,
    the lowest lease seen)."""
    ids = gd.insert_all([gd.Spec(InlineCounter, queue=queue, state={"target": 10 ** 9, "tag": queue})
                         for _ in range(8)])
    engine({queue: 8})
    wait_until(lambda: len(_leases_left(ids)) == 8, what="the chains running")
    lowest, taken = float("inf"), []
    deadline = time.monotonic() + WATCH
    while time.monotonic() < deadline and not taken:
        left = _leases_left(ids)
        lowest = min([lowest, *left])
        if any(x < MARGIN for x in left):
            taken = reclaim(queue, worker_prefix(queue), MARGIN)
        time.sleep(0.002)
    for i in ids:
        gd.cancel(i, "test over")
    return taken, lowest, ids


@override_settings(GEN_DURABLE=LEASES)
def test_a_live_chain_never_looks_dead_to_a_sibling_starting_on_the_host(committed, engine, queue_name):
    taken, lowest, ids = _hammer(engine, queue_name)
    assert not taken, f"live chains reclaimed from under their worker: {taken} (lowest lease {lowest:.3f} s)"
    assert lowest >= MARGIN
    assert not Instance.objects.filter(id__in=ids, attempt__gt=0).exists()


@override_settings(GEN_DURABLE=LEASES)
def test_control_a_lease_kept_down_to_half_lets_a_sibling_take_live_chains(committed, engine, queue_name,
                                                                           monkeypatch):
    arrays = flusher._arrays

    def half(entries):
        params = arrays(entries)
        params["renew"] = params["lease"] / 2
        return params

    monkeypatch.setattr(flusher, "_arrays", half)
    taken, lowest, _ = _hammer(engine, queue_name)
    if not taken:  # a machine fast enough that the heartbeat rarely meets a held row
        pytest.skip(f"the control did not reproduce in {WATCH:g} s (lowest lease {lowest:.3f} s)")
    assert lowest < MARGIN
