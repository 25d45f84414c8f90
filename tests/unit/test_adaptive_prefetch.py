"""The adaptive claim-ahead (PREFETCH / MIN_DEMAND None, the defaults): sized from the
steps measured in each window, on an injected clock (worker/scheduler.py `Scheduler._adapt`)."""

import math
from types import SimpleNamespace

import pytest

from gen_durable.conf import get_settings
from gen_durable.worker import scheduler as mod
from gen_durable.worker.scheduler import Scheduler

W = mod.PREFETCH_WINDOW


def scheduler(concurrency=10, prefetch=None, min_demand=None):
    s = get_settings()
    settings = SimpleNamespace(**{**s.__dict__, "PREFETCH": prefetch, "MIN_DEMAND": min_demand})
    sch = Scheduler("q", concurrency, worker_id="w", prefix="p", flusher=None, limiter=None, settings=settings)
    sch._rate_mark = (0.0, 0, 0.0, 0)
    return sch


def window(sch, start, completed, step_seconds=None, length=W * 1.01):
    """A window of `length` s in which `completed` steps of `step_seconds` each ended (one
    step thread's record) and settled; returns its end."""
    sch.completed += completed
    if step_seconds is not None and completed:
        acc = sch._thread_busy.setdefault("thread", [0.0, 0])
        acc[0] += completed * step_seconds
        acc[1] += completed
    end = start + length
    sch._adapt(end)
    return end


def test_the_defaults_start_without_claim_ahead():
    sch = scheduler()
    assert (sch.prefetch, sch.min_demand) == (0, 1)  # nothing measured: a long-step queue buffers nothing
    assert sch.demand() == 10


def test_short_steps_get_a_deep_buffer_and_batched_claims():
    sch = scheduler(concurrency=10)
    # 1 ms steps: ten slots run 10,000 steps/s, though the shallow buffer settled only 400/s.
    window(sch, 0.0, int(400 * W), step_seconds=0.001)
    assert sch.step_rate == pytest.approx(10_000)
    assert sch.prefetch == math.ceil(10_000 * mod.PREFETCH_HORIZON)
    assert sch.min_demand == sch.prefetch // 4
    # Claims wait for a quarter of the buffer, so the rest still holds rows for the threads:
    sch.running, sch.buffer = 10, [SimpleNamespace(id=i) for i in range(sch.prefetch - sch.min_demand + 1)]
    assert 0 < sch.demand() < sch.min_demand


def test_no_op_steps_reach_the_cap():
    sch = scheduler(concurrency=10)
    window(sch, 0.0, 10, step_seconds=0.00003)
    assert sch.prefetch == mod.PREFETCH_MAX and sch.min_demand == mod.PREFETCH_MAX // 4


def test_the_first_reading_comes_once_concurrency_steps_ended():
    sch = scheduler(concurrency=10)
    window(sch, 0.0, 9, step_seconds=0.0001, length=W / 20)
    assert sch.prefetch == 0  # too early, too few
    window(sch, W / 20, 1, step_seconds=0.0001, length=W / 20)
    assert sch.prefetch == mod.PREFETCH_MAX


def test_long_steps_buffer_nothing():
    sch = scheduler(concurrency=10)
    window(sch, 0.0, 1, step_seconds=1.25, length=1.0)  # ten threads on 1.25 s steps: 8 steps/s
    assert sch.step_rate == pytest.approx(8)
    assert sch.prefetch == 1 and sch.min_demand == 1  # a free slot is filled at once
    sch2 = scheduler(concurrency=10)
    t = 0.0
    for _ in range(4):
        t = window(sch2, t, 0)  # hour-long steps: nothing ends
    assert (sch2.prefetch, sch2.min_demand) == (0, 1)


def test_a_falling_rate_shrinks_the_buffer_within_a_few_windows():
    sch = scheduler(concurrency=10)
    t = window(sch, 0.0, 100, step_seconds=0.0005)
    sizes = []
    for _ in range(10):
        t = window(sch, t, 0)  # the steps turned long: none ends
        sizes.append(sch.prefetch)
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] <= 1


def test_the_rate_is_read_once_a_window():
    sch = scheduler(concurrency=10)
    sch.completed = 5
    sch._adapt(W / 2)  # too early, too few steps: no reading
    assert sch.step_rate == 0 and sch.prefetch == 0
    sch._adapt(W)
    assert sch.step_rate == pytest.approx(5 / W)


def test_async_steps_count():
    sch = scheduler(concurrency=300)
    sch._async_busy, sch._async_timed = 300 * 1.0, 300  # 300 async steps awaiting 1 s each
    sch.completed = 300
    sch._adapt(1.0)
    assert sch.step_rate == pytest.approx(300)
    assert sch.prefetch == math.ceil(300 * mod.PREFETCH_HORIZON)


@pytest.mark.parametrize("fixed", [{"prefetch": 0, "min_demand": 1}, {"prefetch": 200, "min_demand": 50}])
def test_fixed_settings_are_kept(fixed):
    sch = scheduler(concurrency=10, **fixed)
    window(sch, 0.0, 2_000, step_seconds=0.0001)
    assert (sch.prefetch, sch.min_demand) == (fixed["prefetch"], fixed["min_demand"])


def test_a_fixed_prefetch_with_an_adaptive_min_demand():
    sch = scheduler(concurrency=10, prefetch=100)
    window(sch, 0.0, 5)
    assert sch.prefetch == 100 and sch.min_demand == 100 // 4
