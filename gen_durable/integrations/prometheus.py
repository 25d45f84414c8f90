"""Prometheus metrics for gen_durable, two ways (docs/observability.md, "Prometheus").

Needs the `prometheus` extra: `pip install -e "/path/to/gen_durable[prometheus]"` from a
checkout, `pip install "gen-durable[prometheus]"` from a package index.

1. Worker metrics — `rundurable --metrics-port PORT` (`serve_worker_metrics`): each
   worker process serves, over HTTP, the OpenTelemetry metrics gen_durable.otel records
   (steps, step/pick/flush histograms, the queue depth/lag gauges of the queues it
   runs), through OpenTelemetry's Prometheus exporter on prometheus_client's default
   registry — so the process's own `process_*`/`python_*` metrics, and any metric your
   code registers with prometheus_client, are served with them. This is an extra
   telemetry handler with its own MeterProvider: OPENTELEMETRY and your global
   providers (OTLP) keep working beside it.

2. Database metrics — `metrics_view` (a Django view for a web process's urls.py): gauges
   computed from Postgres at each scrape by `DurableCollector`, a custom collector in a
   CollectorRegistry of its own: runnable, due, executing rows and the oldest due row's
   age per queue, paused queues, live workers, rows finished and failed in the last
   minute and hour. A fixed number of bounded statements per scrape, whatever the
   number of queues or rows (the admin overview's, docs/admin.md lists their plans).
   Put it behind your project's authentication or network rules: it shows queue names
   and counts (no row contents, hosts or settings).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

try:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.exposition import choose_encoder
except ImportError as exc:  # a web process that lists the view without the extra
    from ..conf import install_hint

    raise ImportError(f"gen_durable.integrations.prometheus needs prometheus_client ({exc}): "
                      f"{install_hint('prometheus')}") from exc

from django.db import DatabaseError
from django.views.decorators.csrf import csrf_exempt

from .. import db, sql, telemetry
from ..conf import database_alias, get_settings, install_hint
from ..queues import COUNT_CAP, configured_queues, queue_depth

EXTRA_HINT = install_hint("prometheus")
DEFAULT_ADDRESS = "127.0.0.1"
logger = logging.getLogger("gen_durable.metrics")
# The `window` label values of the completion gauges, in metrics_completions.sql's column order.
WINDOWS = ("1m", "1h")
# seconds: what the statements of one metrics_view scrape get together. A lock held by a
# migration or REINDEX, a stalled or slow server: the statement running when they are
# spent is cut and the view answers 503, inside Prometheus' default 10 s scrape timeout,
# instead of holding the web worker until the lock goes.
SCRAPE_TIMEOUT = 5.0


# --- 1. worker metrics ---------------------------------------------------------------
def worker_exporter_available() -> str | None:
    """None when the worker endpoint can be served, else what is missing (and the fix)."""
    missing = []
    for module in ("opentelemetry.sdk.metrics", "opentelemetry.exporter.prometheus"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        return f"{', '.join(missing)} cannot be imported: {EXTRA_HINT}"
    return None


@dataclass
class WorkerMetrics:
    """A worker process's running endpoint (`serve_worker_metrics`); `close()` stops it."""

    address: str
    port: int
    server: object
    thread: object
    provider: object
    handler: object

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        global _serving
        telemetry.detach(self.handler)
        self.server.shutdown()
        self.server.server_close()
        self.provider.shutdown()  # unregisters the exporter's collector from the registry
        with _serving_lock:
            if _serving is self:
                _serving = None


# The endpoint of this process: the exporter's collector lives in prometheus_client's
# default registry, so a second one would serve every gen_durable series twice.
_serving: WorkerMetrics | None = None
_serving_lock = threading.Lock()


