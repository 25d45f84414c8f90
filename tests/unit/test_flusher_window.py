"""The flusher's group-commit window (FLUSH.MAX_DELAY, worker/flusher.py): no database,
no threads, no sleeping.

`_take` hands out the next batch: at once when MAX_BATCH outcomes wait or no step that
could add one runs (one started within the window: `young`); otherwise it waits until
the oldest waiting outcome is MAX_DELAY old — counted from that outcome's submit, so
outcomes that queued while the previous flush ran are not held back again. The window
runs on a fake clock here, and a timed wait moves that clock on (and lets a test hand
in more outcomes "meanwhile"): each test reads the waits `_take` asked for.
"""

import threading

from gen_durable.worker.flusher import Flusher


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Window(threading.Condition):
    """A Condition whose timed wait does not block: it records the timeout, runs
    `meanwhile` (outcomes submitted during the wait) and moves the clock to the end of
    the wait. An untimed wait would block for ever: `_take` is only called with
    outcomes pending."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.waits, self.meanwhile = clock, [], []

    def wait(self, timeout=None):
        assert timeout is not None, "an untimed wait: nothing pending"
        self.waits.append(round(timeout, 6))
        if self.meanwhile:
            self.meanwhile.pop(0)()
            return True
        self.clock.now += timeout
        return False


def flusher(max_batch=10, max_delay=30.0, young=None, max_bytes=8 * 1024 * 1024):
    clock = Clock()
    f = Flusher(max_batch=max_batch, max_delay=max_delay, young=young, clock=clock, max_bytes=max_bytes)
    f._cond = Window(clock)
    return f, clock


def names(batch):
    return [e for e, _ in batch]


def test_an_outcome_waits_for_a_running_step_to_share_its_commit():
    f, _ = flusher()
    f.step_started()
    f.step_started()
    f.submit("a")                            # one step is still running: its outcome may join
    f._cond.meanwhile.append(lambda: f.submit("b"))  # ... and it does, during the wait
    assert names(f._take()) == ["a", "b"]
    assert f._cond.waits == [30.0] and f._held


def test_the_window_ends_max_delay_after_the_oldest_outcome():
    f, _ = flusher(max_delay=0.5)
    f.step_started()
    f.step_started()
    f.submit("a")                            # the other step never comes back in time
    assert names(f._take()) == ["a"]
    assert f._cond.waits == [0.5] and f._held


def test_no_wait_when_no_step_runs():
    f, _ = flusher()
    f.step_started()
    f.submit("a")                            # no step left running
    assert names(f._take()) == ["a"]
    assert f._cond.waits == [] and not f._held


def test_a_full_batch_goes_at_once_and_the_rest_waits_for_the_next():
    f, _ = flusher(max_batch=2)
    for _ in range(4):
        f.step_started()
    for e in "abc":
        f.submit(e)
    assert names(f._take()) == ["a", "b"]
    assert names(f._pending) == ["c"] and f._cond.waits == []


def test_the_window_counts_from_the_oldest_outcomes_submit_not_from_the_take():
    """An outcome that already waited MAX_DELAY (the previous flush was running) goes
    with the next take, though a step still runs: a busy flusher never idles on top."""
    f, clock = flusher(max_delay=1.0)
    f.step_started()
    f.step_started()
    f.submit("a")
    clock.now += 1.5                         # as if a flush of 1.5 s had run meanwhile
    assert names(f._take()) == ["a"]
    assert f._cond.waits == [] and not f._held


def test_outcomes_handed_over_later_do_not_extend_the_oldest_ones_window():
    f, clock = flusher(max_delay=1.0)
    for _ in range(3):
        f.step_started()
    f.submit("a")
    clock.now += 0.4
    f.submit("b")                            # a later outcome: "a" still goes at a's deadline
    assert names(f._take()) == ["a", "b"]
    assert f._cond.waits == [0.6]            # not 1.0: b's hand-off did not move the window


def test_no_wait_for_a_step_that_has_run_longer_than_the_window():
    """young(window) says whether a step that started within the window still runs (the
    supervisor asks its schedulers): an old, long step holds no outcome back."""
    asked = []

    def young(window):
        asked.append(window)
        return False

    f, _ = flusher(young=young)
    f.step_started()
    f.step_started()
    f.submit("a")                            # one step still runs, but it is not young
    assert names(f._take()) == ["a"]
    assert f._cond.waits == [] and asked == [30.0] and not f._held


def test_a_failing_young_hint_falls_back_to_waiting_for_every_running_step():
    def young(window):
        raise RuntimeError("hint broke")

    f, _ = flusher(young=young)
    f.step_started()
    f.step_started()
    f.submit("a")
    f._cond.meanwhile.append(lambda: f.submit("b"))
    assert names(f._take()) == ["a", "b"]
    assert f._cond.waits == [30.0]


def test_started_and_submitted_steps_balance():
    f, _ = flusher(max_delay=0)
    for _ in range(3):
        f.step_started()
    f.submit("a")
    f.step_abandoned()                       # a step that submitted nothing
    f.submit("b")
    assert f._running == 0


class Sized:
    """An outcome carrying `n` characters of result JSON."""

    def __init__(self, name, n):
        self.name, self.result = name, "x" * n

    def __repr__(self):
        return self.name


def test_a_batch_ends_at_max_bytes_and_an_outcome_over_it_goes_alone():
    f, _ = flusher(max_batch=10, max_bytes=1000)
    for e in (Sized("a", 400), Sized("b", 400), Sized("c", 400), Sized("d", 5000), Sized("e", 10)):
        f.submit(e)
    assert [e.name for e in names(f._take())] == ["a", "b"]   # 800; c would make 1,200
    assert [e.name for e in names(f._take())] == ["c"]        # d would make 5,400
    assert [e.name for e in names(f._take())] == ["d"]        # over the cap: alone
    assert [e.name for e in names(f._take())] == ["e"]
    assert f._pending_bytes == 0


def test_a_batch_at_max_bytes_does_not_wait_for_the_window():
    f, _ = flusher(max_bytes=1000)
    f.step_started()
    f.step_started()
    f.submit(Sized("a", 1000))          # another step still runs, but the batch is full by bytes
    assert [e.name for e in names(f._take())] == ["a"] and f._cond.waits == []
