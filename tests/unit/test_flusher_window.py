"""The flusher's group-commit window (FLUSH.MAX_DELAY, worker/flusher.py): no database.

`_take` hands out the next batch: at once when MAX_BATCH outcomes wait or no step that
could add one is running; otherwise it waits until the oldest waiting outcome is
MAX_DELAY old — counted from that outcome's submit, so outcomes that queued while the
previous flush ran are not held back again.
"""

import threading
import time

from gen_durable.worker.flusher import Flusher


def take_in_thread(flusher):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("batch", flusher._take()), daemon=True)
    t.start()
    return t, out


def test_an_outcome_waits_for_a_running_step_to_share_its_commit():
    f = Flusher(max_batch=10, max_delay=30)
    f.step_started()
    f.step_started()
    f.submit("a")                      # one step is still running: its outcome may join
    t, out = take_in_thread(f)
    t.join(0.3)
    assert t.is_alive(), "the batch waits while a step that could join it runs"
    f.submit("b")                      # the last running step submits: nothing more can come
    t.join(5)
    assert [e for e, _ in out["batch"]] == ["a", "b"]


def test_no_wait_when_no_step_runs():
    f = Flusher(max_batch=10, max_delay=30)
    f.step_started()
    f.submit("a")                      # no step left running
    t, out = take_in_thread(f)
    t.join(5)
    assert [e for e, _ in out["batch"]] == ["a"]


def test_a_full_batch_goes_at_once_and_the_rest_waits_for_the_next():
    f = Flusher(max_batch=2, max_delay=30)
    for _ in range(4):
        f.step_started()
    for e in "abc":
        f.submit(e)
    t, out = take_in_thread(f)
    t.join(5)
    assert [e for e, _ in out["batch"]] == ["a", "b"]
    assert [e for e, _ in f._pending] == ["c"]


def test_the_window_counts_from_the_oldest_outcomes_submit_not_from_the_take():
    """An outcome that already waited MAX_DELAY (the previous flush was running) goes
    with the next take, though a step still runs: a busy flusher never idles on top."""
    f = Flusher(max_batch=10, max_delay=1.0)
    f.step_started()
    f.step_started()
    f.submit("a")
    time.sleep(1.05)                   # as if a flush of 1 s had run meanwhile
    t, out = take_in_thread(f)
    t.join(0.5)                        # counted from the take, it would wait another second
    assert not t.is_alive(), "the oldest outcome had waited its MAX_DELAY already"
    assert [e for e, _ in out["batch"]] == ["a"]


def test_started_and_submitted_steps_balance():
    f = Flusher(max_batch=10, max_delay=0)
    for _ in range(3):
        f.step_started()
    f.submit("a")
    f.step_abandoned()                 # a step that submitted nothing
    f.submit("b")
    assert f._running == 0


def test_outcomes_handed_over_later_do_not_extend_the_oldest_ones_window():
    f = Flusher(max_batch=10, max_delay=1.0)
    for _ in range(3):
        f.step_started()
    f.submit("a")
    time.sleep(0.5)
    f.submit("b")                      # a later outcome: "a" still goes at a's deadline
    t, out = take_in_thread(f)
    t.join(0.8)                        # "a"'s window ends 0.5 s from here; b's would end 1 s from here
    assert not t.is_alive(), "the window slid to the newest outcome"
    assert [e for e, _ in out["batch"]] == ["a", "b"]


def test_no_wait_for_a_step_that_has_run_longer_than_the_window():
    """young(window) says whether a step that started within the window still runs (the
    supervisor asks its schedulers): an old, long step holds no outcome back."""
    asked = []

    def young(window):
        asked.append(window)
        return False

    f = Flusher(max_batch=10, max_delay=30, young=young)
    f.step_started()
    f.step_started()
    f.submit("a")                      # one step still runs, but it is not young
    t, out = take_in_thread(f)
    t.join(5)
    assert [e for e, _ in out["batch"]] == ["a"] and asked == [30]


def test_a_failing_young_hint_falls_back_to_waiting_for_every_running_step():
    def young(window):
        raise RuntimeError("hint broke")

    f = Flusher(max_batch=10, max_delay=30, young=young)
    f.step_started()
    f.step_started()
    f.submit("a")
    t, out = take_in_thread(f)
    t.join(0.3)
    assert t.is_alive(), "the flusher thread survived and waits as without the hint"
    f.submit("b")
    t.join(5)
    assert [e for e, _ in out["batch"]] == ["a", "b"]