def serve_worker_metrics(port: int, address: str = DEFAULT_ADDRESS, *,
                         using: str | list[str] | None = None) -> WorkerMetrics:
    """Serve this process's gen_durable metrics at http://ADDRESS:PORT/metrics.

    Attaches a metrics-only gen_durable.otel handler whose MeterProvider reads through
    OpenTelemetry's PrometheusMetricReader, and starts prometheus_client's HTTP server
    (a daemon thread). `using`: the database alias of the queue gauges, or a list of
    aliases (each gauge then carries a `database` label); default GEN_DURABLE['DATABASE'].
    One per process. Raises ImportError (the extra is missing), ValueError (a port
    outside 1–65535), RuntimeError (this process already serves one: close() it first)
    or OSError (the address cannot be bound: the port is in use, the address is not this
    host's), each naming the address and port.
    """
    global _serving
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"metrics port must be an int in 1-65535, got {port!r}")
    if not isinstance(address, str) or not address:
        raise ValueError(f"metrics address must be a host name or IP address, got {address!r}")
    problem = worker_exporter_available()
    if problem:
        raise ImportError(f"Prometheus worker metrics: {problem}")
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import start_http_server

    from .otel import OtelHandler

    with _serving_lock:
        if _serving is not None:
            raise RuntimeError(f"this process already serves its metrics at {_serving.url}: close() it first")
        try:
            server, thread = start_http_server(port, addr=address)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise OSError(exc.errno, f"cannot serve Prometheus metrics on {address}:{port}: {reason}") from exc
        provider = MeterProvider(metric_readers=[PrometheusMetricReader()])
        handler = OtelHandler(meter_provider=provider, traces=False, metrics=True,
                              using=tuple(using) if isinstance(using, (list, tuple)) else using)
        telemetry.attach("", handler)
        _serving = WorkerMetrics(address, port, server, thread, provider, handler)
        return _serving


# --- 2. database metrics -------------------------------------------------------------
class DurableCollector:
    """prometheus_client collector: gen_durable's gauges read from database `using`.

    Each collect() runs six statements, whatever the number of queues and rows:
    overview_runnable_queues, paused_queues, overview_workers, overview_executing,
    overview_queue_depth and metrics_completions (each bounded, docs/admin.md).
    """

    def __init__(self, using: str | None = None):
        self.using = database_alias(using)

    def describe(self):
        return []  # nothing to check for duplicates: no statement at registration

    def collect(self):
        using = self.using
        runnable_queues = [r[0] for r in db.fetchall(sql.OVERVIEW_RUNNABLE_QUEUES, None, using)]
        paused = {r[0] for r in db.fetchall(sql.PAUSED_QUEUES, None, using)}
        served: dict = {}
        live = 0
        for *_ids, queues, _started, _seen, is_live in db.fetchall(sql.OVERVIEW_WORKERS,
                                                                   {"live": get_settings().LEASE_TTL}, using):
            if is_live:
                live += 1
                for q in queues or ():
                    served[q] = served.get(q, 0) + 1
        executing: dict = {}
        for _locked_by, queue, n, *_rest in db.fetchall(sql.OVERVIEW_EXECUTING, None, using):
            executing[queue] = executing.get(queue, 0) + n
        names = sorted(set(configured_queues()) | set(runnable_queues) | paused | set(served) | set(executing))
        depth = queue_depth(names, using)
        finished_1m, finished_1h, failed_1m, failed_1h = db.fetchone(sql.METRICS_COMPLETIONS, None, using)

        labels = ["database", "queue"]
        runnable = GaugeMetricFamily("gen_durable_db_queue_runnable",
                                     f"Runnable rows per queue (counted up to {COUNT_CAP})", labels=labels)
        due = GaugeMetricFamily("gen_durable_db_queue_due",
                                f"Runnable rows due now per queue (counted up to {COUNT_CAP})", labels=labels)
        age = GaugeMetricFamily("gen_durable_db_queue_oldest_due_age_seconds",
                                "Age of the oldest due runnable row per queue (0 when none is due)",
                                labels=labels, unit="seconds")
        running = GaugeMetricFamily("gen_durable_db_queue_executing", "Rows executing per queue", labels=labels)
        paused_g = GaugeMetricFamily("gen_durable_db_queue_paused", "1 when the queue is paused", labels=labels)
        workers_q = GaugeMetricFamily("gen_durable_db_queue_workers", "Live worker processes serving the queue",
                                      labels=labels)
        for q in names:
            n_runnable, n_due, oldest, now = depth.get(q, (0, 0, None, None))
            seconds = max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0
            key = [using, q]
            runnable.add_metric(key, n_runnable)
            due.add_metric(key, n_due)
            age.add_metric(key, seconds)
            running.add_metric(key, executing.get(q, 0))
            paused_g.add_metric(key, 1 if q in paused else 0)
            workers_q.add_metric(key, served.get(q, 0))
        yield from (runnable, due, age, running, paused_g, workers_q)
        finished = GaugeMetricFamily("gen_durable_db_finished",
                                     "Rows that became done or failed within the window", labels=["database", "window"])
        failed = GaugeMetricFamily("gen_durable_db_failed", "Rows that failed within the window",
                                   labels=["database", "window"])
        for window, f, x in zip(WINDOWS, (finished_1m, finished_1h), (failed_1m, failed_1h)):
            finished.add_metric([using, window], f)
            failed.add_metric([using, window], x)
        yield finished
        yield failed
        workers = GaugeMetricFamily("gen_durable_db_workers_live",
                                    "Worker processes whose heartbeat was seen within LEASE_TTL", labels=["database"])
        workers.add_metric([using], live)
        yield workers


