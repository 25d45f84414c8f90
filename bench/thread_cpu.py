"""CPU per job of each thread of one worker process over a no-op drain.

    bench/.venv/bin/python bench/thread_cpu.py [--n 200000] [--runs 3] [--engine JSON]

Pre-fills ``n`` no-op jobs in a scratch database (bench_thread_cpu on BENCH_DATABASE_URL),
runs one `manage.py rundurable --burst --child=0` of the example project, and reads
every thread's user and system CPU from /proc/<pid>/task/*/stat while it runs (the last
reading before it exits). The worker is started through a small wrapper that gives each
Python thread its name at the OS level (prctl PR_SET_NAME, 15 characters), so the
engine's threads can be told apart: ``gd-step-<queue>-<i>`` (step threads),
``gd-sched-<queue>`` (the feeder: claims), ``gd-flusher`` (outcomes and the timeline),
``python`` (the main thread and the rest).

A sampling profiler's on-CPU shares are skewed on a process whose threads hand the GIL
to each other many times a millisecond; the kernel's per-thread CPU times are not.
Prints, per run and as medians: µs of CPU per job per thread, and the drain's rate.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psycopg  # noqa: E402

import gd_workloads as g  # noqa: E402
import harness  # noqa: E402

TUNED = {"QUEUES": {"default": 1}, "PREFETCH": 500, "MIN_DEMAND": 100, "FLUSH": {"MAX_BATCH": 500}}
# Run inside the worker's interpreter: name each thread as the OS sees it, then run manage.py.
NAMING = """
import ctypes, runpy, sys, threading
libc = ctypes.CDLL(None)
inner = threading.Thread._bootstrap_inner
def named(self):
    libc.prctl(15, self.name[:15].encode(), 0, 0, 0)
    return inner(self)
threading.Thread._bootstrap_inner = named
sys.argv = sys.argv[1:]
sys.path.insert(0, ".")
runpy.run_path("manage.py", run_name="__main__")
"""


def one_run(server: str, n: int, engine: dict) -> tuple[dict, float]:
    url = server.rsplit("/", 1)[0] + "/bench_thread_cpu"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS bench_thread_cpu")
        c.execute("CREATE DATABASE bench_thread_cpu")
    g._manage(url, "migrate", "-v0")
    g._shell(url, g.FILL.format(machine="noop", n=n))
    harness.settle(url)
    tick = os.sysconf("SC_CLK_TCK")
    started = time.perf_counter()
    proc = subprocess.Popen([g.PY, "-c", NAMING, "manage.py", "rundurable", "--burst", "--child=0", "--no-gc",
                             "--no-reaper", "-v0"], cwd=g.PROJECT, env=g._env(url, engine))
    last: dict = {}
    while proc.poll() is None:
        for path in glob.glob(f"/proc/{proc.pid}/task/*/stat"):
            try:
                text = open(path).read()
            except OSError:
                continue  # the thread ended between the listing and the read
            name = text[text.index("(") + 1:text.rindex(")")]
            fields = text[text.rindex(")") + 2:].split()
            last[path] = (name, (int(fields[11]) + int(fields[12])) / tick)
        time.sleep(0.05)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"rundurable exited {proc.returncode}")
    per: dict = {}
    for name, cpu in last.values():
        key = name if name.startswith("gd-") else "python (main, others)"
        per[key] = per.get(key, 0.0) + cpu
    return {k: v / n * 1e6 for k, v in per.items()}, n / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engine", default=None, help=f"GEN_DURABLE overrides (JSON); default {json.dumps(TUNED)}")
    a = ap.parse_args()
    server = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:55442/postgres")
    engine = json.loads(a.engine) if a.engine else TUNED
    runs = []
    for r in range(a.runs):
        per, rate = one_run(server, a.n, engine)
        runs.append((per, rate))
        print(f"run {r + 1}: {rate:,.0f} jobs/s (spawn to exit); CPU µs/job: "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))
              + f"; total {sum(per.values()):.1f}", flush=True)
    names = sorted({k for per, _ in runs for k in per}, key=lambda k: -statistics.median(p.get(k, 0) for p, _ in runs))
    print(f"\nmedians of {a.runs} runs, {a.n:,} no-op jobs, GEN_DURABLE {json.dumps(engine)}:")
    for k in names:
        xs = [p.get(k, 0.0) for p, _ in runs]
        if max(xs) < 0.05:
            continue  # threads that slept through the drain (other queues, timer, heartbeat)
        print(f"  {k:24s} {statistics.median(xs):5.1f} µs/job ({min(xs):.1f}–{max(xs):.1f})")
    totals = [sum(p.values()) for p, _ in runs]
    print(f"  {'total':24s} {statistics.median(totals):5.1f} µs/job ({min(totals):.1f}–{max(totals):.1f}); "
          f"{statistics.median(r for _, r in runs):,.0f} jobs/s")


if __name__ == "__main__":
    main()
