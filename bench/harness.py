"""Common benchmark harness: scratch databases, repeated runs, results files.

A *workload* is a callable ``fn(db_url: str) -> dict`` that does one complete,
self-bounded measurement against the (empty, freshly created) database at ``db_url``
and returns a measurement dict:

    rate          float, required: the headline number (e.g. jobs completed per second)
    unit          str, default "jobs/s"
    n             int: how many jobs/rows the rate is over
    elapsed_s     float: the timed window the rate was computed from
    enqueue_s     float, optional: time to pre-fill the queue (NOT in the rate)
    enqueue_rate  float, optional: n / enqueue_s
    knobs         dict, optional: the settings used (batch size, concurrency, ...)
    note          str, optional: anything a reader must know to interpret the number

`run_benchmark` calls a workload ``runs`` times, each on its own scratch database
``bench_<name>`` created on the server at BENCH_DATABASE_URL and dropped afterwards,
and reduces the rates to median and min–max. `save_results` merges summaries into
``bench/results/results.json`` (keyed by benchmark name; other entries are kept) and
regenerates ``bench/results/results.md`` from the merged set.

Only a server on this machine is accepted (127.0.0.1/localhost/::1 or a Unix socket).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import json
import os
import platform
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence
from urllib.parse import parse_qs, unquote, urlencode, urlsplit, urlunsplit

import psycopg

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
RESULTS_JSON = RESULTS_DIR / "results.json"
RESULTS_MD = RESULTS_DIR / "results.md"

DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"
DEFAULT_RUNS = 3
DEFAULT_TIMEOUT_S = 120.0  # per single run; every workload enforces it itself

# Worker start-up inside or outside the drain clock (drain_with_processes); run_all.py
# --startup sets it for a whole run, BENCH_STARTUP for a standalone script.
STARTUP_MODES = ("inside", "outside")
STARTUP = os.environ.get("BENCH_STARTUP", "inside")


def _sitting_id() -> str:
    """This invocation's sitting: the machine's boot and the start time. The targets
    compare two benchmarks only within one sitting (a ratio across sittings — another
    machine or another hour of a shared host — says little)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = platform.node()
    return f"{boot}-{_dt.datetime.now(_dt.timezone.utc).strftime('%Y%m%dT%H%M%S')}"


SITTING = _sitting_id()

LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "::1", "[::1]"}

Workload = Callable[[str], dict]


class BenchError(RuntimeError):
    """A workload could not produce a valid measurement."""


class BenchTimeout(BenchError):
    """A workload exceeded its time bound."""


# --------------------------------------------------------------------------- URLs


def server_url() -> str:
    url = os.environ.get("BENCH_DATABASE_URL") or DEFAULT_SERVER_URL
    check_local(url)
    return url


def _hosts(url: str) -> list[str]:
    """Every host a libpq URL may connect to: the netloc host(s) and ?host=/?hostaddr=."""
    parts = urlsplit(url)
    hosts = []
    for hp in parts.netloc.rsplit("@", 1)[-1].split(","):
        if hp.startswith("["):
            hosts.append(hp[1 : hp.index("]")])
        else:
            hosts.append(hp.split(":", 1)[0])
    query = parse_qs(parts.query)
    for key in ("host", "hostaddr"):
        for h in query.get(key, []):
            hosts.extend(h.split(","))
    return hosts


def check_local(url: str) -> None:
    """Refuse any server that is not on this machine."""
    if not url.startswith(("postgres://", "postgresql://")):
        raise BenchError(f"BENCH_DATABASE_URL must be a postgres:// URL, got {url!r}")
    for h in _hosts(url):
        h = unquote(h)
        if h in LOCAL_HOSTS or h.startswith("/") or h.startswith("127."):
            continue
        raise BenchError(f"refusing non-local database host {h!r}: benchmarks run against this machine only")


def url_for_db(url: str, dbname: str) -> str:
    """The same server URL pointing at database ``dbname``."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    query.pop("dbname", None)
    return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, urlencode(query, doseq=True), ""))


def django_db_settings(url: str) -> dict:
    """A Django DATABASES['default'] dict for a postgres URL (TCP or socket)."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    host = parts.hostname or ""
    if "host" in query:
        host = query["host"][0]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or "postgres"),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or (query.get("port", [""])[0])),
    }


def db_identifier(name: str) -> str:
    ident = "bench_" + re.sub(r"[^a-z0-9_]", "_", name.lower())
    return ident[:63]


# ---------------------------------------------------------------- scratch databases


@contextlib.contextmanager
def scratch_database(name: str, server: str | None = None) -> Iterator[str]:
    """Create database ``bench_<name>`` (dropping a leftover first), yield its URL, drop it."""
    server = server or server_url()
    check_local(server)
    dbname = db_identifier(name)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{dbname}"')
    try:
        yield url_for_db(server, dbname)
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')


BENCH_LOCK_KEY = 0x6764_6265_6E63  # "gdbenc": one benchmark at a time per server