def served_aliases(using: str | None = None) -> list[str]:
    """The aliases `?database=` may name: GEN_DURABLE['DATABASE'], every alias
    GEN_DURABLE['DATABASES'] routes to, and the view's own `using`."""
    found = [database_alias(), database_alias(using)]
    routes = get_settings().DATABASES if isinstance(get_settings().DATABASES, dict) else {}
    for section in ("MACHINES", "QUEUES"):
        value = routes.get(section)
        found += [a for a in (value.values() if isinstance(value, dict) else ()) if isinstance(a, str)]
    return list(dict.fromkeys(found))


@csrf_exempt  # it changes nothing: a POST gets the documented 405, not the CSRF middleware's 403
def metrics_view(request, using: str | None = None):
    """Django view: the database metrics in Prometheus' text format (OpenMetrics when the
    scraper asks for it). `?database=ALIAS` picks another alias of DATABASES (default:
    `using`, from urls.py's kwargs, else GEN_DURABLE['DATABASE']); an alias that is not
    one of gen_durable's (`served_aliases`) is a 404, two different aliases or any other
    query parameter a 400.
    GET and HEAD only."""
    from django.db import connections
    from django.http import Http404, HttpResponse, HttpResponseBadRequest, HttpResponseNotAllowed

    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    unknown = sorted(set(request.GET) - {"database"})
    if unknown:
        return HttpResponseBadRequest(f"unknown query parameter(s) {', '.join(unknown)}; only ?database=ALIAS\n",
                                      content_type="text/plain")
    if len(set(request.GET.getlist("database"))) > 1:
        return HttpResponseBadRequest("one ?database=ALIAS at a time\n", content_type="text/plain")
    alias = request.GET.get("database") or database_alias(using)
    if alias not in connections.settings or alias not in served_aliases(using):
        # Only gen_durable's databases: an open scrape URL must not reach any other alias.
        raise Http404(f"no gen_durable database {alias!r}")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DurableCollector(alias))
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT"))
    try:
        body = _bounded(alias, lambda: encoder(registry))
    except DatabaseError as exc:
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__
        logger.warning("metrics_view: database %r did not answer (%s); the scrape gets a 503", alias, reason)
        response = HttpResponse(f"gen_durable database {alias!r} did not answer: {reason}\n",
                                status=503, content_type="text/plain")
    else:
        response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response


def _bounded(alias: str, produce):
    """Return `produce()`, whose statements run on `alias` in a transaction (a savepoint
    inside the request's own, under ATOMIC_REQUESTS) and share SCRAPE_TIMEOUT seconds:
    each runs with statement_timeout set to what is left (`_ScrapeBudget`). Inside a
    request's transaction the previous timeout is put back afterwards, since a released
    savepoint keeps a SET LOCAL. Raises DatabaseError (a cut statement, the budget spent,
    a server that cannot be reached)."""
    from django.db import connections, transaction

    outer = connections[alias].in_atomic_block
    with transaction.atomic(using=alias):
        (before,) = db.fetchone("SELECT current_setting('statement_timeout')", None, alias)
        with connections[alias].execute_wrapper(_ScrapeBudget(SCRAPE_TIMEOUT)):
            result = produce()
        if outer:
            db.execute("SELECT set_config('statement_timeout', %s, true)", [before], alias)
    return result


class _ScrapeBudget:
    """A Django execute wrapper: before each statement, statement_timeout (SET LOCAL)
    becomes the seconds left until the deadline; past it, OperationalError, no statement.
    One extra round trip per statement (six per scrape), so that six slow statements
    cannot take six timeouts."""

    def __init__(self, seconds: float):
        self.seconds, self.deadline = seconds, time.monotonic() + seconds

    def __call__(self, execute, sql, params, many, context):
        from django.db import OperationalError

        left = self.deadline - time.monotonic()
        if left < 0.001:
            raise OperationalError(f"the scrape's {self.seconds:g} s for its statements were spent")
        # The driver's own cursor: through Django's it would come back to this wrapper.
        context["cursor"].cursor.execute("SELECT set_config('statement_timeout', %s, true)",
                                         [f"{max(int(left * 1000), 1)}ms"])
        return execute(sql, params, many, context)
