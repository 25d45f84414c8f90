"""OpenTelemetry spans and metrics for gen_durable, built on its telemetry events.

Enable with `GEN_DURABLE = {"OPENTELEMETRY": True}` (or `{"TRACES": bool, "METRICS":
bool}`) and install the `otel` extra (`opentelemetry-api`); `apps.ready()` then calls
`install()`. The engine itself is unchanged: this module is a handler attached to the
events of gen_durable.telemetry, and it uses the global tracer and meter providers
that your OpenTelemetry SDK set-up configures (docs/observability.md: exporting to an
OTLP collector). Without an SDK the API's no-op providers make it cheap.

Traces — one span per step, named "<machine>.<step>", opened in the step's thread at
`step.start` and made current (spans your step code opens are its children; for an
`async def` step, current in its task), ended at
`step.stop` with attributes:
    gen_durable.machine, gen_durable.step, gen_durable.instance_id, gen_durable.attempt,
    gen_durable.queue, gen_durable.outcome (next | retry | await | schedule | done | stop
    | inline); a retry or stop records its error (an "exception" event, status ERROR).
A sync step abandoned past its timeout gets two spans: the attempt's outcome (what
handle(StepTimeout) did, from the thread that ran it) and, when the stuck thread
returns, its own run, outcome "abandoned" (status ERROR; not counted in the metrics).

Metrics (instrument, unit, attributes):
    gen_durable.steps              counter     {step}  machine, step, outcome
    gen_durable.steps.slow         counter     {step}  machine, step   (still running at SLOW_STEP_SECONDS)
    gen_durable.step.duration      histogram   s       machine, step, outcome
    gen_durable.pick.duration      histogram   s       queue
    gen_durable.pick.batch_size    histogram   {row}   queue
    gen_durable.flush.size         histogram   {row}
    gen_durable.flush.duration     histogram   s
    gen_durable.queue.depth        gauge       {row}   queue   (runnable rows, counted up to 10,000)
    gen_durable.queue.lag          gauge       s       queue   (age of the oldest due row)
The duration histograms advise seconds buckets (STEP_SECONDS, STATEMENT_SECONDS) to the SDK.
`rundurable --metrics-port` serves these metrics for Prometheus (integrations/prometheus.py).
The two gauges are observed, when the SDK collects, for the queues whose schedulers run
in this process (so web processes never query), with one bounded statement.
"""

from __future__ import annotations

import logging
import threading
import time

from .. import telemetry

logger = logging.getLogger("gen_durable.otel")

SCOPE = "gen_durable"
ERROR_KINDS = ("retry", "stop")
ABANDONED = "abandoned"  # step.stop of a step that returned after its timeout abandoned it
# Bucket boundaries (seconds) advised for the duration histograms: the SDK's default ones
# (0, 5, 10, 25 … 10,000) suit milliseconds and would put nearly every step in one bucket.
STEP_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                1800.0, 3600.0)
STATEMENT_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def available() -> bool:
    """Whether `opentelemetry-api` can be imported."""
    try:
        import opentelemetry.metrics  # noqa: F401
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def _version():
    try:
        from importlib.metadata import version

        return version("gen-durable")
    except Exception:
        return None


