"""Scale-out: the same drain with `rundurable` on 1, 2 and 3 "hosts", one Postgres.

    .venv/bin/python bench/multihost.py [--hosts loopback,1,2,3,pipeline] [--runs 3] [--n 20000] [--concurrency 50]

Hosts are network namespaces of this machine on a bridge (tests/faults/cluster.py
`Hosts`); each runs one `rundurable --burst` process (the example project's no-op job,
QUEUES default=50, PREFETCH 50, MIN_DEMAND 25 — gd_drain_c50 of run_all.py) reaching
the server over its own veth from its own address. "loopback" is one process in the
root namespace on 127.0.0.1: what the veth costs. The server is a cluster of this
script's own (OwnCluster: the shared one listens on loopback only and is never
reconfigured), with the shared bench server's durability settings (fsync on,
synchronous_commit on, full_page_writes on, autovacuum off, shared_buffers 128MB).
Configurations alternate within each run round, so drift of the machine hits all alike.

Besides the rate, each run measures per step (docs/scaling.md): WAL bytes of the
insert (insert_all), of the drain (pg_current_wal_lsn() before/after; pg_waldump --stats
splits records from full-page images) and of the GC delete; commits; row churn of
`gen_durable` (updates, HOT share, dead tuples, from pg_stat_user_tables); CPU of the
server and of the workers from the first finished job on (start-up excluded); the peak
of worker connections per host and role (pg_stat_activity). Everything it makes —
namespaces, bridge, cluster, processes — is removed at the end, also on failure.
Writes bench/results/multihost.md (and prints it). Needs root (namespaces).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import psycopg  # noqa: E402

import harness  # noqa: E402
from gd_workloads import DONE_SQL, FILL, PROJECT, PY, _env, _manage, _shell  # noqa: E402
from tests.faults.cluster import PG_BIN, Hosts, OwnCluster, namespaces_unavailable  # noqa: E402

SERVER = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on", "autovacuum": "off",
          "shared_buffers": "'128MB'", "max_connections": 200, "max_wal_size": "'4GB'"}

STATS = """
SELECT pg_current_wal_lsn(),
       (SELECT wal_records FROM pg_stat_wal), (SELECT wal_fpi FROM pg_stat_wal),
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, n_dead_tup
FROM pg_stat_user_tables WHERE relname = 'gen_durable'"""
KEYS = ("lsn", "wal_records", "wal_fpi", "commits", "ins", "upd", "hot_upd", "del", "dead")

GC = """
import json
from gen_durable.worker.maintenance import gc
print(json.dumps({"deleted": gc(0, 10000)}))
"""


def stats(url: str) -> dict:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(STATS).fetchone()
        lsn = c.execute("SELECT %s::pg_lsn - '0/0'::pg_lsn", [row[0]]).fetchone()[0]
    return dict(zip(KEYS, [int(lsn), *row[1:]]))


def delta(a: dict, b: dict) -> dict:
    return {k: b[k] - a[k] for k in KEYS if k != "dead"} | {"dead": b["dead"]}


def lsn_text(n: int) -> str:
    return f"{n >> 32:X}/{n & 0xFFFFFFFF:X}"


def waldump(cluster: OwnCluster, start: int, end: int) -> dict:
    """Record bytes and full-page-image bytes between two LSNs (pg_waldump --stats)."""
    out = subprocess.run([str(PG_BIN / "pg_waldump"), "--stats", "-p", str(cluster.data / "pg_wal"),
                          "-s", lsn_text(start), "-e", lsn_text(end)], capture_output=True, text=True)
    m = re.search(r"^Total\s+(\d+)\s+(\d+)\s+\[[^]]*\]\s+(\d+)\s+\[[^]]*\]\s+(\d+)", out.stdout, re.M)
    if not m:
        return {}
    return {"records": int(m[1]), "record_bytes": int(m[2]), "fpi_bytes": int(m[3]), "bytes": int(m[4])}


TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int, children_too: bool = False) -> float:
    """CPU seconds of a live process (user + system; with its reaped children's when asked)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12]) + ((int(fields[13]) + int(fields[14])) if children_too else 0)
    return ticks / TICK


def _children(ppid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == ppid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def server_cpu(cluster: OwnCluster) -> float:
    """CPU seconds the cluster has used so far: the postmaster with every backend it
    reaped, plus the live ones."""
    pid = int((cluster.data / "postmaster.pid").read_text().split()[0])
    return _proc_cpu(pid, children_too=True) + sum(_proc_cpu(c) for c in _children(pid))


class Sampler(threading.Thread):
    """Every 0.1 s during a drain: the database's worker connections (application_name
    "gen_durable <role> <token>") — peak per client address, in total, and the roles
    held at the total's peak; and, at the first finished job, the CPU the workers and
    the server have used so far (start-up), so per-step CPU counts the drain only."""

    def __init__(self, url: str, cluster: OwnCluster):
        super().__init__(daemon=True)
        self.url, self.cluster, self.stop = url, cluster, threading.Event()
        self.by_host, self.total, self.roles = defaultdict(int), 0, {}
        self.first_done = None  # (workers' CPU s, server CPU s, jobs done) at the first finished job

    def run(self):
        with psycopg.connect(self.url, autocommit=True) as c:
            while not self.stop.is_set():
                if self.first_done is None:
                    done = c.execute("SELECT count(*) FROM gen_durable WHERE status = 'done'").fetchone()[0]
                    if done:
                        workers = sum(_proc_cpu(p) for p in _children(os.getpid()))
                        self.first_done = (workers, server_cpu(self.cluster), done)
                rows = c.execute("SELECT coalesce(host(client_addr), 'local'), application_name FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND application_name LIKE 'gen_durable %%'"
                                 ).fetchall()
                hosts, roles = defaultdict(int), defaultdict(int)
                for host, app in rows:
                    hosts[host] += 1
                    role = app.split()[1] if len(app.split()) > 1 else app
                    roles[role] += 1
                for host, n in hosts.items():
                    self.by_host[host] = max(self.by_host[host], n)
                if len(rows) > self.total:
                    self.total, self.roles = len(rows), dict(roles)
                self.stop.wait(0.1)


def run_once(cluster: OwnCluster, hosts: Hosts | None, config: str, n: int, concurrency: int, prefetch: int) -> dict:
    # The example's other queues stay configured (its TASKS name "email": check E061);
    # the workers run only `default` (--queue).
    knobs = {"QUEUES": {"orders": 8, "email": 4, "default": concurrency}, "FLUSH": {"MAX_BATCH": 100, "MAX_DELAY": 0.005},
             "PREFETCH": prefetch, "MIN_DEMAND": max(1, concurrency // 2)}
    k = int(config) if config.isdigit() else 1
    machine, steps_per = ("Pipeline", 5) if config == "pipeline" else ("noop", 1)
    instances = n // steps_per
    with harness.scratch_database("multihost", server=cluster.url()) as url:
        busy = harness.wait_for_quiet()
        _manage(url, "migrate", "-v0")
        s0 = stats(url)
        fill = _shell(url, FILL.format(machine=machine, n=instances))
        harness.settle(url)
        s1 = stats(url)
        cmd = [PY, "manage.py", "rundurable", "--burst", "--queue", f"default={concurrency}", "--no-gc",
               "--no-reaper", "-v0"]
        if config == "loopback" or hosts is None:
            cmds, worker_url = [cmd], url
        else:
            cmds = [hosts.exec_prefix(i) + cmd for i in range(k)]
            worker_url = url.replace("@127.0.0.1:", f"@{hosts.server}:")
        peak = Sampler(url, cluster)
        cpu0 = server_cpu(cluster)
        peak.start()
        try:
            res = harness.drain_with_processes(cmds, done_url=url, done_sql=DONE_SQL, expected=instances,
                                               env=_env(worker_url, knobs), cwd=PROJECT, timeout=600)
        finally:
            peak.stop.set()
            peak.join()
        cpu1 = server_cpu(cluster)
        s2 = stats(url)  # the workers have exited (--burst): their statistics are flushed
        gc = _shell(url, GC)
        s3 = stats(url)
        insert, drain, gcd = delta(s0, s1), delta(s1, s2), delta(s2, s3)
        dump = waldump(cluster, s1["lsn"], s2["lsn"])
    # Per step (a no-op job is one step); the insert and the GC delete happen once per
    # instance, so they are per instance.
    per = {
        "insert_wal": insert["lsn"] / instances, "gc_wal": gcd["lsn"] / max(1, gc["deleted"]),
        "drain_wal": drain["lsn"] / n, "drain_record_bytes": dump.get("record_bytes", 0) / n,
        "drain_fpi_bytes": dump.get("fpi_bytes", 0) / n,
        "drain_records": drain["wal_records"] / n, "drain_fpi": drain["wal_fpi"] / n,
        "drain_commits": drain["commits"] / n, "upd": drain["upd"] / n,
        "hot_share": drain["hot_upd"] / drain["upd"] if drain["upd"] else 0.0,
        "dead_after_drain": drain["dead"] / n, "dead_after_gc": gcd["dead"] / n, "gc_deleted": gc["deleted"],
    }
    if peak.first_done and res.get("workers_cpu_s") is not None and steps_per == 1:
        # From the first finished job to the end: the drain without start-up. (A 5-step
        # instance first finishes near the end of the drain: no such split for it.)
        w0, c0, done0 = peak.first_done
        steps = (instances - done0) * steps_per
        per |= {"worker_cpu_us": (res["workers_cpu_s"] - w0) / steps * 1e6, "server_cpu_us": (cpu1 - c0) / steps * 1e6}
    per["server_cpu_us_all"] = (cpu1 - cpu0) / n * 1e6
    sample = harness.rate_sample(n, res["elapsed_s"], unit="steps/s" if steps_per > 1 else "jobs/s",
                                 enqueue_s=fill["enqueue_s"])
    return sample | {"busy_before": round(busy, 3), "per_job": per, "peak_total": peak.total,
                     "peak_by_host": dict(peak.by_host), "peak_roles": peak.roles, "knobs": knobs | {"hosts": k, "machine": machine}}


def spread(xs, fmt="{:,.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def machine() -> str:
    model = "?"
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{os.cpu_count()} CPUs ({model}), {platform.platform()}, Python {platform.python_version()}"


def report(samples: dict, args, started: str, busiest: float) -> str:
    configs = list(samples)
    base = statistics.median(r["rate"] for r in samples["1"]) if "1" in samples else None
    max_busy = float(os.environ.get("BENCH_MAX_BUSY", 0.25))
    lines = ["# Multi-host drain (bench/multihost.py)", "",
             f"Command: `{' '.join(['.venv/bin/python', 'bench/multihost.py'] + sys.argv[1:])}`  ",
             f"Date: {started}  ",
             f"Machine: {machine()}; Postgres {PG_BIN.parent.name}, a cluster of the script's own "
             "(fsync on, synchronous_commit on, full_page_writes on, autovacuum off, shared_buffers 128MB).  ",
             f"CPU busy before a run: at most {busiest:.0%} (runs wait for ≤ {max_busy:.0%})"
             + (" — ⚠ the machine was busy" if busiest > max_busy else "") + ".", "",
             f"{args.n:,} no-op jobs pre-filled (insert_all), drained by one `rundurable --burst` process per host "
             f"(`default={args.concurrency}`, PREFETCH {args.prefetch}, MIN_DEMAND {max(1, args.concurrency // 2)}); "
             "hosts are network namespaces reaching the server over veth + bridge, each from its own address; "
             "`loopback` is one process in the root namespace on 127.0.0.1; `pipeline` is one host draining "
             f"{args.n // 5:,} instances of the example's 5-step machine (steps/s). The clock includes worker "
             f"start-up. Median (min–max) over {args.runs} runs, configurations alternated.", "",
             "| hosts | processes | rate | vs 1 host | peak worker connections (per host) |", "|---|---:|---:|---:|---|"]
    for c in configs:
        rs = samples[c]
        rates = [r["rate"] for r in rs]
        ratio = f"{statistics.median(rates) / base:.2f}×" if base and c != "pipeline" else "–"
        per_host = max((r["peak_by_host"] for r in rs), key=lambda d: sum(d.values()))
        conns = ", ".join(str(v) for _, v in sorted(per_host.items()))
        procs = int(c) if c.isdigit() else 1
        lines.append(f"| {c} | {procs} | {spread(rates)} {rs[0]['unit']} | {ratio} | {conns} |")
    one = samples.get("1") or samples[configs[0]]
    roles = max(one, key=lambda r: r["peak_total"])["peak_roles"]
    lines += ["", "Connections of one host at its peak, by role (application_name): "
              + ", ".join(f"{k} {v}" for k, v in sorted(roles.items(), key=lambda kv: -kv[1])) + ".", "",
              "Two cores bound the gain: Postgres and every worker process share them, so a second host "
              "can add at most the second core's worth, and a third adds processes, not CPU.", ""]
    noop = [r for c, rs in samples.items() if c != "pipeline" for r in rs]
    pipe = samples.get("pipeline", [])

    def col(rows, key, fmt):
        vals = [r["per_job"][key] for r in rows if r["per_job"].get(key) is not None]
        return spread(vals, fmt) if vals else "–"

    rows = [("WAL bytes, insert (insert_all, batches of 10,000), per instance", "insert_wal", "{:,.0f}"),
            ("WAL bytes, drain: claim + outcome (pg_current_wal_lsn() delta)", "drain_wal", "{:,.0f}"),
            ("  of which WAL records (pg_waldump --stats)", "drain_record_bytes", "{:,.0f}"),
            ("  of which full-page images (first touch after the pre-fill's CHECKPOINT)", "drain_fpi_bytes",
             "{:,.0f}"),
            ("WAL records, drain", "drain_records", "{:.1f}"),
            ("WAL bytes, GC delete of the finished row, per instance", "gc_wal", "{:,.0f}"),
            ("commits, drain", "drain_commits", "{:.3f}"),
            ("row updates of gen_durable, drain", "upd", "{:.2f}"),
            ("HOT share of those updates", "hot_share", "{:.0%}"),
            ("server CPU µs, drain (from the first finished job; all backends)", "server_cpu_us", "{:,.0f}"),
            ("worker CPU µs, drain (from the first finished job; every host's process)", "worker_cpu_us", "{:,.0f}"),
            ("dead tuples left by the drain (autovacuum off)", "dead_after_drain", "{:.2f}"),
            ("dead tuples after the GC delete", "dead_after_gc", "{:.2f}")]
    lines += [f"## Per step (median (min–max) over {len(noop)} no-op runs"
              + (f" and {len(pipe)} pipeline runs" if pipe else "") + ")", "",
              "| measure | no-op job (1 step) | 5-step machine, per step |", "|---|---:|---:|"]
    lines += [f"| {label} | {col(noop, key, fmt)} | {col(pipe, key, fmt)} |" for label, key, fmt in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="loopback,1,2,3,pipeline",
                    help="configurations: loopback, host counts, pipeline (1 host, 5-step machine)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--prefetch", type=int, default=None, help="PREFETCH (default: the concurrency)")
    ap.add_argument("--no-save", action="store_true", help="print only; do not write bench/results/multihost.md")
    args = ap.parse_args(argv)
    if args.prefetch is None:
        args.prefetch = args.concurrency
    configs = args.hosts.split(",")
    if any(c not in ("loopback", "pipeline") and not c.isdigit() for c in configs):
        ap.error(f"--hosts takes loopback, host counts and pipeline, got {args.hosts!r}")
    reason = namespaces_unavailable()
    if reason:
        raise SystemExit(f"bench/multihost.py needs network namespaces: {reason}")
    # SIGTERM unwinds like Ctrl-C, so the finally below removes what was made.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    n_hosts = max([int(c) if c.isdigit() else 1 for c in configs if c != "loopback"], default=0)
    hosts = cluster = None
    samples: dict[str, list] = {c: [] for c in configs}
    try:
        with harness.exclusive_bench():  # the lock every bench process takes on the shared server
            if n_hosts:
                hosts = Hosts(n_hosts).create()
            cluster = OwnCluster(listen=[hosts.server] if hosts else [], trust=[str(hosts.subnet)] if hosts else [],
                                 **SERVER).start()
            for i in range(args.runs):
                for c in configs:
                    r = run_once(cluster, hosts, c, args.n, args.concurrency, args.prefetch)
                    samples[c].append(r)
                    print(f"  run {i + 1}/{args.runs} hosts={c}: {r['rate']:,.0f} {r['unit']} over {r['elapsed_s']:.2f}s; "
                          f"drain WAL {r['per_job']['drain_wal']:,.0f} B/step; peak connections {r['peak_by_host']}; "
                          f"busy before {r['busy_before']:.0%}; roles at the peak {r['peak_roles']}", flush=True)
    finally:
        if cluster is not None:
            cluster.destroy()
        if hosts is not None:
            hosts.destroy()
    busiest = max(r["busy_before"] for rs in samples.values() for r in rs)
    text = report(samples, args, started, busiest)
    print(text)
    if not args.no_save:
        (BENCH / "results" / "multihost.md").write_text(text)


if __name__ == "__main__":
    main()
