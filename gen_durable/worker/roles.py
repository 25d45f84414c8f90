"""Internal: the daemon-thread shape shared by the worker's background roles, and how
they log a failure that lasts."""

from __future__ import annotations

import logging
import threading
import time


class Role:
    """A daemon thread running `self._loop()` until `stop()` sets `self._stop`."""

    def __init__(self, thread_name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout=5):
        self._stop.set()
        self._thread.join(timeout)

    def _loop(self):  # pragma: no cover - subclasses define it
        raise NotImplementedError


class FailureLog:
    """The log lines of a loop that keeps failing: the first failure, then one every
    `every` seconds while failures last (with how many in a row), and one when a call
    succeeds again — an outage of minutes must not flood the log with a line per retry.

    `failed(message, *args)` after each failure (logging's %-style arguments);
    `succeeded()` after each success. Not thread-safe: one per loop."""

    def __init__(self, logger: logging.Logger, what: str, every: float = 60.0):
        self.logger, self.what, self.every = logger, what, every
        self.count = 0
        self._logged = float("-inf")

    def failed(self, message: str, *args) -> None:
        self.count += 1
        now = time.monotonic()
        if self.count == 1 or now - self._logged >= self.every:
            self._logged = now
            # On one line: a driver's error spans several, which a log collector splits.
            text = " ".join((message % args).split())
            self.logger.warning("%s (%d in a row%s)", text, self.count,
                                "" if self.count == 1 else f"; one line per {self.every:g}s while it lasts")

    def succeeded(self) -> None:
        if self.count:
            self.logger.warning("%s succeeds again after %d failures", self.what, self.count)
            self.count = 0
            self._logged = float("-inf")
