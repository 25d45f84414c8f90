"""Internal: LISTEN for wake-ups on the `gen_durable` channel (docs/design.md#wake-ups).

A dedicated psycopg connection (autocommit) listens; each notification's payload is a
queue name, handed to `on_wake(queue)`. With `on_timer`, it also listens on
`gen_durable_timer` (a row was scheduled for later in that queue) and hands those payloads
to `on_timer(queue)`, which re-arms the worker's timer. A lost connection is re-established with
back-off and followed by `on_reconnect()` — an immediate re-poll of every queue, since
notifications sent while it was down are gone (the first connect re-polls too: the
schedulers may have polled just before it listened). Polling stays the floor.

The connection has the engine's TCP keepalives, and every CHECK_EVERY seconds of quiet a
`SELECT 1` under the watchdog proves it still reaches the server: a half-open connection
(nothing flows, no error) would otherwise leave the worker deaf without a word.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import psycopg

from .. import db
from . import connections
from .roles import FailureLog, Role

logger = logging.getLogger("gen_durable.listener")

CHANNEL = "gen_durable"
TIMER_CHANNEL = "gen_durable_timer"
CHECK_EVERY = 10.0  # seconds of quiet between liveness round trips


class Listener(Role):
    def __init__(self, on_wake, on_reconnect, using=None, channel=CHANNEL, on_timer=None):
        self.channel = channel
        self.on_wake = on_wake
        self.on_timer = on_timer
        self.on_reconnect = on_reconnect
        self.using = using
        self._conn = None
        self.connects = 0
        super().__init__(f"gd-listen-{channel}")

    def _connect(self):
        params = db.connection(self.using).get_connection_params()
        params.pop("cursor_factory", None)
        params = connections.engine_options(f"listener {self.channel}", base=params, statements=False,
                                            tag=getattr(self, "tag", None))
        conn = psycopg.connect(**params, autocommit=True)
        conn.execute(f"LISTEN {self.channel}")
        if self.on_timer is not None:
            conn.execute(f"LISTEN {TIMER_CHANNEL}")
        return conn

    def _check(self):
        """One round trip, cut by the watchdog if no answer comes (half-open connection)."""
        connections.WATCHDOG.arm(SimpleNamespace(connection=self._conn), connections.CHECK_BOUND,
                                 f"listener {self.channel}")
        try:
            self._conn.execute("SELECT 1")
        finally:
            connections.WATCHDOG.disarm()

    def _loop(self):
        backoff = 0.1
        failures = FailureLog(logger, "listener connection")
        while not self._stop.is_set():
            try:
                self._conn = self._connect()
                self.connects += 1
                failures.succeeded()
                if self.connects > 1:
                    logger.info("listener reconnected; re-polling every queue")
                # Also on the first connect: a row inserted between the schedulers' first
                # poll and this LISTEN sent its notification to nobody.
                self.on_reconnect()
                backoff = 0.1
                checked = time.monotonic()
                while not self._stop.is_set():
                    for note in self._conn.notifies(timeout=0.5):
                        if note.channel == TIMER_CHANNEL:
                            self.on_timer(note.payload)
                        else:
                            self.on_wake(note.payload)
                        checked = time.monotonic()
                    if time.monotonic() - checked >= CHECK_EVERY:
                        self._check()
                        checked = time.monotonic()
            except Exception as exc:
                if self._stop.is_set():
                    break
                failures.failed("listener connection lost (%s); reconnecting in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                connections.WATCHDOG.disarm()
                if self._conn is not None:
                    try:
                        self._conn.close()
                    except Exception:
                        pass
                    self._conn = None