@contextlib.contextmanager
def exclusive_bench(server: str | None = None, wait_s: float = 900.0) -> Iterator[None]:
    """Hold a server-wide advisory lock so two bench processes never overlap.

    Concurrent runs would share scratch database names and, worse, CPU: on a 2-core
    machine any overlap invalidates both measurements. Waits up to ``wait_s``.
    """
    server = server or server_url()
    conn = psycopg.connect(server, autocommit=True)
    try:
        deadline = time.monotonic() + wait_s
        said = False
        while not conn.execute("SELECT pg_try_advisory_lock(%s)", (BENCH_LOCK_KEY,)).fetchone()[0]:
            if time.monotonic() > deadline:
                raise BenchTimeout("another benchmark process holds the bench lock")
            if not said:
                print("  (waiting for another benchmark process to finish)", flush=True)
                said = True
            time.sleep(1)
        yield
    finally:
        conn.close()  # session ends -> lock released


def settle(url: str) -> None:
    """ANALYZE + CHECKPOINT the scratch database after the pre-fill (never timed).

    The bench server runs with autovacuum off, so without ANALYZE the drain would be
    planned on a never-analyzed table (production has autovacuum's auto-analyze).
    CHECKPOINT flushes the pre-fill's dirty pages so the timed drain does not pay for
    them, and every drain starts in the same WAL state. Every workload calls this
    between enqueue and drain so all are measured alike.
    """
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("CHECKPOINT")


def count(url: str, sql: str, params: Sequence | None = None) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute(sql, params).fetchone()[0])


# ---------------------------------------------------------------- worker processes


