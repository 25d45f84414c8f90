"""Prometheus (gen_durable/integrations/prometheus.py, docs/observability.md "Prometheus"):
the worker endpoint of `rundurable --metrics-port` scraped over HTTP after real steps,
the database view scraped through Django, and the errors of a bad configuration."""

import datetime as dt
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from django.test import Client
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import gen_durable as gd
from gen_durable.integrations import prometheus
from gen_durable.models import Instance, Worker
from gen_durable.testing import drain
from tests.conftest import wait_until
from tests.durable_app.durable import AlwaysRaises, Plain
from tests.factories import ExecutingFactory, InstanceFactory, TerminalFactory, WorkerFactory
from tests.integration.test_rundurable import MANAGE, ROOT, child_env, keep_signal_handlers  # noqa: F401


def free_port(n=1) -> int:
    """A port p such that p .. p+n-1 are free now on 127.0.0.1."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + n > 65535:
            continue
        try:
            for p in range(port, port + n):
                socket.create_server(("127.0.0.1", p)).close()
        except OSError:
            continue
        return port
    raise AssertionError("no free port range")


def scrape(url) -> dict:
    """{sample name: [(labels, value)]} of one scrape, parsed by prometheus_client."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return parse(text)


def parse(text) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples, name, **labels):
    """The one sample of `name` whose labels include `labels`."""
    found = [v for ls, v in samples.get(name, []) if all(ls.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


class ScrapesItsWorker(gd.Machine):
    """Scrapes the endpoint of the worker running it (a step runs while the worker serves)."""

    name = "tests.prometheus.ScrapesItsWorker"

    @gd.step
    def start(self, ctx):
        with urllib.request.urlopen(ctx.state["url"], timeout=10) as resp:
            return gd.Done({"status": resp.status, "text": resp.read().decode()})


# --- the worker endpoint -------------------------------------------------------------
@pytest.fixture
def worker_metrics():
    served = prometheus.serve_worker_metrics(free_port())
    yield served
    served.close()


@pytest.mark.django_db
def test_the_worker_endpoint_serves_step_counts_and_duration_histograms_after_a_drain(worker_metrics, queue_name):
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(4)]
    gd.insert(AlwaysRaises, queue=queue_name)
    drain(queue=queue_name)
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
    samples = scrape(worker_metrics.url)
    plain = {"machine": "tests.Plain", "step": "start", "outcome": "done"}
    assert value(samples, "gen_durable_steps_total", **plain) == 4
    assert value(samples, "gen_durable_step_duration_seconds_count", **plain) == 4
    # seconds buckets (not the SDK's millisecond defaults): a no-op step lands low
    assert value(samples, "gen_durable_step_duration_seconds_bucket", le="+Inf", **plain) == 4
    assert value(samples, "gen_durable_step_duration_seconds_bucket", le="3600.0", **plain) == 4
    buckets = {ls["le"] for ls, _ in samples["gen_durable_step_duration_seconds_bucket"]}
    assert buckets >= {"0.005", "1.0", "300.0"}  # seconds buckets, not the SDK's millisecond defaults
    raises = {"machine": "tests.AlwaysRaises", "step": "perform"}
    assert value(samples, "gen_durable_steps_total", outcome="retry", **raises) == AlwaysRaises.max_attempts - 1
    assert value(samples, "gen_durable_steps_total", outcome="stop", **raises) == 1
    assert value(samples, "gen_durable_step_duration_seconds_count", outcome="stop", **raises) == 1
    assert "process_cpu_seconds_total" in samples  # prometheus_client's default registry rides along


@pytest.mark.django_db
def test_the_worker_endpoint_works_beside_an_installed_opentelemetry_handler(worker_metrics, queue_name):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from gen_durable import otel

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel.install(meter_provider=provider, traces=False)  # as OPENTELEMETRY does, with the app's providers
    try:
        gd.insert(Plain, queue=queue_name)
        drain(queue=queue_name)
        own = [p.value for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
               for m in sm.metrics if m.name == "gen_durable.steps" for p in m.data.data_points
               if p.attributes["machine"] == "tests.Plain"]
    finally:
        otel.uninstall()
        provider.shutdown()
    assert own == [1]  # the application's provider still gets its points
    assert value(scrape(worker_metrics.url), "gen_durable_steps_total", machine="tests.Plain", outcome="done") == 1


def test_the_worker_endpoint_serves_pick_histograms_and_queue_gauges_of_a_running_worker(
        worker_metrics, engine, committed, queue_name):
    engine({queue_name: 2})
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(5)]
    wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 5, what="steps ran")
    gd.pause_queue(queue_name)
    try:
        import time

        time.sleep(1.3)  # the schedulers see the pause
        waiting = [gd.insert(Plain, queue=queue_name) for _ in range(3)]
        Instance.objects.filter(id__in=waiting).update(eligible_at=timezone.now() - dt.timedelta(seconds=90))
        samples = scrape(worker_metrics.url)
    finally:
        gd.resume_queue(queue_name)
    assert value(samples, "gen_durable_pick_batch_size_sum", queue=queue_name) >= 5
    picks = value(samples, "gen_durable_pick_duration_seconds_count", queue=queue_name)
    assert picks >= 1
    assert value(samples, "gen_durable_queue_depth", queue=queue_name) == 3
    assert 80 <= value(samples, "gen_durable_queue_lag_seconds", queue=queue_name) <= 600
    assert value(samples, "gen_durable_steps_total", machine="tests.Plain", outcome="done") >= 5


