"""OpenTelemetry: spans and metrics from the telemetry events (gen_durable/integrations/otel.py),
checked with the SDK's in-memory exporters; and rundurable's quiet idle log."""

import logging
import threading
import time

import pytest
from django.test import override_settings

import gen_durable as gd
from gen_durable import checks, otel
from gen_durable.models import Instance
from gen_durable.testing import drain
from tests.conftest import wait_until
from tests.durable_app.durable import AlwaysRaises, Plain

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402


class SeesItsSpan(gd.Machine):
    """Reports the span current while its step runs (the step's own span)."""

    name = "tests.otel.SeesItsSpan"

    @gd.step
    def start(self, ctx):
        return gd.Done({"span_id": trace.get_current_span().get_span_context().span_id})


class AsyncSeesItsSpan(gd.Machine):
    """An async step that overlaps others, then reports the span current in its task."""

    name = "tests.otel.AsyncSeesItsSpan"

    @gd.step
    async def start(self, ctx):
        import asyncio

        await asyncio.sleep(0.3)
        return gd.Done({"span_id": trace.get_current_span().get_span_context().span_id})


@pytest.fixture
def otel_sdk():
    exporter = InMemorySpanExporter()
    tracer_provider = sdk_trace.TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    handler = otel.install(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield exporter, reader, handler
    otel.uninstall()
    meter_provider.shutdown()


def _points(reader):
    """{metric name: [(attributes, point)]} of one collection."""
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend((dict(p.attributes), p) for p in m.data.data_points)
    return out


@pytest.mark.django_db
def test_each_step_is_a_span_with_its_attributes_and_recorded_error(otel_sdk, queue_name):
    exporter, reader, _ = otel_sdk
    n = AlwaysRaises.max_attempts
    id_ = gd.insert(AlwaysRaises, queue=queue_name)
    drain(queue=queue_name)
    spans = [s for s in exporter.get_finished_spans() if s.attributes["gen_durable.instance_id"] == id_]
    assert [s.name for s in spans] == ["tests.AlwaysRaises.perform"] * n
    assert [s.attributes["gen_durable.attempt"] for s in spans] == list(range(n))
    assert [s.attributes["gen_durable.outcome"] for s in spans] == ["retry"] * (n - 1) + ["stop"]
    for s in spans:
        assert s.attributes["gen_durable.machine"] == "tests.AlwaysRaises"
        assert s.attributes["gen_durable.step"] == "perform"
        assert s.attributes["gen_durable.queue"] == queue_name
        assert s.status.status_code is StatusCode.ERROR
        assert [e.name for e in s.events] == ["exception"]
        assert "kaput" in s.events[0].attributes["exception.message"]
        assert s.end_time >= s.start_time
    assert dict(spans[0].events[0].attributes) == {"exception.type": "ValueError", "exception.message": "kaput"}

    points = _points(reader)
    steps = {p[0]["outcome"]: p[1].value for p in points["gen_durable.steps"] if p[0]["machine"] == "tests.AlwaysRaises"}
    assert steps == {"retry": n - 1, "stop": 1}
    durations = [p for a, p in points["gen_durable.step.duration"] if a["machine"] == "tests.AlwaysRaises"]
    assert sum(p.count for p in durations) == n


@pytest.mark.django_db
def test_the_step_span_is_current_while_the_step_runs(otel_sdk, queue_name):
    exporter, _, _ = otel_sdk
    id_ = gd.insert(SeesItsSpan, queue=queue_name)
    drain(queue=queue_name)
    (span,) = [s for s in exporter.get_finished_spans() if s.attributes["gen_durable.instance_id"] == id_]
    assert Instance.objects.get(id=id_).result == {"span_id": span.context.span_id}
    assert span.status.status_code is StatusCode.UNSET and span.attributes["gen_durable.outcome"] == "done"
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached after the step


def test_overlapping_async_steps_each_see_their_own_span(otel_sdk, engine, committed, queue_name):
    exporter, _, _ = otel_sdk
    engine({queue_name: 4})
    ids = [gd.insert(AsyncSeesItsSpan, queue=queue_name) for _ in range(4)]
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 4, what="async steps")
    spans = {s.attributes["gen_durable.instance_id"]: s for s in exporter.get_finished_spans()
             if s.attributes["gen_durable.machine"] == AsyncSeesItsSpan.name}
    assert set(spans) == set(ids)
    for id_ in ids:
        assert Instance.objects.get(id=id_).result == {"span_id": spans[id_].context.span_id}
    starts = sorted(s.start_time for s in spans.values())
    ends = sorted(s.end_time for s in spans.values())
    assert starts[-1] < ends[0]  # they overlapped