def _stop_process(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop one process we started (and its own process group), by pid."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def precompile() -> None:
    """Byte-compile the project as an installed package is.

    bench/setup installs the checkout editable, and nothing compiles an editable
    install the way `pip install` compiles pgqueuer, procrastinate and Django in
    site-packages; where PYTHONDONTWRITEBYTECODE is set, every gen_durable worker would
    compile gen_durable and the example project at start-up (~50 ms of CPU each) while
    the other systems' workers load bytecode. compileall writes whatever that setting
    says; already-current files are skipped.
    """
    import compileall

    for part in ("gen_durable", "example_project"):
        compileall.compile_dir(str(ROOT / part), quiet=1)


def drain_with_processes(
    cmds: Sequence[Sequence[str]],
    *,
    done_url: str,
    done_sql: str,
    expected: int,
    env: dict | None = None,
    cwd: str | Path | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    poll_interval: float = 0.05,
    fine_from: float = 0.9,
    fine_interval: float = 0.01,
    speed_probe: bool = False,
    exit_grace: float = 15.0,
    startup: str | None = None,
    gate_table: str | None = None,
    gate_waiters: int | None = None,
    marks: Sequence[int] = (),
    mark_sql: str | None = None,
    extra_procs: Sequence[Sequence[str]] = (),
) -> dict:
    """Start worker processes, time until ``done_sql`` counts ``expected``, reap them.

    The clock starts just before the first process is spawned (so interpreter/Django
    start-up is inside the window, as it is for any real worker) and stops at the first
    poll that sees all ``expected`` jobs complete; waiting for the workers to exit is
    not timed. Workers still running ``exit_grace`` s after completion are stopped.
    Raises BenchTimeout after ``timeout`` s, BenchError if every worker exited early.
    Returns ``{"elapsed_s", "worker_exit_s", "workers_cpu_s", "log_tail"}`` —
    workers_cpu_s is the workers' total CPU (user+sys, whole lifetime incl. start-up),
    None if some worker had to be stopped.

    ``startup`` (default: the module's STARTUP, set by ``run_all.py --startup``):

    - ``"inside"``: the clock starts just before the first process is spawned.
    - ``"outside"``: the start-up gate. Before spawning, a gate connection takes
      ``LOCK TABLE gate_table IN EXCLUSIVE MODE`` (plain SELECTs still run, so every
      start-up check passes; the first claim — a FOR UPDATE / UPDATE on the queue table
      — waits). Once ``gate_waiters`` distinct backends wait on that lock (every worker
      has finished its start-up and sits in its first claim) and 0.2 s more, the clock
      starts and the gate commits. ``startup_s`` (spawn → all ready) is returned.
      A workload without a gate table cannot run outside (BenchError).

    The done count is polled every ``poll_interval`` s, and every ``fine_interval`` s
    (at least twice the count's own time) once ``fine_from`` of ``expected`` is done or
    the rate since the previous poll says the rest is due within 1.5 coarse intervals:
    the clock stops at most about ``fine_interval`` plus one count after the last
    completion. (A fixed 50 ms poll put the end up to
    50 ms late — an eighth of a 0.4 s drain — and, with runs of similar length, late by
    about the same amount every run: bench/results/history.md "Round 10".)

    ``speed_probe``: also time a fixed loop every 0.2 s on a thread of this process
    (its CPU time, not the clock: waiting for a core does not count) and return the
    samples as ``probe`` [(epoch seconds, CPU seconds)]. This host's speed swings by up
    to 2× within seconds (the loop's CPU time moves from ~16 to ~30 ms on an idle
    machine); a long drain's quarters are read against it (`speed_factors`).

    ``marks``: done-counts at which ``mark_sql`` (one row) is run on the poll
    connection; the rows come back as ``marks`` [{"done", "t", "row"}] (e.g. table
    sizes per quarter). ``extra_procs`` are started with the workers (after the gate
    opens) and stopped with them, e.g. a producer; they count neither as workers nor
    towards ``workers_cpu_s`` exactness.
    """
    startup = startup or STARTUP
    probe = None
    if startup not in STARTUP_MODES:
        raise BenchError(f"startup must be one of {STARTUP_MODES}, got {startup!r}")
    if startup == "outside" and not (gate_table and gate_waiters):
        raise BenchError("this workload has no start-up gate: it runs with --startup inside only")
    logs = [tempfile.TemporaryFile(mode="w+b") for _ in cmds]
    procs: list[subprocess.Popen] = []
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    extra: list[subprocess.Popen] = []
    extra_logs = [tempfile.TemporaryFile(mode="w+b") for _ in extra_procs]
    mark_rows: list[dict] = []
    pending_marks = sorted(marks)
    startup_s = None
    gate = None
    with psycopg.connect(done_url, autocommit=True) as poll_conn:
        spawn = time.perf_counter()
        try:
            if startup == "outside":
                gate = psycopg.connect(done_url)
                gate.execute(f"LOCK TABLE {gate_table} IN EXCLUSIVE MODE")
            for cmd, log in zip(cmds, logs):
                procs.append(
                    subprocess.Popen(
                        list(cmd), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True,
                    )
                )
            if gate is not None:
                _wait_at_gate(poll_conn, gate_table, gate_waiters, procs, logs, timeout)
                start = time.perf_counter()
                startup_s = start - spawn
                gate.commit()
                gate.close()
                gate = None
            else:
                start = spawn
            for cmd, log in zip(extra_procs, extra_logs):
                extra.append(subprocess.Popen(list(cmd), env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True))
            probe = SpeedProbe().start() if speed_probe else None
            last = (start, 0)
            while True:
                asked = time.perf_counter()
                done = int(poll_conn.execute(done_sql).fetchone()[0])
                now = time.perf_counter()
                while pending_marks and done >= pending_marks[0]:
                    row = poll_conn.execute(mark_sql).fetchone() if mark_sql else None
                    mark_rows.append({"mark": pending_marks.pop(0), "done": done, "t": now - start,
                                      "row": list(row) if row else None})
                if done >= expected:
                    elapsed = now - start
                    break
                if all(p.poll() is not None for p in procs):
                    # one more look: the last completion may have landed just now
                    done = int(poll_conn.execute(done_sql).fetchone()[0])
                    if done >= expected:
                        elapsed = time.perf_counter() - start
                        break
                    raise BenchError(
                        f"all workers exited with {done}/{expected} done "
                        f"(exit codes {[p.returncode for p in procs]}):\n{_tail(logs)}"
                    )
                if now - start > timeout:
                    raise BenchTimeout(f"{done}/{expected} done after {timeout:.0f}s:\n{_tail(logs)}")
                # The fine interval is at least twice the count's own time (~25 ms over a
                # 200k-row table, a parallel scan): the poll never keeps more than a third
                # of a backend busy beside the drain it times.
                fine = max(fine_interval, 2 * (now - asked))
                time.sleep(next_poll(done, expected, last, now, poll_interval, fine, fine_from))
                last = (now, done)
            probe_samples = probe.stop() if probe is not None else None
            probe = None
            deadline = time.perf_counter() + exit_grace
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.0, deadline - time.perf_counter()))
            worker_exit_s = time.perf_counter() - start
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            workers_cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            return {"elapsed_s": elapsed, "worker_exit_s": worker_exit_s,
                    "workers_cpu_s": workers_cpu_s if all(p.poll() is not None for p in procs) else None,
                    "startup": startup, "startup_s": startup_s, "marks": mark_rows, "probe": probe_samples,
                    "log_tail": _tail(logs, 800), "extra_log_tail": _tail(extra_logs, 800)}
        finally:
            if probe is not None:  # the drain failed: the probe's thread must not outlive it
                probe.stop()
            if gate is not None:
                gate.close()
            for p in [*extra, *procs]:
                _stop_process(p)
            for log in [*logs, *extra_logs]:
                log.close()


class SpeedProbe:
    """A thread that times a fixed pure-Python loop every `every` s by its own CPU time
    (time.thread_time): how fast this host runs Python right now, whatever the load."""

    LOOP = 20_000

    def __init__(self, every: float = 0.2):
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.every):
            t = time.thread_time()
            x = 0
            for k in range(self.LOOP):
                x += k
            self.samples.append((time.time(), time.thread_time() - t))

    def stop(self) -> list:
        self._stop.set()
        self._thread.join()
        return self.samples