def test_closing_the_worker_endpoint_frees_its_port_and_detaches_its_handler():
    from gen_durable import telemetry

    port = free_port()
    served = prometheus.serve_worker_metrics(port)
    assert served.url == f"http://127.0.0.1:{port}/metrics"
    assert scrape(served.url)
    with pytest.raises(RuntimeError, match=rf"already serves its metrics at http://127\.0\.0\.1:{port}/metrics"):
        prometheus.serve_worker_metrics(free_port())  # one per process: it would serve every series twice
    served.close()
    assert all(h is not served.handler for _, h in telemetry._handlers)
    socket.create_server(("127.0.0.1", port)).close()  # free again
    again = prometheus.serve_worker_metrics(port)  # and a second endpoint may take it
    again.close()


def test_rundurable_serves_while_it_runs_and_frees_the_port_when_it_exits(committed, keep_signal_handlers,
                                                                           queue_name, caplog):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(3)]
    scraper = gd.insert(ScrapesItsWorker, queue=queue_name, state={"url": url}, priority=10)  # after the others
    with caplog.at_level("INFO", "gen_durable"):
        call_command("rundurable", "--burst", "--queue", f"{queue_name}=1", "--no-gc", "--metrics-port", str(port),
                     verbosity=1)
    assert f"serving Prometheus metrics at {url}" in caplog.text
    assert "+ 1 metrics scrape)" in caplog.text  # the gauges' connection is in the budget
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
    result = Instance.objects.get(id=scraper).result
    assert result["status"] == 200
    samples = parse(result["text"])
    assert value(samples, "gen_durable_steps_total", machine="tests.Plain", outcome="done") == 3
    assert value(samples, "gen_durable_queue_depth", queue=queue_name) == 0  # only the scraper, executing
    socket.create_server(("127.0.0.1", port)).close()  # closed with the worker


def test_two_worker_processes_each_serve_their_own_port(committed, queue_name):
    port = free_port(2)
    proc = subprocess.Popen(MANAGE + ["rundurable", "--processes", "2", "--queue", f"{queue_name}=2", "--no-gc",
                                      "--metrics-port", str(port)],
                            cwd=ROOT, env=child_env(), stderr=subprocess.PIPE, text=True)
    try:
        def up(p):
            try:
                return scrape(f"http://127.0.0.1:{p}/metrics")
            except OSError:
                return None

        wait_until(lambda: up(port) and up(port + 1), timeout=60, what="both children's endpoints")
        ids = gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(40)])
        wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 40, timeout=60,
                   what="steps")

        def steps_seen():
            total = 0
            for p in (port, port + 1):
                total += sum(v for ls, v in up(p).get("gen_durable_steps_total", [])
                             if ls["machine"] == "tests.Plain" and ls["outcome"] == "done")
            return total == 40 and total

        wait_until(steps_seen, timeout=10, what="the two endpoints' step counts to add up to 40")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert f"child 0 will serve Prometheus metrics on port {port}" in err
    assert f"child 1 will serve Prometheus metrics on port {port + 1}" in err
    assert f"serving Prometheus metrics at http://127.0.0.1:{port + 1}/metrics (child 1)" in err


