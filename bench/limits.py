"""Configured limits under load: two `rundurable` processes against real buckets.

    .venv/bin/python bench/limits.py [--which rate,tenants,drain] [--limiter postgres|redis] [--runs 3]

rate     RATE_LIMITS api = 200/s, burst 20; 8,000 no-op jobs on it; two worker processes
         run 30 s. From the commit times of the outcomes (database clock): the rate over
         the 30 s after the first completion (target 200/s ± 5 %), and the largest excess
         of completions over `burst + allowed × t` at any instant t (should be ≤ 0, up to
         the few ms between admission and commit).
tenants  RATE_LIMITS tenant = 5/s, burst 5, one bucket per tenant; 100 tenants × 150
         jobs; two processes run 20 s; each tenant's rate over the 20 s window (target
         5/s ± 10 %, i.e. (5 + 5 × 20) / 20 = 5.25/s with the initial burst).
drain    the cost of configured limits on unthrottled work: a 20,000 no-op drain with
         RATE_LIMITS/CONCURRENCY_LIMITS configured (the jobs carry none) vs. without,
         alternated in one run; ratio of medians (target ≥ 0.90).
Writes bench/results/limits.md (and prints it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
from gd_workloads import DONE_SQL, FILL, PROJECT, PY, _env, _manage, _shell  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"

INSERT = """
import json, time, gen_durable as gd
from shop.durable import noop
specs = {specs}  # an expression: the list is built here, not passed on the command line
for i in range(0, len(specs), 10000):
    gd.insert_all([gd.Spec(noop, args={{"k": ":".join(map(str, k)) if isinstance(k, list) else k}},
                           rate_limit=tuple(k) if isinstance(k, list) else k) for k in specs[i:i + 10000]])
print(json.dumps({{"n": len(specs)}}))
"""

TIMES = """
import json
from django.db import connection
with connection.cursor() as c:
    # a finished row no longer carries its rate limit: the key travels in its args
    c.execute("SELECT state->>'k', extract(epoch FROM updated_at)::float8 FROM gen_durable WHERE status = 'done'")
    print(json.dumps(c.fetchall()))
