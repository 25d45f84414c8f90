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
from django.test import override_settings

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.worker import flusher
from gen_durable.worker.claims import reclaim
from gen_durable.worker.supervisor import worker_prefix
from tests.conftest import wait_until
from tests.durable_app.inline_machines import InlineCounter

LEASES = {"EXTRA_QUEUES": ["q*"], "QUEUES": {"default": 4}, "LEASE_TTL": 3, "HEARTBEAT_INTERVAL": 0.5, "POLL_INTERVAL": 0.05,
          "MAX_POLL_INTERVAL": 0.2, "INLINE": {"MAX_STEPS": 10 ** 9, "MAX_SECONDS": 1000}, "DRAIN_TIMEOUT": 2}
MARGIN = 3 - 2 * 0.5  # Scheduler.reclaim's: LEASE_TTL - 2 x HEARTBEAT_INTERVAL
ATTEMPTS = 2000  # reclaims while the chains run: a few leases' worth of them
# The control's budget: on a fast host the heartbeat meets a held row less often, and the
# race took more than ATTEMPTS reclaims in some CI runs (it stops at the first it finds).
CONTROL_ATTEMPTS = 3 * ATTEMPTS


def _executing(ids):
    return Instance.objects.filter(id__in=ids, status="executing").count()


def _hammer(engine, queue, attempts=ATTEMPTS):
    """Run 8 endless chains of no-op steps, and meanwhile reclaim over and over as a
    sibling starting on this host would (reclaim.sql takes this host's rows whose lease
    has not been renewed for two heartbeats). Returns (the rows it took, the chains)."""
    ids = gd.insert_all([gd.Spec(InlineCounter, queue=queue, state={"target": 10 ** 9, "tag": queue})
                         for _ in range(8)])
    engine({queue: 8})
    wait_until(lambda: _executing(ids) == 8, what="the chains running")
    taken = []
    for _ in range(attempts):
        taken = reclaim(queue, worker_prefix(queue), MARGIN)
        if taken:
            break
        time.sleep(0.002)
    for i in ids:
        gd.cancel(i, "test over")
    return taken, ids


@override_settings(GEN_DURABLE=LEASES)
def test_a_live_chain_never_looks_dead_to_a_sibling_starting_on_the_host(committed, engine, queue_name):
    taken, ids = _hammer(engine, queue_name)
    assert not taken, f"live chains reclaimed from under their worker: {taken}"
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
    taken, ids = _hammer(engine, queue_name, CONTROL_ATTEMPTS)
    if not taken:  # a machine fast enough that the heartbeat rarely meets a held row
        pytest.skip(f"the control did not reproduce in {CONTROL_ATTEMPTS} reclaims")
    assert set(taken) <= set(ids)
