"""Internal: the daemon-thread shape shared by the worker's background roles."""

from __future__ import annotations

import threading


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
