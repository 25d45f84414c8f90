"""The worker's Python per step, without the database: one step thread over pre-built claims.

    bench/.venv/bin/python bench/step_path.py [--n 30000] [--runs 7]

A drain's throughput on 2 cores moves by a third between runs on a drifting host, so a
change of a few microseconds per step cannot be read off it. This runs the real step
thread (`Scheduler._step_loop`: take, re-check, `run_chain`, `execute`, `to_entry`, the
end-of-step connection checks) over ``n`` claims already in its buffer, handing each
outcome to a flusher that only counts; and the inline continuation's own work
(`executor.continuation`) over committed entries. No statement runs: what is left is
the Python the engine spends per step, in one process, on one thread at a time.

Prints the median and min–max of µs per unit over ``runs`` runs:
- job step: the `shop.noop` job (Done);
- chain step: a step of `shop.InlinePipeline` that returns `Next(state=...)`, as a
  continued step of an inline chain (its admission check, the chain bound, the inline
  entry);
- continuation: building the next claim from a committed inline entry;
- continue_chains: the flusher's hand-back of one committed inline entry
  (`Scheduler.continue_chains`: the continuation, its async check, the buffer).

Compare two checkouts by running this script from each (PYTHONPATH=<checkout>).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "example_project"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")  # never connected to

import django  # noqa: E402

django.setup()

from gen_durable.conf import get_settings  # noqa: E402
from gen_durable.limiter import get_limiter  # noqa: E402
from gen_durable.worker import executor  # noqa: E402
from gen_durable.worker.claims import Claimed  # noqa: E402
from gen_durable.worker.scheduler import Scheduler  # noqa: E402


class CountingFlusher:
    """Stands in for the flusher: counts outcomes, commits nothing."""

    def __init__(self, target):
        self.n, self.target, self.done = 0, target, threading.Event()

    def step_started(self):
        pass

    def step_abandoned(self):
        pass

    def submit(self, entry, wait=False):
        self.n += 1
        if self.n >= self.target:
            self.done.set()


def claim(i, fsm, step, state, chain=None):
    raw = json.dumps(state)
    job = Claimed(id=i, fsm=fsm, fsm_version=1, step=step, state=json.loads(raw), attempt=0, awaits=None,
                  queue="default", priority=0, eligible_at=0.0, concurrency_key=None, concurrency_shard=None,
                  rate_limit=None, weight=1.0, correlation_key=None, parent_id=None, claim=1, worker="bench-worker")
    job.raw_state, job.is_async = raw, False
    if chain is not None:
        job.chain, job.checked = chain, time.monotonic()
    return job


def step_thread(jobs) -> float:
    """µs per step of one step thread draining `jobs` from its buffer."""
    flusher = CountingFlusher(len(jobs))
    sched = Scheduler("default", 1, worker_id="bench-worker", prefix="bench-", flusher=flusher,
                      limiter=get_limiter(None), settings=get_settings())
    with sched._lock:
        sched.buffer.extend(jobs)
        sched._continuations = sum(1 for j in jobs if getattr(j, "chain", None) is not None)
        started = time.perf_counter()
        sched._dispatch_locked()
    if not flusher.done.wait(120):
        raise SystemExit("the step thread did not finish")
    elapsed = time.perf_counter() - started
    sched._stop.set()
    with sched._lock:
        sched._stop_steps = True
        sched._lock.notify_all()
    return elapsed / len(jobs) * 1e6


def continuations(n) -> float:
    jobs = [claim(i, "shop.InlinePipeline", "parse", {"n": i}, chain=(0.0, 1, "x")) for i in range(n)]
    entries = [executor.execute(j, inline=True) for j in jobs]
    for e in entries:
        e.inputs = ((), ())
    started = time.perf_counter()
    for job, entry in zip(jobs, entries):
        executor.continuation(job, entry)
    return (time.perf_counter() - started) / n * 1e6


def continue_chains(n) -> float:
    """µs per entry of `Scheduler.continue_chains` over one flush's committed inline
    entries (batches of 500): the continuation, its async check, the buffer."""
    sched = Scheduler("default", 1, worker_id="bench-worker", prefix="bench-", flusher=CountingFlusher(n),
                      limiter=get_limiter(None), settings=get_settings())
    sched._stop_steps = True  # nothing is dispatched: only the hand-back is timed
    jobs = [claim(i, "shop.InlinePipeline", "parse", {"n": i}, chain=(0.0, 1, "x")) for i in range(n)]
    entries = [executor.execute(j, inline=True) for j in jobs]
    for e in entries:
        e.inputs, e.chain = ((), ()), (0.0, 2)
    sched.in_flight = {j.id: j for j in jobs}
    elapsed = 0.0
    for i in range(0, n, 500):
        batch = entries[i:i + 500]
        committed = {e.id: "executing" for e in batch}
        started = time.perf_counter()
        sched.continue_chains(batch, committed)
        elapsed += time.perf_counter() - started
    return elapsed / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=30_000, help="steps per run")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    results = {"job step": [], "chain step": [], "continuation": [], "continue_chains": []}
    for _ in range(args.runs):
        results["job step"].append(step_thread([claim(i, "shop.noop", "perform", {"n": i})
                                                for i in range(args.n)]))
        # A continued step (steps=2 of its chain, started now): admission check, the
        # chain bound, Next(state=...) → an inline entry.
        now = time.monotonic()
        results["chain step"].append(step_thread([claim(i, "shop.InlinePipeline", "enrich",
                                                        {"n": i, "value": 2 * i}, chain=(now, 2, "validate"))
                                                  for i in range(args.n)]))
        results["continuation"].append(continuations(args.n))
        results["continue_chains"].append(continue_chains(args.n))
    print(f"{'unit':14s} {'median µs':>10s} {'min–max':>15s}   ({args.runs} runs of {args.n:,})")
    for name, xs in results.items():
        print(f"{name:14s} {statistics.median(xs):10.2f} {min(xs):7.2f}–{max(xs):<7.2f}")


if __name__ == "__main__":
    main()