# --- misconfiguration ----------------------------------------------------------------
def _child_pid(log, i: int):
    """The pid of `rundurable --processes` child `i`, from its supervisor's log (`log`:
    its stderr): the last "child i is process N" line — a forked child has its parent's
    command line, so /proc cannot tell which child it is."""
    import re

    found = re.findall(rf"child {i} is process (\d+) ", log.read_text())
    return int(found[-1]) if found else None


def test_a_restarted_child_whose_metrics_port_was_taken_keeps_running_jobs(committed, queue_name, tmp_path):
    """kill -9 of child 1, its port taken before the restart: the new child logs the error and
    runs jobs (child 0 is stopped meanwhile, so only it can), and serves once the port is free."""
    import os

    port = free_port(2)
    log = tmp_path / "stderr"
    with open(log, "w") as err:
        proc = subprocess.Popen(MANAGE + ["rundurable", "--processes", "2", "--queue", f"{queue_name}=2", "--no-gc",
                                          "--metrics-port", str(port)], cwd=ROOT, env=child_env(), stderr=err,
                                text=True)
    stopped, squatter = None, None

    def up(p):
        try:
            return scrape(f"http://127.0.0.1:{p}/metrics")
        except OSError:
            return None

    try:
        wait_until(lambda: up(port) and up(port + 1), timeout=60, what="both children's endpoints")
        first = _child_pid(log, 1)
        os.kill(first, signal.SIGKILL)
        squatter = wait_until(lambda: _bind(port + 1), timeout=10, what="the dead child's port")
        second = wait_until(lambda: (pid := _child_pid(log, 1)) not in (None, first) and pid, timeout=30,
                            what="child 1 restarted")
        wait_until(lambda: f"child 1 cannot serve its metrics on port {port + 1}" in log.read_text(), timeout=30,
                   what="the restarted child's error")
        stopped = _child_pid(log, 0)
        os.kill(stopped, signal.SIGSTOP)  # only the restarted child can run the jobs now
        ids = gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(20)])
        wait_until(lambda: Instance.objects.filter(id__in=ids, status="done").count() == 20, timeout=30,
                   what="the restarted child to run the jobs")
        assert proc.poll() is None and _child_pid(log, 1) == second  # nobody gave up, nothing died again
        os.kill(stopped, signal.SIGCONT)
        stopped = None
        squatter.close()
        squatter = None
        wait_until(lambda: up(port + 1), timeout=15, what="child 1 to bind its port once it is free")
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if squatter is not None:
            squatter.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "keeps running jobs without them" in text and "gave up" not in text
    assert f"serving Prometheus metrics at http://127.0.0.1:{port + 1}/metrics (child 1)" in text.split(
        "cannot serve its metrics")[1]  # served after the error


def _bind(port):
    try:
        return socket.create_server(("127.0.0.1", port))
    except OSError:
        return None


