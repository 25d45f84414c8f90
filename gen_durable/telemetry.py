"""Telemetry: attach handlers to engine events (docs/design.md#telemetry).

    from gen_durable import telemetry
    telemetry.attach("step.", lambda event, measurements, metadata: ...)

A handler is called synchronously, in the emitting thread, for every event whose name
starts with its prefix ("" = all). A handler that raises is logged and skipped; it
never breaks the engine. `duration` measurements are seconds (float).

| event                  | measurements                              | metadata              |
|------------------------|-------------------------------------------|-----------------------|
| step.start             |                                           | id, fsm, step, attempt, queue |
| step.stop              | duration                                  | id, fsm, step, kind, attempt, queue, error |
| pick.stop              | count, demand, duration                   | queue, worker         |
| scheduler.saturation   | in_flight, buffer, concurrency, prefetch  | queue                 |
| scheduler.drain        | released, in_flight                       | queue                 |
| scheduler.reclaimed    | count                                     | queue                 |
| scheduler.abandoned    | count (steps cut off at shutdown)         | queue                 |
| scheduler.handed_back  | count (buffered rows that waited too long, returned untouched) | queue |
| concurrency.contended  | count                                     | queue                 |
| concurrency.throttled  | wanted, admitted                          | key, queue            |
| outcome.stale          | count                                     | id, fsm, step, kind   |
| reaper.reaped          | count                                     |                       |
| await.timeout          | count                                     |                       |
| step.timeout           | count (1), elapsed (s)                    | id, fsm, step, timeout |
| step.slow              | count (1), elapsed (s)                    | id, fsm, step, attempt, queue, threshold |
| schedule.fired         | count (1)                                 | schedule, tick, late (s) |
| schedule.skipped       | count (1)                                 | schedule, tick, late (s) |
| gc.swept               | count, buckets, gates                     |                       |
| gc.history             | count (timeline entries deleted)          |                       |
| history.error          | count (timeline entries not written; their outcomes committed) | error |
| flush.stop             | count, stale, duration, held (waited for the FLUSH.MAX_DELAY window) |  |
| flush.error            | count                                     | error                 |
| producer.flush         | count, duplicates, duration               |                       |
| producer.error         | count                                     | error                 |
| inline.continue        | steps (of the chain so far)               | id, fsm, from, to     |
| inline.yield           | steps                                     | id, fsm, step, reason |
| flush.retry            | count, delay                              | error                 |
| flush.key_conflict     | count (1: an outcome waits for a correlation key another row holds) | id, fsm |
| step.connection_retry  | delay                                     | id, fsm, step         |
| rate_limit.throttled   | wanted, granted                           | key, queue            |
| rate_limit.contended   | count                                     | queue                 |
| rate_limit.unknown     | count                                     | key, name, fsm, step  |
| limiter.unavailable    | count (rows that wait)                    | queue, backend        |
| pick.unknown           | count (rows handed back)                  | queue                 |
| scheduler.adopted      | count                                     | queue                 |

`step.start` and `step.stop` of one step are emitted in the same thread (the one that
runs it); `error` is the recorded error text of a retry or stop (None otherwise). A sync
step abandoned past its timeout has two `step.stop`: the attempt's outcome (kind `retry`
or `stop`, what handle(StepTimeout) did), from the thread that ran handle() and with no
`step.start` of its own, and, when the stuck thread returns, kind `abandoned` (its
outcome was dropped; error None) from that thread.
`gen_durable.otel` (gen_durable/integrations/otel.py) turns these events into OpenTelemetry spans and metrics.

`step.slow` is emitted once per step still running after SLOW_STEP_SECONDS (a sync step's
from the queue's feeder thread, an async step's from the event loop), with a WARNING on
`gen_durable.worker`; the step goes on.

`inline.yield` reasons: "bound" (INLINE's MAX_STEPS / MAX_SECONDS), "key" (a new
concurrency key goes through the pick), "throttled" (the limiter denied the next step),
"stopping" (the worker is shutting down). The row is requeued in each case.

Limit events (gen_durable/limiter/): `concurrency.throttled` / `rate_limit.throttled` once
per key whose rows a pick's admission denied (wanted = rows offered, admitted/granted =
rows let through); `rate_limit.contended` when two pickers minted the same cold rate
bucket and the admission retried, `concurrency.contended` also when a counter's CHECK
fenced an admission that retried; `rate_limit.unknown` when a Next names, or the pick
meets, a rate limit that is not configured (key, name, fsm, step); `limiter.unavailable`
when the Redis limiter cannot be reached: the pick's rows with limits wait (deferred
1 s) and the others run.

Deploy events: `pick.unknown` when a pick claimed rows of a machine, version or step
this process does not know and handed them back untouched; `scheduler.adopted` when a
worker that knows such rows made them eligible again (docs/guide.md, "Deploying").
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("gen_durable.telemetry")

EVENTS = (
    "step.start", "step.stop", "pick.stop", "scheduler.saturation", "scheduler.drain", "scheduler.reclaimed",
    "scheduler.abandoned", "scheduler.handed_back",
    "concurrency.contended", "concurrency.throttled", "outcome.stale", "reaper.reaped",
    "await.timeout", "step.timeout", "step.slow", "schedule.fired", "schedule.skipped", "gc.swept", "flush.stop", "flush.error",
    "gc.history", "history.error",
    "flush.retry", "flush.key_conflict", "step.connection_retry", "inline.continue", "inline.yield",
    "producer.flush", "producer.error",
    "rate_limit.throttled",
    "rate_limit.contended", "rate_limit.unknown", "limiter.unavailable",
    "pick.unknown", "scheduler.adopted",
)

_lock = threading.Lock()
_handlers: list[tuple[str, object]] = []


def attach(event_prefix: str, handler) -> None:
    """Call `handler(event, measurements, metadata)` for events starting with `event_prefix`."""
    with _lock:
        _handlers.append((event_prefix, handler))


def detach(handler) -> None:
    """Remove every attachment of `handler`."""
    with _lock:
        _handlers[:] = [(p, h) for (p, h) in _handlers if h is not handler]


def active() -> bool:
    """Whether any handler is attached: hot paths build an event's dicts only then."""
    return bool(_handlers)


def emit(event: str, measurements: dict, metadata: dict | None = None) -> None:
    handlers = _handlers
    if not handlers:
        return
    for prefix, handler in list(handlers):
        if event.startswith(prefix):
            try:
                handler(event, measurements, metadata or {})
            except Exception:  # a handler must never break the engine
                logger.exception("telemetry handler %r failed on %s", handler, event)
