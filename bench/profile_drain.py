"""Profile a gen_durable drain: py-spy on the rundurable workers, pg_stat_statements on the server.

    bench/.venv/bin/python bench/profile_drain.py [--n 200000] [--processes 2] [--concurrency 16]
        [--prefetch 200] [--min-demand 50] [--seconds 12] [--out bench/results/profile]
        [--machine InlinePipeline --steps-per 5] [--gil | --idle]

Pre-fills ``n`` no-op jobs into a scratch database (``bench_profile``), starts
``processes`` `rundurable --burst` workers and, once they claim, samples each with
``py-spy record --format raw`` (collapsed stacks, 100 Hz, Python frames only, on-CPU
samples only: py-spy leaves idle threads out) for ``seconds``. Writes per worker
``<out>/worker<i>.folded`` and a summary ``<out>/profile.md``: the top Python functions
by own samples and by inclusive samples of the *active* (on-CPU) samples, and — if the
server has pg_stat_statements loaded (shared_preload_libraries; only on a server of
your own) — the top statements of the scratch database by total time with calls and
rows per call.

py-spy needs ptrace rights on the workers (root, or the same user with
kernel.yama.ptrace_scope = 0). It is installed in bench/.venv by bench/setup.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gd_workloads  # noqa: E402
import harness  # noqa: E402


def _py_spy() -> str:
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    found = shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy not found: run bench/setup")
    return found


def _top(folded: list[Path], k: int = 25) -> tuple[int, int, list, list]:
    """Aggregate collapsed stacks: (all samples, active samples, top self, top inclusive)."""
    own, incl = collections.Counter(), collections.Counter()
    total = active = 0
    for path in folded:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            n = int(count)
            total += n
            # py-spy --idle marks nothing itself; a thread parked in a wait ends in one of these.
            frames = stack.split(";")
            leaf = frames[-1]
            if any(w in leaf for w in ("wait (threading.py", "select (selectors.py", "_wait_for_ready",
                                       "sleep", "get (queue.py", "acquire", "wait (psycopg", "poll (")):
                continue
            active += n
            own[_short(leaf)] += n
            for f in set(map(_short, frames)):
                incl[f] += n
    return total, active, own.most_common(k), incl.most_common(k)


ROLES = (("_step_loop", "step thread"), ("Flusher._loop", "flusher"), ("Scheduler._loop", "feeder"))
# Where a role's thread is when it is not running Python of its own: waiting for work
# (its loop's Condition/Event wait), or for the database (a statement's round trip; with
# other threads busy, the GIL after it — see bench/README.md on psycopg's send frames).
DB_WAITS = ("Connection.wait", "_send_query_prepared", "_exec_command", "_maybe_prepare_gen", "untouched")


def _roles(folded: list[Path]) -> list[tuple]:
    """Per worker role, the shares of its samples (py-spy --idle: every thread, waiting
    or not): waiting for work, in a database round trip, running. A role whose share
    waiting for work is near zero is the drain's bottleneck."""
    seen = {name: collections.Counter() for _, name in ROLES}
    for path in folded:
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack:
                continue
            frames = stack.split(";")
            role = next((name for key, name in ROLES if any(key in f for f in frames)), None)
            if role is None:
                continue
            leaf = frames[-1]
            if any(w in leaf for w in DB_WAITS):
                where = "database"
            elif any(w in leaf for w in ("wait (threading.py", "_acquire_restore")) and "engine_transaction" not in stack:
                where = "waiting for work"
            else:
                where = "running"
            seen[role][where] += int(count)
    rows = []
    for role, c in seen.items():
        total = sum(c.values())
        if total:
            rows.append((role, total, *(100 * c[k] / total for k in ("waiting for work", "database", "running"))))
    return rows


def _short(frame: str) -> str:
    # "func (path/to/module.py:123)" -> "func (module.py)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if len(parts) >= 2 else path
    return f"{name} ({short})"