@pytest.mark.parametrize("argv, message", [
    (["--metrics-port", "0"], r"expected a TCP port \(1-65535\), got 0"),
    (["--metrics-port", "65536"], r"expected a TCP port \(1-65535\), got 65536"),
    (["--metrics-port", "http"], r"expected a TCP port \(1-65535\), got 'http'"),
    (["--metrics-address", "0.0.0.0"], "--metrics-address needs --metrics-port"),
    (["--metrics-port", "65535", "--processes", "2"], "serve ports 65535-65536, past 65535"),
])
def test_bad_metrics_arguments_are_refused(db, argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("rundurable", "--burst", *argv)


def test_a_metrics_port_in_use_is_refused_before_any_worker_starts(transactional_db, queue_name):
    port = free_port(2)
    with socket.create_server(("127.0.0.1", port + 1)):  # the second child's port
        with pytest.raises(CommandError, match=rf"cannot serve metrics on 127\.0\.0\.1:{port + 1}: .*in use.*"
                                               r"\(another process on this host has the port\?"):
            call_command("rundurable", "--processes", "2", "--queue", queue_name, "--metrics-port", str(port))
        with pytest.raises(OSError, match=rf"cannot serve Prometheus metrics on 127\.0\.0\.1:{port + 1}: .*in use"):
            prometheus.serve_worker_metrics(port + 1)


def test_a_metrics_address_that_is_not_this_hosts_is_refused(transactional_db, queue_name):
    with pytest.raises(CommandError, match=r"cannot serve metrics on 192\.0\.2\.1:") as refused:
        call_command("rundurable", "--burst", "--queue", queue_name, "--metrics-port", str(free_port()),
                     "--metrics-address", "192.0.2.1")  # TEST-NET-1: no host has it
    # The address is named as the problem, not the port (EADDRNOTAVAIL).
    assert ("192.0.2.1 is not an address of this host (127.0.0.1, 0.0.0.0 or one of its interfaces)"
            in str(refused.value))
    assert "another process" not in str(refused.value) and "--metrics-port)" not in str(refused.value)


def test_a_missing_extra_names_the_pip_install(transactional_db, monkeypatch, queue_name):
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.prometheus", None)  # import fails
    with pytest.raises(CommandError, match=r'opentelemetry\.exporter\.prometheus cannot be imported: install the '
                                           r'prometheus extra \(pip install -e "/path/to/gen_durable\[prometheus\]" '
                                           r'from a checkout, pip install "gen-durable\[prometheus\]" from a '
                                           r'package index\)'):
        call_command("rundurable", "--burst", "--queue", queue_name, "--metrics-port", str(free_port()))
    with pytest.raises(ImportError, match=r"gen-durable\[prometheus\]"):
        prometheus.serve_worker_metrics(free_port())


def test_the_view_module_without_prometheus_client_names_the_pip_install(monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "gen_durable.integrations.prometheus")
    with pytest.raises(ImportError, match=r'needs prometheus_client .*install the prometheus extra '
                                          r'\(pip install -e "/path/to/gen_durable\[prometheus\]" from a checkout'):
        importlib.import_module("gen_durable.integrations.prometheus")
    monkeypatch.undo()
    assert importlib.import_module("gen_durable.integrations.prometheus") is prometheus


def test_serve_worker_metrics_rejects_a_bad_port_or_address():
    for port in (0, 70000, "9464", True):
        with pytest.raises(ValueError, match="metrics port must be an int in 1-65535"):
            prometheus.serve_worker_metrics(port)
    with pytest.raises(ValueError, match="metrics address must be"):
        prometheus.serve_worker_metrics(free_port(), "")


# --- the database view ---------------------------------------------------------------
def _seed(queues):
    """Rows in `queues`: per queue i, i+1 due rows, one due later, one executing."""
    Worker.objects.all().delete()
    now = timezone.now()
    for i, q in enumerate(queues):
        for _ in range(i + 1):
            InstanceFactory(queue=q, eligible_at=now - dt.timedelta(seconds=120 * (i + 1)))
        InstanceFactory(queue=q, eligible_at=now + dt.timedelta(hours=1))
        ExecutingFactory(queue=q)
    TerminalFactory(queue=queues[0])  # finished now
    TerminalFactory(queue=queues[0], status="failed")
    TerminalFactory(queue=queues[0], status="done", updated_at=now - dt.timedelta(minutes=30))
    TerminalFactory(queue=queues[0], status="failed", updated_at=now - dt.timedelta(minutes=30))
    TerminalFactory(queue=queues[0], status="failed", updated_at=now - dt.timedelta(hours=2))  # out of both windows
    WorkerFactory(queues=[queues[0]])
    WorkerFactory(queues=[queues[0], queues[-1]])
    WorkerFactory(queues=[queues[0]], last_seen=now - dt.timedelta(hours=1))  # gone


@pytest.mark.django_db
def test_the_view_reports_queue_gauges_completions_and_workers_from_the_database(client, queue_name):
    queues = [f"{queue_name}_a", f"{queue_name}_b", f"{queue_name}_c"]
    _seed(queues)
    gd.pause_queue(queues[1])
    resp = client.get("/metrics/")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain; version=0.0.4")
    assert resp["Cache-Control"] == "no-store"
    samples = parse(resp.content.decode())
    for i, q in enumerate(queues):
        on = {"database": "default", "queue": q}
        assert value(samples, "gen_durable_db_queue_runnable", **on) == i + 2
        assert value(samples, "gen_durable_db_queue_due", **on) == i + 1
        assert 120 * (i + 1) - 1 <= value(samples, "gen_durable_db_queue_oldest_due_age_seconds", **on) < 120 * (i + 1) + 600
        assert value(samples, "gen_durable_db_queue_executing", **on) == 1
        assert value(samples, "gen_durable_db_queue_paused", **on) == (1 if i == 1 else 0)
    assert value(samples, "gen_durable_db_queue_workers", queue=queues[0]) == 2
    assert value(samples, "gen_durable_db_queue_workers", queue=queues[1]) == 0
    assert value(samples, "gen_durable_db_queue_workers", queue=queues[2]) == 1
    assert value(samples, "gen_durable_db_finished", window="1m") == 2
    assert value(samples, "gen_durable_db_finished", window="1h") == 4
    assert value(samples, "gen_durable_db_failed", window="1m") == 1
    assert value(samples, "gen_durable_db_failed", window="1h") == 2
    assert value(samples, "gen_durable_db_workers_live", database="default") == 2
    # a configured queue with nothing in it is reported as zeros, not left out
    empty = {"database": "default", "queue": "default"}
    assert value(samples, "gen_durable_db_queue_runnable", **empty) == 0
    assert value(samples, "gen_durable_db_queue_oldest_due_age_seconds", **empty) == 0


@pytest.mark.django_db
def test_one_scrape_runs_six_statements_whatever_the_number_of_queues(client, queue_name):
    """Six reads, whatever the number of queues, and the timeout around them: set, then
    put back (the test's transaction stands for ATOMIC_REQUESTS), in a savepoint."""
    reads, bound = [], []
    for n in (1, 8):
        _seed([f"{queue_name}_{n}_{i}" for i in range(n)])
        with CaptureQueriesContext(connection) as ctx:
            assert client.get("/metrics/").status_code == 200
        sqls = [q["sql"] for q in ctx.captured_queries]
        bound.append([s for s in sqls if "statement_timeout" in s or "SAVEPOINT" in s])
        reads.append(len(sqls) - len(bound[-1]))
    assert reads == [6, 6], reads
    assert [len(b) for b in bound] == [4, 4], bound  # SAVEPOINT, set, put back, RELEASE


def _statement_timeout():
    with connection.cursor() as cur:
        cur.execute("SHOW statement_timeout")
        return cur.fetchone()[0]


@pytest.mark.django_db
def test_a_scrape_inside_the_requests_transaction_leaves_its_statement_timeout_as_it_was(client):
    """Under ATOMIC_REQUESTS (here: the test's transaction) the view's SET LOCAL would
    outlive its released savepoint and cut the rest of the request's statements."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL statement_timeout = '7s'")
    assert client.get("/metrics/").status_code == 200
    assert _statement_timeout() == "7s"


@pytest.mark.django_db(transaction=True)
def test_a_locked_table_gets_a_503_within_the_timeout_not_a_hung_request(monkeypatch, caplog):
    """A LOCK TABLE held elsewhere (a migration, REINDEX): the scrape's statement is cut
    after SCRAPE_TIMEOUT and the view answers 503 naming the database, then
    serves again once the lock is gone. Without the bound the request waits for the
    lock as long as it is held."""
    import threading

    import psycopg

    monkeypatch.setattr(prometheus, "SCRAPE_TIMEOUT", 0.3)
    params = connection.get_connection_params()
    locker = psycopg.connect(**{k: v for k, v in params.items() if k not in ("cursor_factory", "context")})
    answered = []
    try:
        locker.execute("LOCK TABLE gen_durable IN ACCESS EXCLUSIVE MODE")
        scrape_thread = threading.Thread(target=lambda: answered.append(Client().get("/metrics/")), daemon=True)
        with caplog.at_level("WARNING", "gen_durable"):
            scrape_thread.start()
            scrape_thread.join(30)  # the lock is held for as long as this waits
    finally:
        locker.rollback()
        locker.close()
    assert answered, "the scrape waited for the lock"
    assert answered[0].status_code == 503
    assert b"gen_durable database 'default' did not answer" in answered[0].content
    assert b"statement timeout" in answered[0].content
    assert "metrics_view: database 'default' did not answer" in caplog.text
    assert Client().get("/metrics/").status_code == 200
    assert _statement_timeout() == "0"  # the test connection's own setting, untouched


@pytest.mark.django_db(transaction=True)
def test_a_server_slow_on_every_statement_gets_a_503_within_the_scrapes_budget(monkeypatch, caplog):
    """The statements of one scrape share SCRAPE_TIMEOUT: a server that takes 0.25 s
    before each of them (pg_sleep, run ahead of every statement of the view) is not
    given six timeouts. With 0.6 s for the scrape the third statement finds the budget
    spent (or is cut), and the view answers 503; one timeout per statement would let all
    six through (200, after about 1.5 s)."""
    from django.db import connections

    monkeypatch.setattr(prometheus, "SCRAPE_TIMEOUT", 0.6)
    slow_before = []

    def slow_server(execute, sql, params, many, context):
        with context["connection"].wrap_database_errors:  # as Django reports a statement's error
            context["cursor"].cursor.execute("SELECT pg_sleep(0.25)")
        slow_before.append(sql)
        return execute(sql, params, many, context)

    with connections["default"].execute_wrapper(slow_server), caplog.at_level("WARNING", "gen_durable"):
        answered = Client().get("/metrics/")
    assert answered.status_code == 503, answered.content[:500]
    assert b"gen_durable database 'default' did not answer" in answered.content
    assert b"were spent" in answered.content or b"statement timeout" in answered.content, answered.content
    assert 2 <= len(slow_before) < 6, slow_before  # stopped part-way through the six statements
    assert Client().get("/metrics/").status_code == 200


@pytest.mark.django_db
def test_runnable_counts_stop_at_the_cap(client, queue_name):
    from gen_durable import queues

    # the cap is the overview's; a smaller one here keeps the test's rows few
    InstanceFactory.create_batch(7, queue=queue_name, eligible_at=timezone.now() - dt.timedelta(seconds=5))
    original = queues.COUNT_CAP
    try:
        queues.COUNT_CAP = 5
        samples = parse(client.get("/metrics/").content.decode())
    finally:
        queues.COUNT_CAP = original
    assert value(samples, "gen_durable_db_queue_runnable", queue=queue_name) == 5
    assert value(samples, "gen_durable_db_queue_due", queue=queue_name) == 5


@pytest.mark.django_db(databases=["default", "other"])
def test_the_view_reads_another_database_by_query_or_urls_kwargs(client, queue_name, settings):
    # ?database= names only gen_durable's databases: a routed one here
    assert client.get("/metrics/?database=other").status_code == 404
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "DATABASES": {"QUEUES": {queue_name: "other"}}}
    InstanceFactory._meta.database = "other"
    try:
        InstanceFactory.create_batch(2, queue=queue_name)
    finally:
        InstanceFactory._meta.database = "default"
    for url in ("/metrics/?database=other", "/metrics/other/"):
        samples = parse(client.get(url).content.decode())
        assert value(samples, "gen_durable_db_queue_runnable", database="other", queue=queue_name) == 2
    samples = parse(client.get("/metrics/").content.decode())
    assert not [ls for ls, _ in samples["gen_durable_db_queue_runnable"] if ls["queue"] == queue_name]


@pytest.mark.django_db
def test_the_view_refuses_what_it_does_not_understand(client):
    assert client.get("/metrics/?database=nope").status_code == 404
    two = client.get("/metrics/?database=default&database=other")
    assert two.status_code == 400 and b"one ?database=ALIAS at a time" in two.content
    bad = client.get("/metrics/?databse=other")
    assert bad.status_code == 400 and b"databse" in bad.content
    assert client.post("/metrics/").status_code == 405
    strict = Client(enforce_csrf_checks=True)  # a scraper sends no CSRF token: 405, not the middleware's 403
    for method in (strict.post, strict.put, strict.delete):
        refused = method("/metrics/")
        assert refused.status_code == 405 and refused["Allow"] == "GET, HEAD"
    openmetrics = client.get("/metrics/", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert openmetrics["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.content.rstrip().endswith(b"# EOF")