class OtelHandler:
    """The telemetry handler: events in, spans and metric points out."""

    def __init__(self, tracer_provider=None, meter_provider=None, traces=True, metrics=True, using=None):
        from opentelemetry import metrics as otel_metrics
        from opentelemetry import trace

        self._trace = trace
        self.traces, self.metrics = traces, metrics
        self.using = using  # alias(es) of the queue gauges: None, a str, or several (serve_databases)
        self._own_using = using is not None  # installed for a database: rundurable leaves it there
        # (instance id, thread) -> (span, context token) of its running step: a step
        # abandoned past its timeout still runs in its thread while another thread records
        # the attempt's outcome (two step.stop events, one per thread).
        self._open: dict = {}
        self._queues: set = set()  # queues whose schedulers run in this process
        if traces:
            self.tracer = trace.get_tracer(SCOPE, _version(), tracer_provider=tracer_provider)
        if metrics:
            meter = otel_metrics.get_meter(SCOPE, _version(), meter_provider=meter_provider)
            self.steps = meter.create_counter("gen_durable.steps", unit="{step}",
                                              description="Steps run, by machine, step and outcome")
            self.steps_slow = meter.create_counter(
                "gen_durable.steps.slow", unit="{step}",
                description="Steps still running after SLOW_STEP_SECONDS (counted once each, while they run)")
            self.step_duration = meter.create_histogram("gen_durable.step.duration", unit="s",
                                                        description="Time a step's code ran",
                                                        explicit_bucket_boundaries_advisory=STEP_SECONDS)
            self.pick_duration = meter.create_histogram("gen_durable.pick.duration", unit="s",
                                                        description="Time of one pick (claim) statement round",
                                                        explicit_bucket_boundaries_advisory=STATEMENT_SECONDS)
            self.pick_batch = meter.create_histogram("gen_durable.pick.batch_size", unit="{row}",
                                                     description="Rows claimed by one pick")
            self.flush_size = meter.create_histogram("gen_durable.flush.size", unit="{row}",
                                                     description="Outcomes committed by one flush")
            self.flush_duration = meter.create_histogram("gen_durable.flush.duration", unit="s",
                                                         description="Time of one flush transaction",
                                                         explicit_bucket_boundaries_advisory=STATEMENT_SECONDS)
            meter.create_observable_gauge("gen_durable.queue.depth", callbacks=[self._observe_depth],
                                          unit="{row}", description="Runnable rows per queue (up to 10,000)")
            meter.create_observable_gauge("gen_durable.queue.lag", callbacks=[self._observe_lag], unit="s",
                                          description="Age of the oldest due runnable row per queue")
        self._depth_cache = (0.0, {})

    # --- events ----------------------------------------------------------------------
    def __call__(self, event, measurements, metadata):
        if event == "step.start":
            if self.traces:
                self._start_span(metadata)
        elif event == "step.stop":
            self._step_stop(measurements, metadata)
        elif not self.metrics:
            return
        elif event == "step.slow":
            self.steps_slow.add(1, {"machine": metadata.get("fsm"), "step": metadata.get("step")})
        elif event == "pick.stop":
            attrs = {"queue": metadata.get("queue")}
            self.pick_duration.record(measurements["duration"], attrs)
            self.pick_batch.record(measurements["count"], attrs)
        elif event == "flush.stop":
            self.flush_size.record(measurements["count"])
            self.flush_duration.record(measurements["duration"])
        elif event == "scheduler.saturation":
            queue = metadata.get("queue")
            if queue is not None and queue not in self._queues:
                self._queues = self._queues | {queue}

    def _attributes(self, metadata):
        return {"gen_durable.machine": metadata.get("fsm"), "gen_durable.step": metadata.get("step"),
                "gen_durable.instance_id": metadata.get("id"), "gen_durable.attempt": metadata.get("attempt", 0),
                "gen_durable.queue": metadata.get("queue") or ""}

    def _start_span(self, metadata):
        from opentelemetry import context

        span = self.tracer.start_span(f"{metadata.get('fsm')}.{metadata.get('step')}",
                                      attributes=self._attributes(metadata))
        # Current in this thread, or in this asyncio task for an async step (contextvars).
        token = context.attach(self._trace.set_span_in_context(span))
        self._open[(metadata.get("id"), threading.get_ident())] = (span, token)

    def _step_stop(self, measurements, metadata):
        kind = metadata.get("kind")
        duration = measurements.get("duration", 0.0)
        # An abandoned step's late return is not a step outcome: the attempt was counted
        # once, with what handle(StepTimeout) did; its span still ends, marked.
        if self.metrics and kind != ABANDONED:
            attrs = {"machine": metadata.get("fsm"), "step": metadata.get("step"), "outcome": kind}
            self.steps.add(1, attrs)
            self.step_duration.record(duration, attrs)
        if not self.traces:
            return
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode

        open_ = self._open.pop((metadata.get("id"), threading.get_ident()), None)
        if open_ is not None:
            span, token = open_
        else:  # attached mid-step: record it after the fact with its real start
            end = time.time_ns()
            span = self.tracer.start_span(f"{metadata.get('fsm')}.{metadata.get('step')}",
                                          attributes=self._attributes(metadata),
                                          start_time=end - int(duration * 1e9))
            token = None
        span.set_attribute("gen_durable.outcome", kind or "")
        error = metadata.get("error")
        if kind == ABANDONED:
            span.set_status(Status(StatusCode.ERROR, "abandoned past its step timeout; its outcome was dropped"))
        elif error and kind in ERROR_KINDS:
            etype, _, message = error.partition(": ")
            span.add_event("exception", {"exception.type": etype if message else "Error",
                                         "exception.message": message or error})
            span.set_status(Status(StatusCode.ERROR, error[:500]))
        span.end()
        if token is not None:
            try:
                context.detach(token)
            except Exception:  # a context changed underneath by the step; nothing to restore
                pass

    # --- queue gauges ----------------------------------------------------------------
    def serve_databases(self, aliases) -> None:
        """Read the queue gauges from each of `aliases` (a list of database aliases: the
        ones this process's workers serve, `rundurable --database`). With more than one,
        every point carries a `database` attribute beside `queue`. A handler installed with
        its own `using` keeps it."""
        if not self._own_using:
            self.using = tuple(dict.fromkeys(aliases))
            self._depth_cache = (0.0, {})  # the cached points are another database's

    def _aliases(self) -> tuple:
        from ..conf import database_alias

        if self.using is None or isinstance(self.using, str):
            return (database_alias(self.using),)
        return tuple(database_alias(a) for a in self.using)

    def _depths(self):
        """{attributes: (runnable, lag seconds)} for this process's queues in each served
        database; one statement per database, cached for a second so the two gauges of
        one collection share it."""
        at, cached = self._depth_cache
        now = time.monotonic()
        if now - at < 1.0 or not self._queues:
            return cached
        from ..queues import queue_depth
        from ..worker.connections import bounded_call

        aliases = self._aliases()
        out = {}
        # The SDK gives a collection 10 s: every database's statement, connect included,
        # fits in GAUGE_BUDGET together, so a locked or silent one costs its own points only.
        ends = time.monotonic() + GAUGE_BUDGET
        for alias in aliases:
            left = ends - time.monotonic()
            if left < GAUGE_MIN:
                logger.warning("queue gauges of database %r skipped: the collection's %gs were spent on the "
                               "others", alias, GAUGE_BUDGET)
                continue
            try:  # on a short-lived connection of the SDK's collecting thread
                rows = bounded_call(alias, left, lambda: queue_depth(sorted(self._queues), alias), role="gauges")
            except Exception as exc:
                logger.warning("queue gauges of database %r: %s", alias, exc)
                rows = {}
            for queue, (runnable, _due, oldest, db_now) in rows.items():
                lag = max((db_now - oldest).total_seconds(), 0.0) if oldest is not None and oldest <= db_now else 0.0
                attributes = (("queue", queue),) + ((("database", alias),) if len(aliases) > 1 else ())
                out[attributes] = (runnable, lag)
        self._depth_cache = (now, out)
        return out

    def _observe_depth(self, options):
        from opentelemetry.metrics import Observation

        return [Observation(n, dict(attrs)) for attrs, (n, _lag) in self._depths().items()]

    def _observe_lag(self, options):
        from opentelemetry.metrics import Observation

        return [Observation(lag, dict(attrs)) for attrs, (_n, lag) in self._depths().items()]


