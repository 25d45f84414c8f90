"""pgqueuer: drain of 20,000 no-op jobs from a pre-filled queue.

Schema: pgqueuer's own installer (``Queries.install()``, what ``pgq install`` runs),
default durability ``durable`` (every table logged, like gen_durable's).

Pre-fill (timed separately as enqueue): one batched ``Queries.enqueue`` call with
lists (pgqueuer's batch-insert path), in chunks of ``ENQUEUE_CHUNK``.

Drain: ``CONSUMERS`` PgQueuer instances, each on its own asyncpg connection, in one
process under uvloop (the shape of pgqueuer's own ``tools/benchmark.py`` drain
strategy), each ``run(batch_size=BATCH, mode=drain)`` with one ``async def`` no-op
entrypoint. The clock starts just before the consumers start and stops when every
consumer has returned: drain mode returns once the queue is empty and in-flight jobs
finished, and the completion-log buffer (pgqueuer moves each finished job from the
queue table to ``pgqueuer_log`` in batches) is flushed on exit — so the stop time is
"all 20,000 recorded as successful". Afterwards the queue table must be empty and the
log must hold 20,000 'successful' rows, else the run is rejected.

Knobs (tuned on the 2-core bench machine, see bench/README.md): batch_size=250,
2 consumers, uvloop, asyncpg driver, no max_concurrent_tasks cap.

Standalone: ``bench/.venv/bin/python bench/alt_pgqueuer.py [--runs N] [--batch B] [--consumers C]``
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from datetime import timedelta

import harness

N = 20_000
BATCH = 250
CONSUMERS = 2
ENQUEUE_CHUNK = 5_000
TIMEOUT_S = 110.0


# The realistic jobs, the same work as gen_durable's shop.write_row / sleep_20ms /
# async_sleep_20ms: one INSERT of a row, 20 ms of blocking I/O (on a thread: pgqueuer's
# entrypoints are async), 20 ms awaited.
BENCH_ROW_TABLE = ("CREATE TABLE IF NOT EXISTS shop_benchrow (id bigserial PRIMARY KEY, n integer NOT NULL, "
                   "created timestamptz NOT NULL)")


async def _setup_and_enqueue(url: str, n: int, job: str = "noop") -> float:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    conn = await asyncpg.connect(dsn=url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await conn.execute(BENCH_ROW_TABLE)
        t0 = time.perf_counter()
        left = n
        while left:
            k = min(ENQUEUE_CHUNK, left)
            await queries.enqueue([job] * k, [None] * k, [0] * k)
            left -= k
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def _consume(url: str, batch: int, consumers: int, concurrency: int = 0) -> None:
    """The worker process: ``consumers`` PgQueuer instances in drain mode, then exit."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.types import QueueExecutionMode

    conns = [await asyncpg.connect(dsn=url) for _ in range(consumers)]
    # The write_row jobs' own connections (pgqueuer's connection serves its queries).
    pool = await asyncpg.create_pool(dsn=url, min_size=1, max_size=max(concurrency, 1))
    pgqs = []
    for c in conns:
        pgq = PgQueuer(AsyncpgDriver(c))

        @pgq.entrypoint("noop")
        async def noop(job) -> None:  # the job body: nothing
            pass

        @pgq.entrypoint("write_row", concurrency_limit=concurrency)
        async def write_row(job) -> None:
            await pool.execute("INSERT INTO shop_benchrow (n, created) VALUES ($1, now())", 0)

        @pgq.entrypoint("sleep_20ms", concurrency_limit=concurrency)
        async def sleep_20ms(job) -> None:
            await asyncio.to_thread(time.sleep, 0.02)

        @pgq.entrypoint("async_sleep_20ms", concurrency_limit=concurrency)
        async def async_sleep_20ms(job) -> None:
            await asyncio.sleep(0.02)

        pgqs.append(pgq)
    try:
        await asyncio.gather(*(p.run(batch_size=batch, mode=QueueExecutionMode.drain,
                                     dequeue_timeout=timedelta(seconds=1)) for p in pgqs))
    finally:
        await pool.close()
        for c in conns:
            await c.close()


def workload(url: str, *, n: int = N, batch: int = BATCH, consumers: int = CONSUMERS,
             timeout: float = TIMEOUT_S, job: str = "noop", concurrency: int = 0) -> dict:
    """job: noop, write_row, sleep_20ms or async_sleep_20ms; concurrency: the realistic
    entrypoints' concurrency_limit (0: none)."""
    import uvloop

    enqueue_s = uvloop.run(_setup_and_enqueue(url, n, job))
    harness.settle(url)  # ANALYZE + CHECKPOINT, never timed
    cmd = [sys.executable, os.path.abspath(__file__), "_consume", url, str(batch), str(consumers), str(concurrency)]
    res = harness.drain_with_processes(
        [cmd], done_url=url, expected=n, cwd=harness.BENCH_DIR, timeout=timeout,
        done_sql="SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
        gate_table="pgqueuer", gate_waiters=consumers)
    queued = harness.count(url, "SELECT count(*) FROM pgqueuer")
    ok = harness.count(url, "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    if queued != 0 or ok != n:
        raise harness.BenchError(f"pgqueuer: queue left {queued}, logged successful {ok}, expected {n}")
    return harness.rate_sample(n, res["elapsed_s"], unit="jobs/s", enqueue_s=enqueue_s) | {
        "workers_cpu_s": res["workers_cpu_s"], "startup_s": res.get("startup_s"),
        "knobs": {"job": job, "concurrency_limit": concurrency, "batch_size": batch, "consumers": consumers, "driver": "asyncpg",
                  "loop": "uvloop", "durability": "durable", "mode": "drain"},
        "note": "consumers = PgQueuer instances in one worker process, one asyncpg connection each; "
                f"done = {n:,} 'successful' rows in pgqueuer_log (then the queue table must be empty); "
                + ("start-up outside the clock (gate)" if res.get("startup") == "outside"
                   else "worker process spawned inside the clock (start-up included)"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="pgqueuer drain benchmark")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--consumers", type=int, default=CONSUMERS)
    ap.add_argument("--save", action="store_true", help="merge into bench/results/")
    a = ap.parse_args()
    harness.standalone("pgqueuer", lambda u: workload(u, n=a.n, batch=a.batch, consumers=a.consumers), a.runs, a.save)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "_consume":
        import uvloop

        logging.getLogger("pgqueuer").setLevel(logging.WARNING)
        uvloop.run(_consume(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])))
    else:
        main()
