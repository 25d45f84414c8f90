"""Slot accounting of the feeder (worker/scheduler.py): no database, no threads started."""

from types import SimpleNamespace

from gen_durable.conf import get_settings
from gen_durable.worker.scheduler import Scheduler


def scheduler(concurrency=4, prefetch=0, max_batch=3):
    s = get_settings()
    settings = SimpleNamespace(**{**s.__dict__, "PREFETCH": prefetch, "MIN_DEMAND": 1,
                                  "FLUSH": {"MAX_BATCH": max_batch, "MAX_DELAY": 0}})
    return Scheduler("q", concurrency, worker_id="w", prefix="p", flusher=None, limiter=None,
                     settings=settings)


def test_running_and_buffered_rows_take_slots():
    sch = scheduler(concurrency=4, prefetch=2)
    sch.buffer.extend([SimpleNamespace(id=i) for i in range(2)])
    sch.in_flight = {10: object(), 11: object()}
    sch.running = 2
    assert sch.demand() == 4 + 2 - (2 + 2)


def test_rows_waiting_for_their_flush_hold_no_slot_up_to_max_batch():
    sch = scheduler(concurrency=4, max_batch=3)
    sch.in_flight = {i: object() for i in range(3)}  # all three handed to the flusher
    sch.running = 0
    assert sch.demand() == 4
    sch.in_flight[99] = object()                    # a fourth waiting row: beyond MAX_BATCH
    assert sch.demand() == 3


def test_settle_frees_a_whole_flushed_batch_and_wakes_the_feeder():
    sch = scheduler()
    sch.in_flight = {1: object(), 2: object(), 3: object()}
    sch.settle([1, 2, 7])
    assert list(sch.in_flight) == [3] and sch.completed == 2 and sch._wake.is_set()
    sch._wake.clear()
    sch.settle([3], completed=False)  # a failed flush: freed, not counted as completed
    assert sch.in_flight == {} and sch.completed == 2 and sch._wake.is_set()