STATEMENTS_SQL = """
SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
       round((100 * total_exec_time / sum(total_exec_time) OVER ())::numeric, 1) AS pct,
       round(mean_exec_time::numeric, 3) AS mean_ms,
       round((rows::numeric / greatest(calls, 1)), 1) AS rows_per_call,
       shared_blks_hit + shared_blks_read AS blocks,
       regexp_replace(left(query, 160), '\\s+', ' ', 'g') AS query
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)
ORDER BY total_exec_time DESC LIMIT %s
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--defaults", action="store_true",
                    help="the engine's defaults: no PREFETCH / MIN_DEMAND / FLUSH knob (adaptive claim-ahead)")
    ap.add_argument("--prefetch", type=int, default=200)
    ap.add_argument("--min-demand", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--machine", default="noop",
                    help="shop.durable machine to fill with (e.g. InlinePipeline: 5 steps per instance)")
    ap.add_argument("--steps-per", type=int, default=1, help="steps per instance, to report steps/s")
    ap.add_argument("--max-batch", type=int, default=100, help="FLUSH.MAX_BATCH")
    ap.add_argument("--gil", action="store_true",
                    help="sample only the thread holding the GIL (py-spy --gil): where the Python CPU goes")
    ap.add_argument("--idle", action="store_true",
                    help="sample waiting threads too (py-spy --idle) and tell, per role (step thread, flusher, "
                         "feeder), the shares waiting for work, in the database and running: the bottleneck")
    ap.add_argument("--out", default=str(harness.RESULTS_DIR / "profile"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    server = harness.server_url()
    knobs = {"QUEUES": {"default": a.concurrency}}
    if not a.defaults:
        knobs |= {"FLUSH": {"MAX_BATCH": a.max_batch, "MAX_DELAY": 0.005},
                  "PREFETCH": a.prefetch, "MIN_DEMAND": a.min_demand}
    tuning = ("--defaults" if a.defaults else
              f"--prefetch {a.prefetch} --min-demand {a.min_demand} --max-batch {a.max_batch}")
    lines = [f"# Drain profile ({harness.server_label()})", "",
             f"`bench/profile_drain.py --n {a.n} --processes {a.processes} --concurrency {a.concurrency} "
             f"{tuning} --seconds {a.seconds:g}"
             + (" --gil" if a.gil else "") + (" --idle" if a.idle else "")
             + (f" --machine {a.machine} --steps-per {a.steps_per}" if a.machine != "noop" else "") + "`", ""]
    with harness.exclusive_bench(server), harness.scratch_database("profile", server) as url:
        dbname = harness.db_identifier("profile")
        gd_workloads._manage(url, "migrate", "-v0")
        gd_workloads._shell(url, gd_workloads.FILL.format(machine=a.machine, n=a.n))
        harness.settle(url)
        stats = False
        with psycopg.connect(server, autocommit=True) as conn:
            try:
                # Only where it is loaded (a server of your own): never create it elsewhere.
                if "pg_stat_statements" not in conn.execute("SHOW shared_preload_libraries").fetchone()[0]:
                    raise psycopg.errors.ObjectNotInPrerequisiteState("pg_stat_statements is not preloaded")
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
                stats = True
            except psycopg.Error as exc:
                print(f"pg_stat_statements unavailable ({exc}); Python profile only")
        cmd = [gd_workloads.PY, "manage.py", "rundurable", "--burst", "--queue", f"default={a.concurrency}",
               "--no-gc", "--no-reaper", "-v0"]
        log = open(out / "workers.log", "w")
        procs = [subprocess.Popen(cmd + [f"--child={i}"], cwd=gd_workloads.PROJECT,
                                  env=gd_workloads._env(url, knobs), stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True) for i in range(a.processes)]
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                while conn.execute(gd_workloads.DONE_SQL).fetchone()[0] < 1000:
                    time.sleep(0.05)  # past start-up: profile the steady drain
                if stats:  # the statements of the sampled window only
                    with psycopg.connect(server, autocommit=True) as sconn:
                        sconn.execute("SELECT pg_stat_statements_reset()")
                d0, t0 = conn.execute(gd_workloads.DONE_SQL).fetchone()[0], time.perf_counter()
                spies = [subprocess.Popen([_py_spy(), "record", "--pid", str(p.pid), "--duration", str(max(1, round(a.seconds))),
                                           "--rate", "100", "--format", "raw", *(["--gil"] if a.gil else []),
                                           *(["--idle"] if a.idle else []),
                                           "--output", str(out / f"worker{i}.folded"), "--nonblocking"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                          for i, p in enumerate(procs)]
                for s in spies:
                    s.wait(a.seconds + 60)
                    err = s.stderr.read().decode(errors="replace").strip()
                    if s.returncode:
                        print(f"py-spy exited {s.returncode}: {err[-1000:]}")
                d1, t1 = conn.execute(gd_workloads.DONE_SQL).fetchone()[0], time.perf_counter()
                if stats:
                    with psycopg.connect(server, autocommit=True) as sconn:
                        stmt_rows = sconn.execute(STATEMENTS_SQL, (dbname, 15)).fetchall()
            lines += [f"Drain rate while sampled: {(d1 - d0) / (t1 - t0):,.0f} instances/s, "
                      f"{(d1 - d0) * a.steps_per / (t1 - t0):,.0f} steps/s "
                      f"({d1 - d0:,} instances in {t1 - t0:.1f} s).", ""]
        finally:
            for p in procs:
                harness._stop_process(p)
        folded = [out / f"worker{i}.folded" for i in range(a.processes)]
        total, active, own, incl = _top([f for f in folded if f.exists()])
        if a.idle:
            lines += ["## Roles (py-spy --idle: every thread's samples)", "",
                      "| role | samples | waiting for work % | database % | running % |", "|---|---:|---:|---:|---:|"]
            lines += [f"| {r} | {n:,} | {w:.1f} | {d:.1f} | {x:.1f} |"
                      for r, n, w, d, x in _roles([f for f in folded if f.exists()])]
            lines += [""]
        lines += [f"## Python (py-spy, {a.processes} worker(s), {total:,} samples, {active:,} on CPU)", "",
                  "Shares are of the on-CPU samples (a thread waiting on a lock, a queue, a socket or",
                  "a sleep is left out).", "",
                  "| own % | function |", "|---:|---|"]
        lines += [f"| {100 * n / max(active, 1):.1f} | `{f}` |" for f, n in own]
        lines += ["", "| inclusive % | function |", "|---:|---|"]
        lines += [f"| {100 * n / max(active, 1):.1f} | `{f}` |" for f, n in incl]
        if stats:
            rows = stmt_rows
            lines += ["", "## SQL (pg_stat_statements, the sampled window)", "",
                      "| calls | total ms | % | mean ms | rows/call | blocks | statement |",
                      "|---:|---:|---:|---:|---:|---:|---|"]
            lines += [f"| {c:,} | {t} | {p} | {m} | {r} | {b:,} | `{q.replace('|', '/')}` |"
                      for c, t, p, m, r, b, q in rows]
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
