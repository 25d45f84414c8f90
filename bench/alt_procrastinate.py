"""procrastinate: drain of 20,000 no-op jobs from a pre-filled queue.

Schema: procrastinate's own ``SchemaManager.apply_schema_async()`` (what
``procrastinate schema --apply`` runs).

Pre-fill (timed separately as enqueue): ``Task.batch_defer_async`` (one INSERT per
call) in chunks of ``ENQUEUE_CHUNK``.

Drain: ``WORKERS`` worker process(es), each ``App.run_worker_async(concurrency=C,
wait=False)`` over procrastinate's ``PsycopgConnector`` (psycopg 3 async pool sized
for the concurrency), one ``async def`` no-op task, ``delete_jobs="never"`` (finished
jobs stay as ``succeeded`` rows — the default). ``wait=False`` makes a worker return
once it finds the queue empty. The clock starts just before the workers are spawned
and stops at the first poll (every 50 ms) that counts 20,000 ``succeeded`` jobs.

Procrastinate fetches one job per ``procrastinate_fetch_job_v2`` call (no batch
claim), so each job costs a fetch round-trip plus a finish round-trip.

Knobs: 4 worker processes × concurrency 10 (tuned on the 2-core bench machine, see
bench/README.md), LISTEN/NOTIFY on (default), pool min=max=concurrency+2. A worker
fetches serially (one ``fetch_job`` round-trip at a time, however high the
concurrency) and spends ~2 ms of Python CPU per job, so one process tops out around
200-300 jobs/s here; more processes than cores still help because each is half idle
waiting on round-trips.

Standalone: ``bench/.venv/bin/python bench/alt_procrastinate.py [--runs N] [--workers W] [--concurrency C]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time

import harness

N = 20_000
WORKERS = 4
CONCURRENCY = 10
ENQUEUE_CHUNK = 5_000
TIMEOUT_S = 110.0


def _make_app(url: str, pool_size: int):
    import procrastinate

    # it warns that the App lives in a __main__ module; that is deliberate here
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=pool_size, max_size=pool_size),
    )

    @app.task(name="noop")
    async def noop() -> None:  # the job body: nothing
        return None

    # The realistic jobs, the same work as gen_durable's shop.write_row / sleep_20ms /
    # async_sleep_20ms (procrastinate runs a sync task on a thread).
    @app.task(name="write_row")
    async def write_row() -> None:
        await app.connector.execute_query_async("INSERT INTO shop_benchrow (n, created) VALUES (0, now())")

    @app.task(name="sleep_20ms")
    def sleep_20ms() -> None:
        time.sleep(0.02)

    @app.task(name="async_sleep_20ms")
    async def async_sleep_20ms() -> None:
        await asyncio.sleep(0.02)

    app.bench_tasks = {"noop": noop, "write_row": write_row, "sleep_20ms": sleep_20ms,
                       "async_sleep_20ms": async_sleep_20ms}
    return app, noop


async def _setup_and_enqueue(url: str, n: int, job: str = "noop") -> float:
    app, _ = _make_app(url, 2)
    noop = app.bench_tasks[job]
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await app.connector.execute_query_async(
            "CREATE TABLE IF NOT EXISTS shop_benchrow (id bigserial PRIMARY KEY, n integer NOT NULL, "
            "created timestamptz NOT NULL)")
        t0 = time.perf_counter()
        left = n
        while left:
            k = min(ENQUEUE_CHUNK, left)
            await noop.batch_defer_async(*([{}] * k))
            left -= k
        return time.perf_counter() - t0


async def _run_worker(url: str, concurrency: int) -> None:
    app, _ = _make_app(url, concurrency + 2)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False, delete_jobs="never",
        )


def workload(url: str, *, n: int = N, workers: int = WORKERS, concurrency: int = CONCURRENCY,
             timeout: float = TIMEOUT_S, job: str = "noop") -> dict:
    """job: noop, write_row, sleep_20ms or async_sleep_20ms."""
    enqueue_s = asyncio.run(_setup_and_enqueue(url, n, job))
    harness.settle(url)
    cmd = [sys.executable, os.path.abspath(__file__), "_worker", url, str(concurrency)]
    res = harness.drain_with_processes(
        [cmd] * workers,
        done_url=url,
        done_sql="SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        expected=n,
        cwd=harness.BENCH_DIR,
        timeout=timeout,
        gate_table="procrastinate_jobs", gate_waiters=workers,
    )
    left = harness.count(url, "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'")
    if left:
        raise harness.BenchError(f"procrastinate: {left} jobs not succeeded")
    return harness.rate_sample(n, res["elapsed_s"], unit="jobs/s", enqueue_s=enqueue_s) | {
        "workers_cpu_s": res["workers_cpu_s"],
        "worker_exit_s": res["worker_exit_s"],
        "knobs": {"job": job, "workers": workers, "concurrency": concurrency, "connector": "PsycopgConnector",
                  "pool": concurrency + 2, "listen_notify": True, "delete_jobs": "never"},
        "note": "worker processes spawned inside the timed window (start-up included); "
                f"done = {n:,} rows with status 'succeeded'",
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":  # a worker process
        logging.basicConfig(level=logging.WARNING)
        asyncio.run(_run_worker(sys.argv[2], int(sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description="procrastinate drain benchmark")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--workers", type=int, default=WORKERS)
    ap.add_argument("--concurrency", type=int, default=CONCURRENCY)
    ap.add_argument("--save", action="store_true", help="merge into bench/results/")
    a = ap.parse_args()
    harness.standalone("procrastinate",
                       lambda u: workload(u, n=a.n, workers=a.workers, concurrency=a.concurrency), a.runs, a.save)


if __name__ == "__main__":
    main()