def test_pick_flush_and_queue_gauges_from_a_running_worker(otel_sdk, engine, committed, queue_name):
    exporter, reader, _ = otel_sdk
    engine({queue_name: 2})
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(5)]
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 5, what="steps ran")
    gd.pause_queue(queue_name)
    try:
        time.sleep(1.3)  # the schedulers see the pause
        waiting = [gd.insert(Plain, queue=queue_name) for _ in range(3)]
        from django.db import connection

        with connection.cursor() as cur:
            cur.execute("UPDATE gen_durable SET eligible_at = now() - interval '90 seconds' WHERE id = ANY(%s)",
                        [waiting])
        points = _points(reader)
    finally:
        gd.resume_queue(queue_name)
    picks = [p for a, p in points["gen_durable.pick.batch_size"] if a["queue"] == queue_name]
    assert sum(p.sum for p in picks) >= 5
    # Histograms of pick and flush times: counted (how many were recorded), never timed.
    timed_picks = sum(p.count for a, p in points["gen_durable.pick.duration"] if a["queue"] == queue_name)
    assert timed_picks >= 1
    assert sum(p.sum for _, p in points["gen_durable.flush.size"]) >= 5
    timed_flushes = sum(p.count for _, p in points["gen_durable.flush.duration"])
    assert timed_flushes >= 1
    depth = {a["queue"]: p.value for a, p in points["gen_durable.queue.depth"]}
    lag = {a["queue"]: p.value for a, p in points["gen_durable.queue.lag"]}
    assert depth[queue_name] == 3
    assert 80 <= lag[queue_name] <= 600
    assert len([s for s in exporter.get_finished_spans() if s.attributes["gen_durable.queue"] == queue_name]) == 5


def test_settings_checks_for_opentelemetry(monkeypatch):
    with override_settings(GEN_DURABLE={"OPENTELEMETRY": "yes"}):
        assert [e.id for e in checks.check_opentelemetry()] == ["gen_durable.E050"]
        assert otel.install_from_settings() is None
    with override_settings(GEN_DURABLE={"OPENTELEMETRY": {"TRACES": True, "LOGS": True}}):
        assert [e.id for e in checks.check_opentelemetry()] == ["gen_durable.E050"]
    with override_settings(GEN_DURABLE={"OPENTELEMETRY": {"TRACES": False, "METRICS": True}}):
        assert checks.check_opentelemetry() == []
        handler = otel.install_from_settings()
        try:
            assert (handler.traces, handler.metrics) == (False, True)
        finally:
            otel.uninstall()
    monkeypatch.setattr(otel, "available", lambda: False)
    with override_settings(GEN_DURABLE={"OPENTELEMETRY": True}):
        assert [e.id for e in checks.check_opentelemetry()] == ["gen_durable.E051"]
        assert otel.install_from_settings() is None
    with override_settings(GEN_DURABLE={"OPENTELEMETRY": False}):
        assert checks.check_opentelemetry() == []