# Seconds the queue gauges' statements of one collection may take, all databases together
# (the SDK's callback timeout is 10 s), and the least left worth trying one more database.
GAUGE_BUDGET = 5.0
GAUGE_MIN = 0.5

_installed: OtelHandler | None = None
_lock = threading.Lock()


def install(tracer_provider=None, meter_provider=None, *, traces=True, metrics=True, using=None) -> OtelHandler:
    """Attach the OpenTelemetry handler (idempotent: a second call replaces the first).

    Args: tracer_provider / meter_provider: default the global providers; traces /
        metrics: which to produce; using: database alias of the queue gauges (default:
        the ones `rundurable --database` serves, else GEN_DURABLE['DATABASE']).
    Raises ImportError when opentelemetry-api is not installed.
    """
    global _installed
    handler = OtelHandler(tracer_provider, meter_provider, traces=traces, metrics=metrics, using=using)
    with _lock:
        if _installed is not None:
            telemetry.detach(_installed)
        telemetry.attach("", handler)
        _installed = handler
    return handler


def uninstall() -> None:
    """Detach the handler installed by `install()`, if any."""
    global _installed
    with _lock:
        if _installed is not None:
            telemetry.detach(_installed)
            _installed = None


def install_from_settings() -> OtelHandler | None:
    """apps.ready(): install when settings OPENTELEMETRY asks for it (checks.py validates)."""
    from ..conf import get_settings

    value = get_settings().OPENTELEMETRY
    if value is not True and not isinstance(value, dict):
        return None  # off, or not a valid value (gen_durable.E050 reports it)
    if not available():
        return None  # gen_durable.E051 reports it
    if not isinstance(value, dict):
        value = {}
    return install(traces=value.get("TRACES", True), metrics=value.get("METRICS", True))
