"""Django Tasks (django-tasks + django-tasks-db): drain of N no-op tasks from a pre-filled queue.

Project: the minimal settings module ``bench/dtdb/settings.py`` (apps: contenttypes,
django_tasks, django_tasks_db; ``TASKS`` backend ``django_tasks_db.DatabaseBackend``;
DEBUG off) pointed at the scratch database through BENCH_DTDB_URL.

Setup: ``manage.py migrate`` (the backend's own migrations). Pre-fill (timed
separately as enqueue): ``noop.enqueue()`` N times in a subprocess — the framework has
no bulk enqueue, so each call is one INSERT in its own autocommit transaction, the way
a view would enqueue.

Drain: ``WORKERS`` × ``manage.py db_worker --batch --no-startup-delay --no-reload
--interval 0.1``. ``db_worker`` is a serial loop — one task per claim transaction
(``SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1`` + claim UPDATE, commit), run, then a
success UPDATE (commit) — so throughput scales with worker *processes*. ``--batch``
makes a worker exit once the queue is empty. The clock starts just before the workers
are spawned (Django start-up included) and stops at the first poll (every 50 ms) that
counts N ``SUCCESSFUL`` rows.

Default N is **10,000**, not 20,000: this backend runs ~200-300 jobs/s on the bench
machine and enqueues ~600/s, so 20,000 would take ~2.5 minutes per run. The rate is
per-job overhead (two transactions and an ORM round of Python per task), so it does
not depend on N; ``--n 20000`` runs the full size.

``CONN_MAX_AGE`` is set to None (persistent connections): ``db_worker`` calls
``close_old_connections()`` around every task, so with Django's default of 0 every
task opens a fresh Postgres connection (measured ~57 jobs/s vs ~270 at N=2,000).

Standalone: ``bench/.venv/bin/python bench/alt_django_tasks_db.py [--runs N] [--workers W] [--n N]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import harness

N = 10_000  # reduced from 20,000: ~200-300 jobs/s here; see module docstring
WORKERS = 2
TIMEOUT_S = 110.0
CONN_MAX_AGE = "none"  # persistent connections; "0" = Django's default (reconnect per task)
TABLE = "django_tasks_database_dbtaskresult"


def _env(url: str, conn_max_age: str = "none") -> dict:
    env = dict(os.environ)
    env["BENCH_DTDB_CONN_MAX_AGE"] = conn_max_age
    env["DJANGO_SETTINGS_MODULE"] = "dtdb.settings"
    env["BENCH_DTDB_URL"] = url
    env["PYTHONPATH"] = str(harness.BENCH_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _django(args: list[str], url: str, timeout: float) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "django", *args], env=_env(url), cwd=harness.BENCH_DIR,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise harness.BenchError(f"django {' '.join(args)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def workload(url: str, *, n: int = N, workers: int = WORKERS, conn_max_age: str = CONN_MAX_AGE,
             timeout: float = TIMEOUT_S) -> dict:
    _django(["migrate", "--noinput", "-v", "0"], url, 120)

    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "_enqueue", str(n)], env=_env(url), cwd=harness.BENCH_DIR,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise harness.BenchError(f"enqueue failed:\n{proc.stderr[-3000:]}")
    enqueue_s = json.loads(proc.stdout.strip().splitlines()[-1])["enqueue_s"]
    harness.settle(url)

    cmd = [sys.executable, "-m", "django", "db_worker", "--batch", "--no-startup-delay",
           "--no-reload", "--interval", "0.1", "-v", "0"]
    res = harness.drain_with_processes(
        [cmd] * workers,
        done_url=url,
        done_sql=f"SELECT count(*) FROM {TABLE} WHERE status = 'SUCCESSFUL'",
        expected=n,
        env=_env(url, conn_max_age),
        cwd=harness.BENCH_DIR,
        timeout=timeout,
        gate_table=TABLE, gate_waiters=workers,
    )
    left = harness.count(url, f"SELECT count(*) FROM {TABLE} WHERE status <> 'SUCCESSFUL'")
    if left:
        raise harness.BenchError(f"django-tasks-db: {left} tasks not SUCCESSFUL")
    return harness.rate_sample(n, res["elapsed_s"], unit="jobs/s", enqueue_s=enqueue_s) | {
        "workers_cpu_s": res["workers_cpu_s"],
        "worker_exit_s": res["worker_exit_s"],
        "knobs": {"workers": workers, "CONN_MAX_AGE": conn_max_age,
                  "db_worker": "--batch --no-startup-delay --no-reload --interval 0.1"},
        "note": "db_worker is serial (1 task per claim txn + 1 success txn); worker processes "
                "spawned inside the timed window; enqueue = one .enqueue() (1 INSERT, autocommit) per task",
    }


def _enqueue_main(n: int) -> None:
    import django

    django.setup()
    from dtdb.tasks import noop

    t0 = time.perf_counter()
    for _ in range(n):
        noop.enqueue()
    print(json.dumps({"enqueue_s": time.perf_counter() - t0}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_enqueue":  # subprocess: Django configured by env
        _enqueue_main(int(sys.argv[2]))
        return
    ap = argparse.ArgumentParser(description="django-tasks-db drain benchmark")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--workers", type=int, default=WORKERS)
    ap.add_argument("--conn-max-age", default=CONN_MAX_AGE, help='"none" (persistent, default) or seconds; "0" = Django default')
    ap.add_argument("--save", action="store_true", help="merge into bench/results/")
    a = ap.parse_args()
    harness.standalone("django_tasks_db", lambda u: workload(u, n=a.n, workers=a.workers, conn_max_age=a.conn_max_age), a.runs, a.save)


if __name__ == "__main__":
    main()
