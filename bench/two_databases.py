"""One host serving two databases vs one: the same no-op drain, `rundurable --burst` with
`--database a` (N jobs) and with `--database a --database b` (N jobs in each), one process.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/two_databases.py [--n 10000] [--runs 3] [--concurrency 20]

Both databases are made on the server DATABASE_URL names (bench_gd_two_a/_b, created,
migrated and dropped again by this script; nothing of the server's configuration is
changed), with the test settings (tests/settings.py: aliases "default" and "other") and
their `tests.noop` job. Configurations alternate within each round, so drift of the
machine hits both alike. The rate is all jobs done over the wall time of the
`rundurable` process (its start-up included: migrations check, budget, first claim),
and over the span from the first to the last completion (start-up excluded).
Prints a Markdown table (and writes bench/results/two_databases.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
MANAGE = [sys.executable, str(ROOT / "tests" / "manage.py")]
NAMES = {"default": "bench_gd_two_a", "other": "bench_gd_two_b"}
FILL = ("import gen_durable as gd, os; n = int(os.environ['BENCH_N']); "
        "[gd.insert_all([gd.Spec('tests.noop') for _ in range(min(5000, n - i))], using=alias) "
        "for alias in ('default', 'other') for i in range(0, n, 5000)]")


def server_url() -> str:
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")


def env(concurrency: int) -> dict:
    import json

    return dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", DATABASE_URL=server_url(),
                GEN_DURABLE_TEST_DB_NAME=NAMES["default"], GEN_DURABLE_TEST_OTHER_DB_NAME=NAMES["other"],
                GEN_DURABLE_TEST_SETTINGS=json.dumps({"QUEUES": {"default": concurrency}, "GC": False}))


def admin(sql: str) -> None:
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(sql)


def run(cmd, e, **kw):
    return subprocess.run(cmd, cwd=ROOT, env=e, check=True, capture_output=True, text=True, **kw)


def reset(e, n: int, both: bool) -> None:
    """Empty both databases, then n jobs in "default" (and in "other" when `both`)."""
    for alias, name in NAMES.items():
        with psycopg.connect(server_url().rsplit("/", 1)[0] + "/" + name, autocommit=True) as conn:
            conn.execute("TRUNCATE gen_durable, gen_durable_signals RESTART IDENTITY CASCADE")
    fill = FILL if both else FILL.replace("('default', 'other')", "('default',)")
    run(MANAGE + ["shell", "-c", fill], dict(e, BENCH_N=str(n)))
    for name in NAMES.values():
        with psycopg.connect(server_url().rsplit("/", 1)[0] + "/" + name, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE gen_durable")


def drain(e, aliases, concurrency: int) -> float:
    cmd = MANAGE + ["rundurable", "--burst", "--no-gc", "--queue", f"default={concurrency}"]
    for alias in aliases:
        cmd += ["--database", alias]
    started = time.perf_counter()
    run(cmd, e, timeout=600)
    return time.perf_counter() - started


def done(name: str) -> tuple:
    """(jobs done, first and last completion instant) of one database, by the server's clock."""
    with psycopg.connect(server_url().rsplit("/", 1)[0] + "/" + name) as conn:
        return conn.execute("SELECT count(*), min(updated_at), max(updated_at) FROM gen_durable "
                            "WHERE status = 'done'").fetchone()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10000, help="jobs per database")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=20)
    args = ap.parse_args()
    e = env(args.concurrency)
    for name in NAMES.values():
        admin(f"DROP DATABASE IF EXISTS {name}")
        admin(f"CREATE DATABASE {name}")
    try:
        for alias in NAMES:
            run(MANAGE + ["migrate", "--database", alias, "-v", "0"], e)
        rates = {"one database": [], "two databases": []}
        steady = {"one database": [], "two databases": []}
        for _ in range(args.runs):
            for label, aliases in (("one database", ["default"]), ("two databases", ["default", "other"])):
                reset(e, args.n, both=len(aliases) == 2)
                seconds = drain(e, aliases, args.concurrency)
                got = [done(NAMES[a]) for a in aliases]
                total = sum(g[0] for g in got)
                assert total == args.n * len(aliases), (label, total)
                rates[label].append(total / seconds)
                span = (max(g[2] for g in got) - min(g[1] for g in got)).total_seconds()
                steady[label].append(total / span)
    finally:
        for name in NAMES.values():
            admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    lines = [
        f"# One host, one vs two databases ({dt.date.today().isoformat()})", "",
        f"`{' '.join(['.venv/bin/python', 'bench/two_databases.py'] + sys.argv[1:])}` on {platform.node()} "
        f"({os.cpu_count()} cores, shared with other sessions' work), Postgres on the same machine; "
        f"{args.n} no-op jobs per database, `--queue default={args.concurrency}`, one `rundurable` process, "
        "\"wall\" = jobs done / wall time of the process (start-up included); \"drain\" = jobs done / "
        "time from the first to the last completion (server clock, start-up excluded).", "",
        "| configuration | wall jobs/s, median (min–max) | drain jobs/s, median (min–max) | runs |",
        "|---|---:|---:|---:|",
    ]
    def cell(values):
        return f"{statistics.median(values):,.0f} ({min(values):,.0f}–{max(values):,.0f})"

    for label, values in rates.items():
        lines.append(f"| {label} | {cell(values)} | {cell(steady[label])} | {len(values)} |")
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "two_databases.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