def test_rundurable_logs_throughput_while_busy_and_nothing_while_idle(transactional_db, committed, queue_name, caplog):
    from django.db import connections

    from gen_durable.worker.supervisor import Supervisor, WorkerConfig

    sup = Supervisor(WorkerConfig(queues={queue_name: 2}, throughput_every=0.3))
    runner = threading.Thread(target=lambda: (sup.run(install_signals=False), connections.close_all()), daemon=True)
    with caplog.at_level(logging.DEBUG, logger="gen_durable"):
        runner.start()
        try:
            wait_until(lambda: any("starting" in r.getMessage() for r in caplog.records), what="start-up line")
            time.sleep(0.5)
            caplog.clear()
            time.sleep(1.5)  # idle: five throughput periods
            idle = [r for r in caplog.records if r.levelno >= logging.INFO]
            ids = [gd.insert(Plain, queue=queue_name) for _ in range(20)]
            wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 20, what="steps")
            wait_until(lambda: any("throughput" in r.getMessage() for r in caplog.records), what="throughput line")
        finally:
            sup.request_stop()
            runner.join(15)
    assert idle == [], [r.getMessage() for r in idle]
    line = next(r.getMessage() for r in caplog.records if "throughput" in r.getMessage())
    assert queue_name in line and "steps/s" in line


@pytest.mark.django_db(transaction=True)
def test_a_step_abandoned_past_its_timeout_counts_once_with_what_handle_did(otel_sdk, engine, queue_name):
    """The attempt's outcome (handle(StepTimeout): Done here) is counted when it is
    recorded, not when the stuck thread returns; that late return is a span marked
    "abandoned" and no step in the metrics. Before, the metrics saw nothing until the
    thread returned and then counted the dropped outcome as a `done` step. The hung step
    counts in gen_durable.steps.slow while it hangs."""
    import uuid

    from django.test import override_settings

    from tests.durable_app.time_machines import Hangs, gate

    exporter, reader, _ = otel_sdk
    name = f"g{uuid.uuid4().hex[:8]}"
    try:
        with override_settings(GEN_DURABLE={"QUEUES": {queue_name: 1}, "SLOW_STEP_SECONDS": 0.2}):
            sched = engine({queue_name: 1}).schedulers[queue_name]
            id_ = gd.insert(Hangs, queue=queue_name, state={"gate": name})
            wait_until(lambda: Instance.objects.get(id=id_).status == "done", what="StepTimeout handled")
            wait_until(lambda: any(a.get("machine") == Hangs.name
                                   for a, _ in _points(reader).get("gen_durable.steps", [])),
                       what="the attempt's outcome in the metrics")
            # While the thread still hangs: the outcome is counted, and the hang was seen.
            points = _points(reader)
            assert sched.stuck == 1
            assert {a["outcome"]: p.value for a, p in points["gen_durable.steps"] if a["machine"] == Hangs.name} \
                == {"done": 1}
            [(slow_attrs, slow)] = [(a, p) for a, p in points["gen_durable.steps.slow"] if a["machine"] == Hangs.name]
            assert slow.value == 1 and slow_attrs["step"] == "start"
            [duration] = [p for a, p in points["gen_durable.step.duration"] if a["machine"] == Hangs.name]
            assert duration.count == 1  # one attempt, one duration
            gate(name).set()  # the stuck thread returns Done({"late": True}): dropped
            wait_until(lambda: sched.stuck == 0, what="the stuck thread returned")
            wait_until(lambda: len([s for s in exporter.get_finished_spans()
                                    if s.attributes["gen_durable.instance_id"] == id_]) == 2, what="both spans")
    finally:
        gate(name).set()
    steps = {a["outcome"]: p.value for a, p in _points(reader)["gen_durable.steps"] if a["machine"] == Hangs.name}
    assert steps == {"done": 1}  # the late return is not a second step
    spans = sorted((s for s in exporter.get_finished_spans() if s.attributes["gen_durable.instance_id"] == id_),
                   key=lambda s: s.end_time)
    assert [s.attributes["gen_durable.outcome"] for s in spans] == ["done", "abandoned"]
    assert spans[1].status.status_code is StatusCode.ERROR and "abandoned" in spans[1].status.description
    assert Instance.objects.get(id=id_).result["timed_out"] is True
