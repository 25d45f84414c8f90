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


# --- hand-back of rows that wait too long (`Scheduler._hand_back`) -------------------------

def buffered(sch, ids, at, is_async=False):
    rows = [SimpleNamespace(id=i, buffered_at=at, is_async=is_async, slot=None) for i in ids]
    sch.buffer.extend(rows)
    return rows


def released_by(sch, monkeypatch):
    back = []

    def release(jobs):  # the statement itself is release.sql (tests/integration)
        back.extend(j.id for j in jobs)
        return [j.id for j in jobs]

    monkeypatch.setattr(sch, "_release", release)
    return back


def test_rows_beyond_the_claim_ahead_are_handed_back_once_they_waited(monkeypatch):
    sch = scheduler(concurrency=2)
    back = released_by(sch, monkeypatch)
    sch.running, sch.prefetch = 2, 3          # the steps turned long: 3 rows may wait
    buffered(sch, range(10), at=0.0)
    assert sch._hand_back(mod.HAND_BACK_AFTER / 2) == 0  # young rows stay
    assert sch._hand_back(mod.HAND_BACK_AFTER + 0.1) == 7
    assert sorted(back) == [3, 4, 5, 6, 7, 8, 9]          # from the tail; the head starts next
    assert [j.id for j in sch.buffer] == [0, 1, 2]


def test_nothing_is_handed_back_within_the_claim_ahead(monkeypatch):
    sch = scheduler(concurrency=2, prefetch=500)  # a fixed PREFETCH: its rows may wait
    back = released_by(sch, monkeypatch)
    sch.running = 2
    buffered(sch, range(100), at=0.0)
    assert sch._hand_back(60.0) == 0 and back == []


def test_continuations_and_timed_out_rows_are_never_handed_back(monkeypatch):
    sch = scheduler(concurrency=1)
    back = released_by(sch, monkeypatch)
    sch.running = 1
    chain = SimpleNamespace(id=1, buffered_at=0.0, chain=("x", 2, "a"), is_async=False, slot=None)
    timed_out = mod.TimedOut(SimpleNamespace(id=2), 1.0, 2.0)
    sch.buffer.extend([chain, timed_out])
    assert sch._hand_back(60.0) == 0 and back == []


def test_sync_rows_waiting_for_an_async_only_queues_thread_are_handed_back(monkeypatch):
    sch = scheduler(concurrency=20)
    sch.max_threads = 1                       # an async-only queue
    back = released_by(sch, monkeypatch)
    sch.running = 1
    buffered(sch, range(5), at=0.0)           # sync rows: one runs next, four wait for the thread
    assert sch.demand() == 20 + sch.prefetch - (1 + 5 - 4)  # the waiting ones take no async slot
    assert sch._hand_back(mod.HAND_BACK_AFTER + 0.1) == 4
    assert [j.id for j in sch.buffer] == [0]


def test_rows_the_release_skipped_stay_buffered(monkeypatch):
    sch = scheduler(concurrency=1)
    monkeypatch.setattr(sch, "_release", lambda jobs: [])  # locked at that instant (SKIP LOCKED)
    sch.running = 1
    buffered(sch, range(3), at=0.0)
    assert sch._hand_back(60.0) == 0
    assert sorted(j.id for j in sch.buffer) == [0, 1, 2]
