"""A stop request that a signal handler may make: lock-free to set, cheap to wait on.

`threading.Event` cannot be set from a signal handler safely. Python runs the handler in
the main thread between two bytecodes; when that thread is itself inside `Event.wait()`
at a moment it holds the Event's internal lock, `set()` blocks on that lock for ever —
the worker never drains and whatever runs it must SIGKILL it (a test in
tests/races/test_stop_on_sigterm.py shows a tight `Event.wait` loop hanging on most SIGTERMs).

Here setting the request stores a flag and writes one byte to a non-blocking pipe; both
take no lock. `wait()` is a `select()` on the pipe: a signal interrupts it, Python runs
the handler and retries the call (PEP 475), which then finds the byte and returns.
"""

from __future__ import annotations

import os
import select
import weakref


class StopRequest:
    """Set once by a signal handler or any thread; waited on by one run loop.

    `set()` never blocks; `wait(timeout)` (seconds) returns True as soon as the request
    is set, else False after `timeout`. The pipe's two file descriptors are closed when
    the object is garbage collected — only then can no handler or thread still write to
    them (closing earlier would let a late write land in a reused descriptor).
    """

    def __init__(self):
        self._set = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        weakref.finalize(self, _close, self._r, self._w)

    def set(self) -> None:
        self._set = True  # one store: atomic under the GIL
        try:
            os.write(self._w, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: the loop has bytes to wake on already

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        if not self._set:
            select.select([self._r], [], [], max(timeout, 0))
            try:
                while os.read(self._r, 512):
                    pass
            except BlockingIOError:
                pass
        return self._set


def _close(*fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