"""


def engine(limiter, rates=None, gates=None, concurrency=16):
    cfg = {"QUEUES": {"default": concurrency}, "RATE_LIMITS": rates or {}, "CONCURRENCY_LIMITS": gates or {},
           "LEASE_TTL": 30, "HEARTBEAT_INTERVAL": 5}
    if limiter == "redis":
        cfg["LIMITER"] = {"BACKEND": "redis", "URL": REDIS_URL, "PREFIX": f"gdbench:{uuid.uuid4().hex[:8]}:"}
    return cfg


def run_for(url, cfg, seconds, processes=2):
    """Run `processes` workers for `seconds`, then stop them (SIGTERM)."""
    procs = [subprocess.Popen([PY, "manage.py", "rundurable", "--queue", f"default={cfg['QUEUES']['default']}",
                               "--no-gc", "-v0", f"--child={i}"], cwd=PROJECT, env=_env(url, cfg),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
             for i in range(processes)]
    try:
        time.sleep(seconds)
    finally:
        for p in procs:
            harness._stop_process(p, grace=10)


def rate_run(limiter, window=30.0):
    allowed, burst = 200, 20
    cfg = engine(limiter, rates={"api": {"allowed": allowed, "period": 1, "burst": burst}})
    with harness.scratch_database("limits_rate") as url:
        _manage(url, "migrate", "-v0")
        _shell(url, INSERT.format(specs='["api"] * 8000'), engine=cfg)
        harness.settle(url)
        run_for(url, cfg, window + 8)
        times = sorted(t for _, t in _shell(url, TIMES, engine=cfg))
    t0 = times[0]
    in_window = sum(1 for t in times if t - t0 <= window)
    excess = max(k + 1 - (burst + allowed * (t - t0)) for k, t in enumerate(times))
    return {"rate": in_window / window, "excess": excess, "done": len(times)}


def tenants_run(limiter, tenants=100, per=150, window=20.0):
    allowed = burst = 5
    cfg = engine(limiter, rates={"tenant": {"allowed": allowed, "period": 1, "burst": burst}})
    specs = f'[["tenant", t] for t in range({tenants}) for _ in range({per})]'
    with harness.scratch_database("limits_tenants") as url:
        _manage(url, "migrate", "-v0")
        _shell(url, INSERT.format(specs=specs), engine=cfg)
        harness.settle(url)
        run_for(url, cfg, window + 8)
        rows = _shell(url, TIMES, engine=cfg)
    t0 = min(t for _, t in rows)
    per_tenant = {}
    for key, t in rows:
        if t - t0 <= window:
            per_tenant[key] = per_tenant.get(key, 0) + 1
    rates = [per_tenant.get(f"tenant:{t}", 0) / window for t in range(tenants)]
    expected = (burst + allowed * window) / window
    worst = max(abs(r - expected) / expected for r in rates)
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
            "expected": expected, "worst_dev": worst}


def drain_run(limited, limiter, n=20000, concurrency=16, processes=2):
    cfg = {"QUEUES": {"default": concurrency}, "FLUSH": {"MAX_BATCH": 100, "MAX_DELAY": 0.005}}
    if limited:
        cfg.update({k: v for k, v in engine(limiter, rates={"api": {"allowed": 100, "period": 1}},
                                             gates={"pdf": {"limit": 4}}).items()
                    if k in ("RATE_LIMITS", "CONCURRENCY_LIMITS", "LIMITER")})
    with harness.scratch_database("limits_drain") as url:
        _manage(url, "migrate", "-v0")
        _shell(url, FILL.format(machine="noop", n=n))
        harness.settle(url)
        cmd = [PY, "manage.py", "rundurable", "--burst", "--queue", f"default={concurrency}", "--no-gc",
               "--no-reaper", "-v0"]
        res = harness.drain_with_processes([cmd + [f"--child={i}"] for i in range(processes)], done_url=url,
                                           done_sql=DONE_SQL, expected=n, env=_env(url, cfg), cwd=PROJECT,
                                           timeout=600)
    return n / res["elapsed_s"]


def spread(values):
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--which", default="rate,tenants,drain")
    ap.add_argument("--limiter", default="postgres", choices=("postgres", "redis"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args(argv)
    which = a.which.split(",")
    busy = harness.wait_for_quiet()
    lines = [f"## Limits ({a.limiter} limiter)", "",
             f"Generated by `bench/limits.py --limiter {a.limiter} --runs {a.runs}`; two `rundurable` processes × 16 "
             f"threads; CPU busy before the run: {busy:.0%} (2 cores shared with other work). Median (min–max) over "
             f"{a.runs} runs.", ""]
    if "rate" in which:
        runs = [rate_run(a.limiter) for _ in range(a.runs)]
        rates = [r["rate"] for r in runs]
        lines += ["### One bucket: 200/s, burst 20, 30 s", "",
                  "| achieved rate (jobs/s) | vs 200/s | max excess over burst + 200·t (jobs) |", "|---|---|---|",
                  f"| {spread(rates)} | {statistics.median(rates) / 200 - 1:+.1%} | "
                  f"{max(r['excess'] for r in runs):.1f} |", ""]
    if "tenants" in which:
        runs = [tenants_run(a.limiter) for _ in range(a.runs)]
        lines += ["### 100 tenants × 5/s (burst 5), 20 s", "",
                  "| run | expected per tenant (jobs/s) | median | min | max | worst deviation |",
                  "|---|---|---|---|---|---|"]
        for i, r in enumerate(runs, 1):
            lines.append(f"| {i} | {r['expected']:.2f} | {r['median']:.2f} | {r['min']:.2f} | {r['max']:.2f} | "
                         f"{r['worst_dev']:.1%} |")
        lines.append("")
    if "drain" in which:
        base, lim = [], []
        for _ in range(a.runs):  # alternated, so drift of the machine hits both alike
            base.append(drain_run(False, a.limiter))
            lim.append(drain_run(True, a.limiter))
        ratio = statistics.median(lim) / statistics.median(base)
        lines += ["### Cost of configured limits on unthrottled work (20,000 no-op drain)", "",
                  "| without limits (jobs/s) | with limits configured (jobs/s) | ratio |", "|---|---|---|",
                  f"| {spread(base)} | {spread(lim)} | {ratio:.2f} |", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    out = BENCH / "results" / "limits.md"
    old = out.read_text() if out.exists() else "# Limits\n\n"
    marker = f"## Limits ({a.limiter} limiter)"
    if marker in old:
        head, _, rest = old.partition(marker)
        tail = rest[rest.find("\n## ") + 1:] if "\n## " in rest else ""
        old = head + tail
    out.write_text(old.rstrip("\n") + "\n\n" + text)
    print(f"wrote {out.relative_to(BENCH.parent)}")


if __name__ == "__main__":
    main()