def speed_factors(samples, bounds) -> list:
    """Per window [(start, end) epoch seconds]: the median probe CPU time in it over the
    first window's (> 1: the host ran slower then). None where a window has no sample."""
    medians = []
    for lo, hi in bounds:
        inside = sorted(c for t, c in samples or () if lo <= t <= hi)
        medians.append(inside[len(inside) // 2] if inside else None)
    ref = medians[0] if medians else None
    return [None if m is None or not ref else m / ref for m in medians]


def next_poll(done: int, expected: int, last: tuple, now: float, poll_interval: float, fine_interval: float,
              fine_from: float) -> float:
    """Seconds until the next look at the done count (see drain_with_processes): the
    fine interval once ``fine_from`` of ``expected`` is done, or when the rate since the
    previous look (``last`` = (time, done)) says the rest is due within 1.5 coarse
    intervals; the coarse one otherwise."""
    if done >= fine_from * expected:
        return fine_interval
    rate = (done - last[1]) / max(now - last[0], 1e-9)
    if rate > 0 and (expected - done) / rate < 1.5 * poll_interval:
        return fine_interval
    return poll_interval


def _wait_at_gate(conn: psycopg.Connection, table: str, waiters: int, procs, logs, timeout: float) -> None:
    """Block until ``waiters`` distinct backends wait on ``table``'s lock (workers ready)."""
    deadline = time.perf_counter() + timeout
    while True:
        n = int(conn.execute(
            "SELECT count(DISTINCT pid) FROM pg_locks WHERE relation = %s::regclass AND NOT granted",
            (table,)).fetchone()[0])
        if n >= waiters:
            time.sleep(0.2)  # a last straggler's own start-up tail (threads starting)
            return
        if any(p.poll() is not None for p in procs):
            raise BenchError(f"a worker exited at the start-up gate ({n}/{waiters} waiting):\n{_tail(logs)}")
        if time.perf_counter() > deadline:
            raise BenchTimeout(f"only {n}/{waiters} workers reached the start-up gate:\n{_tail(logs)}")
        time.sleep(0.02)


def _tail(logs: Iterable, chars: int = 3000) -> str:
    out = []
    for i, log in enumerate(logs):
        with contextlib.suppress(Exception):
            log.flush()
            log.seek(0)
            data = log.read().decode(errors="replace")
            if data.strip():
                out.append(f"--- worker {i} ---\n{data[-chars:]}")
    return "\n".join(out)


# ---------------------------------------------------------------------- running


def _cpu_times() -> tuple[int, int]:
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals), idle


def cpu_busy(window: float = 1.0) -> float:
    """Fraction of all CPUs busy over ``window`` seconds (0..1), from /proc/stat."""
    try:
        t0, i0 = _cpu_times()
        time.sleep(window)
        t1, i1 = _cpu_times()
    except OSError:
        return 0.0
    return 0.0 if t1 == t0 else 1.0 - (i1 - i0) / (t1 - t0)


def wait_for_quiet(max_busy: float | None = None, max_wait: float | None = None,
                   log: Callable[[str], None] = print) -> float:
    """Wait until the machine is quiet enough to measure; return the busy fraction seen.

    On a 2-core box anything else running (a test suite, a build) halves the numbers.
    Thresholds: BENCH_MAX_BUSY (default 0.25 of all CPUs) and BENCH_QUIET_WAIT
    (default 300 s). If it never gets quiet the run goes ahead and the sample is
    flagged (``busy_before`` in results.json).
    """
    max_busy = float(os.environ.get("BENCH_MAX_BUSY", 0.25)) if max_busy is None else max_busy
    max_wait = float(os.environ.get("BENCH_QUIET_WAIT", 300)) if max_wait is None else max_wait
    deadline = time.monotonic() + max_wait
    busy = cpu_busy()
    said = False
    while busy > max_busy and time.monotonic() < deadline:
        if not said:
            log(f"  (machine busy: {busy:.0%} of CPUs; waiting up to {max_wait:.0f}s for quiet)")
            said = True
        busy = cpu_busy(2.0)
    if busy > max_busy:
        log(f"  WARNING: measuring on a busy machine ({busy:.0%} of CPUs busy before the run)")
    return busy


def server_label(server: str | None = None) -> str:
    """Which server a number was measured on: "autovacuum on" / "autovacuum off".

    The bench keeps one results section per label: the production-like server
    (autovacuum on, every other setting the initdb default) and the machine's shared
    development server (autovacuum off). BENCH_SERVER_LABEL overrides it.
    """
    if os.environ.get("BENCH_SERVER_LABEL"):
        return os.environ["BENCH_SERVER_LABEL"]
    with psycopg.connect(server or server_url(), autocommit=True) as conn:
        return "autovacuum " + conn.execute("SHOW autovacuum").fetchone()[0]


def environment() -> dict:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(Exception):
        with psycopg.connect(server_url(), autocommit=True) as conn:
            info["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
            info["synchronous_commit"] = conn.execute("SHOW synchronous_commit").fetchone()[0]
            info["shared_buffers"] = conn.execute("SHOW shared_buffers").fetchone()[0]
            info["autovacuum"] = conn.execute("SHOW autovacuum").fetchone()[0]
            info["fsync"] = conn.execute("SHOW fsync").fetchone()[0]
            # Every setting not at its built-in default, less paths/locale noise.
            info["non_default_settings"] = {
                name: setting for name, setting in conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE source NOT IN "
                    "('default', 'override', 'client', 'session') AND name NOT IN "
                    "('config_file', 'data_directory', 'hba_file', 'ident_file', 'external_pid_file', "
                    "'unix_socket_directories', 'log_line_prefix', 'cluster_name', 'port') "
                    "AND name NOT LIKE 'lc\\_%%' ORDER BY name")}
    pkgs = {}
    for dist in ("pgqueuer", "procrastinate", "django-tasks", "django-tasks-db", "Django",
                 "psycopg", "asyncpg", "uvloop", "gen-durable"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            pkgs[dist] = importlib.metadata.version(dist)
    info["packages"] = pkgs
    return info


def summarize(name: str, samples: list[dict]) -> dict:
    rates = [s["rate"] for s in samples]
    first = samples[0]

    def med(key: str):
        vals = [s[key] for s in samples if s.get(key) is not None]
        return statistics.median(vals) if vals else None

    return {
        "name": name,
        "unit": first.get("unit", "jobs/s"),
        "n": first.get("n"),
        "runs": len(samples),
        "rate_median": statistics.median(rates),
        "rate_min": min(rates),
        "rate_max": max(rates),
        "rates": rates,
        "samples": [{k: v for k, v in x.items() if k not in ("knobs", "note", "unit", "n")}
                    for x in samples],
        "elapsed_s_median": med("elapsed_s"),
        "enqueue_s_median": med("enqueue_s"),
        "enqueue_rate_median": med("enqueue_rate"),
        "knobs": first.get("knobs", {}),
        "note": first.get("note", ""),
        "busy_before_max": max(s.get("busy_before", 0.0) for s in samples),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "sitting": SITTING,
    }


def rate_sample(n: int, elapsed_s: float, *, unit: str = "jobs/s", enqueue_s: float | None = None) -> dict:
    """The common head of a workload's measurement dict: rate = n / elapsed_s."""
    sample = {"rate": n / elapsed_s, "unit": unit, "n": n, "elapsed_s": elapsed_s}
    if enqueue_s:
        sample.update(enqueue_s=enqueue_s, enqueue_rate=n / enqueue_s)
    return sample


def standalone(name: str, fn: Workload, runs: int, save: bool) -> None:
    """The tail of every workload script's main(): run, print, optionally merge results."""
    summary = run_benchmark(name, fn, runs)
    print_table([summary])
    if save:
        save_results([summary], env=environment())


def run_benchmark(name: str, fn: Workload, runs: int = DEFAULT_RUNS, *, server: str | None = None,
                  log: Callable[[str], None] = print) -> dict:
    """Run ``fn`` ``runs`` times, each on a fresh scratch database; return the summary."""
    if runs < 1:
        raise ValueError("runs must be >= 1")
    return summarize(name, [run_once(name, fn, i, runs, server=server, log=log) for i in range(runs)])


def run_once(name: str, fn: Workload, i: int, runs: int, *, server: str | None = None,
             log: Callable[[str], None] = print) -> dict:
    """Run ``fn`` once (run ``i + 1`` of ``runs``) on a fresh scratch database; return its sample."""
    with exclusive_bench(server), scratch_database(name, server) as url:
        busy = wait_for_quiet(log=log)
        t0 = time.perf_counter()
        sample = fn(url)
        wall = time.perf_counter() - t0
        load_after = os.getloadavg()[0]
    if not isinstance(sample, dict) or not isinstance(sample.get("rate"), (int, float)):
        raise BenchError(f"{name}: workload returned {sample!r}, expected a dict with 'rate'")
    sample["busy_before"] = round(busy, 3)
    sample["loadavg_after"] = round(load_after, 2)
    extra = ""
    if sample.get("enqueue_rate"):
        extra = f"  (enqueue {sample['enqueue_rate']:,.0f}/s)"
    log(f"  {name} run {i + 1}/{runs}: {sample['rate']:,.0f} {sample.get('unit', 'jobs/s')}"
        f"  over {sample.get('elapsed_s', 0):.2f}s{extra}  [wall {wall:.1f}s, "
        f"busy before {busy:.0%}, load after {load_after:.1f}]")
    return sample


# ---------------------------------------------------------------------- results


def load_results(path: Path = RESULTS_JSON) -> dict:
    """{"servers": {label: {"environment": {...}, "benchmarks": {name: summary}}}}."""
    if not path.exists():
        return {"servers": {}}
    data = json.loads(path.read_text())
    if "servers" not in data:  # the one-server layout before server labels
        data = {"servers": {"autovacuum " + data.get("environment", {}).get("autovacuum", "off"): {
            "environment": data.get("environment", {}), "benchmarks": data.get("benchmarks", {})}}}
    return data


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_results(summaries: Iterable[dict], *, env: dict | None = None, label: str | None = None) -> dict:
    """Merge summaries into results.json (under the server's label, keyed by name) and regenerate results.md."""
    data = load_results()
    section = data["servers"].setdefault(label or server_label(), {"environment": {}, "benchmarks": {}})
    for s in summaries:
        section["benchmarks"][s["name"]] = s
    if env is not None:
        section["environment"] = env
    _atomic_write(RESULTS_JSON, json.dumps(data, indent=2, sort_keys=False) + "\n")
    _atomic_write(RESULTS_MD, render_markdown(data))
    return data


def _fmt_rate(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}"


def render_table(benchmarks: Iterable[dict]) -> str:
    lines = [
        "| benchmark | N | median | min–max | unit | runs | enqueue (median) |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for b in benchmarks:
        enq = b.get("enqueue_rate_median")
        flag = " ⚠ busy" if (b.get("busy_before_max") or 0) > float(os.environ.get("BENCH_MAX_BUSY", 0.25)) else ""
        lines.append(
            f"| {b['name']}{flag} | {b.get('n') or '–':,} | {_fmt_rate(b['rate_median'])} | "
            f"{_fmt_rate(b['rate_min'])}–{_fmt_rate(b['rate_max'])} | {b['unit']} | {b['runs']} | "
            f"{_fmt_rate(enq) + ' /s' if enq else '–'} |"
        )
    return "\n".join(lines)


SERVER_ORDER = ("autovacuum on", "autovacuum off")


def _servers(data: dict) -> list[tuple[str, dict]]:
    servers = data.get("servers", {})
    return sorted(servers.items(), key=lambda kv: (SERVER_ORDER.index(kv[0]) if kv[0] in SERVER_ORDER else 9, kv[0]))


def render_markdown(data: dict) -> str:
    servers = _servers(data)
    out = [
        "# Benchmark results",
        "",
        "Generated by `bench/run_all.py`; do not edit by hand (re-run to refresh). See",
        "`bench/README.md` for what each number means. Rates are the median over `runs`",
        "runs, each on a fresh scratch database; min–max is the spread across those runs.",
        "\"⚠ busy\" marks a benchmark measured while something else was using the CPUs.",
        "A name ending in `@outside` was timed with worker start-up outside the clock",
        "(`run_all.py --startup outside`, the start-up gate in `bench/README.md`); every",
        "other drain includes it. Each server has its own section; the production-like one",
        "(autovacuum on, otherwise default settings) comes first.",
        "",
        "## Side by side (medians)",
        "",
        render_side_by_side(servers),
        "",
    ]
    for label, sec in servers:
        env = sec.get("environment", {})
        benches = list(sec.get("benchmarks", {}).values())
        out += [f"## Server: {label}", "", render_table(benches), "", *render_targets(sec.get("benchmarks", {}), label)]
        if env:
            pk = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
            nd = ", ".join(f"{k}={v}" for k, v in (env.get("non_default_settings") or {}).items())
            out += [
                f"### Environment ({label})",
                "",
                f"- CPUs: {env.get('cpus')}; Python {env.get('python')}; {env.get('platform')}",
                f"- Postgres {env.get('postgres', '?')} (synchronous_commit={env.get('synchronous_commit', '?')},"
                f" fsync={env.get('fsync', '?')}, autovacuum={env.get('autovacuum', '?')},"
                f" shared_buffers={env.get('shared_buffers', '?')}); every workload runs ANALYZE + CHECKPOINT after its pre-fill",
                *([f"- settings not at their built-in default: {nd}"] if nd else []),
                f"- packages: {pk}",
                "",
            ]
        out += [f"### Knobs and notes ({label})", ""]
        for b in benches:
            knobs = ", ".join(f"`{k}={v}`" for k, v in (b.get("knobs") or {}).items())
            out.append(f"- **{b['name']}** (measured {b.get('measured_at', '?')}): {knobs or 'no knobs'}")
            if b.get("note"):
                out.append(f"  — {b['note']}")
        out.append("")
    return "\n".join(out)


def render_side_by_side(servers: list[tuple[str, dict]]) -> str:
    names: list[str] = []
    for _, sec in servers:
        names += [n for n in sec.get("benchmarks", {}) if n not in names]
    head = "| benchmark | unit | " + " | ".join(f"{label}: median (min–max), runs" for label, _ in servers) + " |"
    lines = [head, "|---|---|" + "---:|" * len(servers)]
    for n in names:
        cells, unit = [], ""
        for _, sec in servers:
            b = sec.get("benchmarks", {}).get(n)
            if not b:
                cells.append("–")
                continue
            unit = b["unit"]
            flag = " ⚠" if (b.get("busy_before_max") or 0) > float(os.environ.get("BENCH_MAX_BUSY", 0.25)) else ""
            cells.append(f"{_fmt_rate(b['rate_median'])} ({_fmt_rate(b['rate_min'])}–{_fmt_rate(b['rate_max'])}), "
                         f"{b['runs']}{flag}")
        lines.append(f"| {n} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# docs/design.md#performance-contract targets: (label, our benchmark, reference benchmark, required ratio).
# Both sides of a ratio must come from the same server section; "@outside" names were
# timed with worker start-up outside the clock for every system alike.
TARGETS = [
    ("20k drain ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_c50_p2", "pgqueuer", 1.5),
    ("20k drain ≥ 1.5× pgqueuer tuned (start-up outside)", "gd_drain_c50_p2@outside", "pgqueuer@outside", 1.5),
    ("200k drain ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_200k_c50_p2", "pgqueuer_200k", 1.5),
    ("200k drain ≥ 1.5× pgqueuer tuned (start-up outside)", "gd_drain_200k_c50_p2@outside",
     "pgqueuer_200k@outside", 1.5),
    ("20k drain ≥ 50 % of the raw claim+complete ceiling", "gd_drain_c50_p2", "raw_claim_complete", 0.5),
    ("20k drain (start-up outside) ≥ 50 % of the raw ceiling", "gd_drain_c50_p2@outside", "raw_claim_complete", 0.5),
    ("200k drain ≥ 50 % of the raw ceiling at 200k", "gd_drain_200k_c50_p2", "raw_claim_complete_200k", 0.5),
    ("20k drain, tuned (2 × 16, PREFETCH 200, flush 300) ≥ 1.5× pgqueuer tuned (start-up inside)",
     "gd_drain_c16_p2_fb300", "pgqueuer", 1.5),
    ("20k drain, tuned ≥ 1.5× pgqueuer tuned (start-up outside)", "gd_drain_c16_p2_fb300@outside",
     "pgqueuer@outside", 1.5),
    ("200k drain, tuned ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_200k_c16_p2_fb300", "pgqueuer_200k", 1.5),
    ("200k drain, tuned ≥ 1.5× pgqueuer tuned (start-up outside)", "gd_drain_200k_c16_p2_fb300@outside",
     "pgqueuer_200k@outside", 1.5),
    ("20k drain, tuned ≥ 50 % of the raw ceiling (start-up outside)", "gd_drain_c16_p2_fb300@outside",
     "raw_claim_complete", 0.5),
    ("200k drain, tuned ≥ 50 % of the raw ceiling at 200k (start-up outside)", "gd_drain_200k_c16_p2_fb300@outside",
     "raw_claim_complete_200k", 0.5),
    ("20k drain, round-4 tuned (2 × 8, PREFETCH 500, flush 500) ≥ 1.5× pgqueuer tuned (start-up outside)",
     "gd_drain_c8_p2_pf500@outside", "pgqueuer@outside", 1.5),
    ("20k drain, round-4 tuned ≥ 1.5× pgqueuer, batch 1000 (start-up outside)",
     "gd_drain_c8_p2_pf500@outside", "pgqueuer_b1000@outside", 1.5),
    ("20k drain, round-4 tuned ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_c8_p2_pf500", "pgqueuer", 1.5),
    ("200k drain, round-4 tuned ≥ 1.5× pgqueuer tuned (start-up outside)", "gd_drain_200k_c8_p2_pf500@outside",
     "pgqueuer_200k@outside", 1.5),
    ("200k drain, round-4 tuned ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_200k_c8_p2_pf500",
     "pgqueuer_200k", 1.5),
    ("20k drain, round-4 tuned ≥ 50 % of the raw ceiling (start-up outside)", "gd_drain_c8_p2_pf500@outside",
     "raw_claim_complete", 0.5),
    ("200k drain, round-4 tuned ≥ 50 % of the raw ceiling at 200k (start-up outside)",
     "gd_drain_200k_c8_p2_pf500@outside", "raw_claim_complete_200k", 0.5),
    ("5-step machine (inline), round-4 tuned ≥ 1.3× job drain, same configuration (start-up outside)",
     "gd_pipeline_5step_inline_c16_p2_pf500@outside", "gd_drain_c16_p2_pf500@outside", 1.3),
    ("5-step machine (inline), round-4 tuned ≥ 1.3× the best job drain (start-up outside)",
     "gd_pipeline_5step_inline_c16_p2_pf500@outside", "gd_drain_c8_p2_pf500@outside", 1.3),
    ("20k drain, round-4 tuned, 1 step thread (2 × 1, PREFETCH 500, flush 500) ≥ 1.5× pgqueuer tuned "
     "(start-up outside)", "gd_drain_c1_p2_pf500@outside", "pgqueuer@outside", 1.5),
    ("20k drain, 2 × 1 ≥ 1.5× pgqueuer, batch 1000 (start-up outside)", "gd_drain_c1_p2_pf500@outside",
     "pgqueuer_b1000@outside", 1.5),
    ("20k drain, 2 × 1 ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_c1_p2_pf500", "pgqueuer", 1.5),
    ("200k drain, 2 × 1 ≥ 1.5× pgqueuer tuned (start-up outside)", "gd_drain_200k_c1_p2_pf500@outside",
     "pgqueuer_200k@outside", 1.5),
    ("200k drain, 2 × 1 ≥ 1.5× pgqueuer tuned (start-up inside)", "gd_drain_200k_c1_p2_pf500", "pgqueuer_200k", 1.5),
    ("20k drain, 2 × 1 ≥ 50 % of the raw ceiling (start-up outside)", "gd_drain_c1_p2_pf500@outside",
     "raw_claim_complete", 0.5),
    ("200k drain, 2 × 1 ≥ 50 % of the raw ceiling at 200k (start-up outside)", "gd_drain_200k_c1_p2_pf500@outside",
     "raw_claim_complete_200k", 0.5),
    ("5-step machine (inline), 2 × 1 ≥ 1.3× job drain, same configuration (start-up outside)",
     "gd_pipeline_5step_inline_c1_p2_pf500@outside", "gd_drain_c1_p2_pf500@outside", 1.3),
    ("5-step machine (inline), 2 × 1, 200,000 steps ≥ 1.3× the 200k job drain, same configuration "
     "(start-up outside)", "gd_pipeline_5step_inline_40k_c1_p2_pf500@outside", "gd_drain_200k_c1_p2_pf500@outside",
     1.3),
    ("drain ≥ 10× procrastinate", "gd_drain_c50_p2", "procrastinate", 10.0),
    ("drain ≥ 10× Django Tasks database backend", "gd_drain_c50_p2", "django_tasks_db", 10.0),
    ("@task drain on gen_durable ≥ 10× django-tasks-db", "tasks_gen_durable", "tasks_django_tasks_db", 10.0),
    ("5-step machine (inline continuation) steps/s ≥ 1.3× job drain", "gd_pipeline_5step_inline_c50_p2",
     "gd_drain_c50_p2", 1.3),
    ("5-step machine (inline), tuned ≥ 1.3× job drain, tuned (start-up inside)",
     "gd_pipeline_5step_inline_c16_p2_fb300", "gd_drain_c16_p2_fb300", 1.3),
    ("5-step machine (inline), tuned ≥ 1.3× job drain, tuned (start-up outside)",
     "gd_pipeline_5step_inline_c16_p2_fb300@outside", "gd_drain_c16_p2_fb300@outside", 1.3),
    ("insert_all ≥ 50 % of the raw batch-insert ceiling", "gd_insert_all_100k", "raw_insert_unnest", 0.5),
]


def _hours_apart(a: dict, b: dict) -> float:
    try:
        ta = _dt.datetime.fromisoformat(a["measured_at"])
        tb = _dt.datetime.fromisoformat(b["measured_at"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    return abs((ta - tb).total_seconds()) / 3600


def render_targets(benchmarks: dict, label: str = "") -> list[str]:
    """The docs/design.md#performance-contract ratio targets, computed from the medians present (by how much met or missed)."""
    lines = [f"### Targets ({label}; docs/design.md#performance-contract, ratios of medians)" if label else
             "## Targets (docs/design.md#performance-contract, ratios of medians)", "",
             "| target | ours | reference | ratio | required | met |", "|---|---:|---:|---:|---:|---|"]
    for tlabel, ours, ref, need in TARGETS:
        a, b = benchmarks.get(ours), benchmarks.get(ref)
        if not a or not b or not b.get("rate_median"):
            continue
        ratio = a["rate_median"] / b["rate_median"]
        verdict = "yes" if ratio >= need else f"no — {ratio / need:.0%} of the bar"
        # A ratio is only meaningful within one sitting (one run_all invocation).
        if (a.get("sitting") or b.get("sitting")) and a.get("sitting") != b.get("sitting"):
            verdict += " (sides from different sittings)"
        elif _hours_apart(a, b) > 6:
            verdict += f" (sides measured {_hours_apart(a, b):.0f} h apart)"
        lines.append(f"| {tlabel} | {a['rate_median']:,.0f} | {b['rate_median']:,.0f} | {ratio:.2f} | {need:g} | {verdict} |")
    lat = benchmarks.get("gd_idle_latency")
    if lat:
        ok = "yes" if lat["rate_median"] <= 10 else "no"
        lines.append(f"| idle insert→done p50 ≤ 10 ms | {lat['rate_median']:.1f} ms | – | – | – | {ok} |")
    for key, need, what in (("gd_sustained_inserts_200k", 0.8, "200k drain with continuous inserts"),
                            ("gd_drain_200k_c50_p2", 0.8, "200k pre-filled drain"),
                            ("gd_sustained_200k", 0.7, "sustained 200k (older run)")):
        sus = benchmarks.get(key)
        if not sus:
            continue
        ratios = [s.get("last_vs_first") for s in sus.get("samples", []) if s.get("last_vs_first")]
        if ratios:
            med = statistics.median(ratios)
            lines.append(f"| {what}: last quarter ≥ {need:.0%} of the first | {med:.0%} | – | – | {need} | "
                         f"{'yes' if med >= need else 'no'} |")
    return lines + [""]


def print_table(benchmarks: Iterable[dict], file=None) -> None:
    print(render_table(benchmarks), file=file or sys.stdout)
