"""Run every registered benchmark workload and print/merge the results table.

    bench/.venv/bin/python bench/run_all.py [--runs N] [--only NAME[,NAME...]] [--list]

Each workload runs ``--runs`` times (default 3), each on a fresh scratch database
``bench_<name>`` on the server at BENCH_DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/postgres). Results are merged into
``bench/results/results.json`` and ``bench/results/results.md`` (keyed by name; entries
not run this time are kept).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alt_django_tasks_db  # noqa: E402
import alt_pgqueuer  # noqa: E402
import alt_procrastinate  # noqa: E402
import gd_workloads  # noqa: E402
import harness  # noqa: E402
import raw_ceiling  # noqa: E402
import tasks_backends  # noqa: E402

# --------------------------------------------------------------------------------------
# Registry: benchmark name -> workload callable ``fn(db_url: str) -> dict`` (contract in
# harness.py). The name is also the scratch database suffix and the results key.
# --------------------------------------------------------------------------------------

RAW_WORKLOADS: dict[str, harness.Workload] = {
    "raw_claim_complete": raw_ceiling.claim_complete,
    "raw_claim_complete_200k": lambda url: raw_ceiling.claim_complete(url, n=200_000),
    "raw_insert_unnest": raw_ceiling.insert_unnest,
    "raw_insert_unnest_text": lambda url: raw_ceiling.insert_unnest(url, text_params=True),
}

REALISTIC = (("write_row", 5_000), ("sleep_20ms", 4_000), ("async_sleep_20ms", 4_000))

ALTERNATIVE_WORKLOADS: dict[str, harness.Workload] = {
    "pgqueuer": alt_pgqueuer.workload,
    "pgqueuer_200k": lambda url: alt_pgqueuer.workload(url, n=200_000),
    # pgqueuer's best of a round-4 sweep (batch 250/500/1000 × 1/2/4 consumers, within ~7 %).
    "pgqueuer_b1000": lambda url: alt_pgqueuer.workload(url, batch=1000, consumers=1),
    "procrastinate": alt_procrastinate.workload,
    # The realistic rows (docs/performance.md): the same work as gd_<job>_c50_p1, at
    # concurrency 50 in one worker process.
    **{f"pgqueuer_{job}_c50": (lambda job, n: lambda url: alt_pgqueuer.workload(
        url, n=n, batch=50, consumers=1, job=job, concurrency=50))(job, n) for job, n in REALISTIC},
    **{f"procrastinate_{job}_c50": (lambda job, n: lambda url: alt_procrastinate.workload(
        url, n=n, workers=1, concurrency=50, job=job))(job, n) for job, n in REALISTIC},
    "django_tasks_db": alt_django_tasks_db.workload,
    # The same 20,000-task drain as tasks_gen_durable (bench/tasks_backends.py runs both).
    "tasks_django_tasks_db": tasks_backends.dtdb_tasks,
}

# ======================================================================================
# REGISTRATION POINT — gen_durable's own workloads (defined in gd_workloads.py).
#
# Add entries name -> callable(db_url) -> dict, e.g.
#     "gen_durable_drain": gen_durable_drain.workload,
#     "gen_durable_insert_all": gen_durable_insert_all.workload,
# A drain workload should: migrate the example project against db_url, pre-fill 20,000
# no-op jobs (time it as enqueue_s), then time `python manage.py rundurable --burst`
# subprocess(es) with DATABASE_URL=db_url via harness.drain_with_processes(...) until a
# done-count query reaches 20,000 (call harness.settle(db_url) between pre-fill and
# drain, as every workload here does), and return {"rate", "n", "elapsed_s", "enqueue_s",
# "enqueue_rate", "knobs", "note"}.
# ======================================================================================
GEN_DURABLE_WORKLOADS: dict[str, harness.Workload] = dict(gd_workloads.WORKLOADS)
GEN_DURABLE_WORKLOADS["tasks_gen_durable"] = tasks_backends.gd_tasks

WORKLOADS: dict[str, harness.Workload] = {
    **GEN_DURABLE_WORKLOADS,
    **ALTERNATIVE_WORKLOADS,
    **RAW_WORKLOADS,
}

# Drains timed by harness.drain_with_processes: --startup outside runs them with worker
# start-up outside the clock (results key NAME@outside). The raw ceiling's clients always
# connect before its start signal; inserts have no workers.
STARTUP_SENSITIVE = gd_workloads.STARTUP_SENSITIVE | {
    "tasks_gen_durable", "pgqueuer", "pgqueuer_200k", "pgqueuer_b1000", "procrastinate", "django_tasks_db", "tasks_django_tasks_db"}


def _interleaved(jobs, runs, label, *, save):
    """Round r runs every benchmark once (run r + 1 of `runs`); summaries as with --runs."""
    samples = {key: [] for key, _, _ in jobs}
    failed = []
    for r in range(runs):
        print(f"== round {r + 1}/{runs}")
        for key, name, mode in jobs:
            if key in failed:
                continue
            harness.STARTUP = mode
            try:
                samples[key].append(harness.run_once(key, WORKLOADS[name], r, runs))
            except Exception:
                failed.append(key)
                traceback.print_exc()
            finally:
                harness.STARTUP = "inside"
        summaries = [harness.summarize(key, xs) for key, xs in samples.items() if xs]
        if summaries and save:  # a long sitting that dies keeps what it measured
            harness.save_results(summaries, env=harness.environment(), label=label)
    return [harness.summarize(key, xs) for key, xs in samples.items() if xs], failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=harness.DEFAULT_RUNS, help="runs per benchmark (default 3)")
    ap.add_argument("--only", default="", help="comma-separated benchmark names to run")
    ap.add_argument("--list", action="store_true", help="list registered benchmarks and exit")
    ap.add_argument("--no-save", action="store_true", help="print only; do not touch bench/results/")
    ap.add_argument("--interleave", action="store_true",
                    help="run the set round-robin, one run of each benchmark per round (a drifting host "
                         "then weighs on every benchmark alike: ratios within the sitting hold)")
    ap.add_argument("--startup", choices=("inside", "outside", "both"), default="inside",
                    help="worker start-up inside the drain clock, outside it (the start-up gate; results "
                         "key NAME@outside), or both (each drain twice, other benchmarks once)")
    a = ap.parse_args(argv)

    if a.list:
        for name in WORKLOADS:
            print(name)
        return 0
    names = [n.strip() for n in a.only.split(",") if n.strip()] or list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(WORKLOADS)}", file=sys.stderr)
        return 2

    label = harness.server_label()
    print(f"server: {harness.server_url()} ({label})  runs: {a.runs}  startup: {a.startup}")
    harness.precompile()
    modes = ["inside", "outside"] if a.startup == "both" else [a.startup]
    jobs = []
    for name in names:
        for mode in modes:
            if mode == "outside" and name not in STARTUP_SENSITIVE:
                if a.startup == "outside":
                    print(f"== {name}: no worker start-up to move out of the clock; run as is")
                    jobs.append((name, name, "inside"))
                continue
            jobs.append((name if mode == "inside" else f"{name}@outside", name, mode))
    summaries, failed = [], []
    t_all = time.perf_counter()
    if a.interleave:
        summaries, failed = _interleaved(jobs, a.runs, label, save=not a.no_save)
        jobs = []
    for key, name, mode in jobs:
        print(f"== {key}")
        t0 = time.perf_counter()
        harness.STARTUP = mode
        try:
            summaries.append(harness.run_benchmark(key, WORKLOADS[name], a.runs))
            if summaries[-1].get("note"):
                print(f"   note (first run): {summaries[-1]['note']}")
        except Exception:
            failed.append(key)
            traceback.print_exc()
        finally:
            harness.STARTUP = "inside"
        print(f"   ({time.perf_counter() - t0:.0f}s)")
        # Save as we go: a long run that dies keeps what it measured.
        if summaries and not a.no_save:
            harness.save_results(summaries, env=harness.environment(), label=label)
    print(f"total {time.perf_counter() - t_all:.0f}s")
    print()
    harness.print_table(summaries)
    if not a.no_save:
        print(f"\nmerged into {harness.RESULTS_JSON.relative_to(harness.ROOT)} and "
              f"{harness.RESULTS_MD.relative_to(harness.ROOT)}")
    if failed:
        print(f"FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
