"""Admin pages and the queue overview on a 1,000,000-row table: render time and plans.

    bench/.venv/bin/python bench/admin_pages.py [--rows 300000,1000000] [--runs 7]

Each size in --rows is measured in turn on the same scratch database (grown from the
previous size), every request under a 3 s statement_timeout (--timeout): the
acceptance that "Show counts" (?_facets=True) answers within it at 300,000 rows.
Seeds a scratch database (bench_admin) with ≈30 % runnable rows over 3 queues and 3
priorities, 0.5 % executing, the rest terminal (2 % of those failed, every tenth a
child; finished over the last 24 h, the GC retention), keys on every seventh row, an
inbox row on ≈1 in 13 live or failed rows, and one instance parked with 10,000 inbox
signals. VACUUM ANALYZE, then renders each page through Django's test client as a
logged-in superuser (one warm-up, then --runs timed renders: median and min–max), and
records EXPLAIN (ANALYZE, BUFFERS) of every statement each page ran on the
gen_durable tables (of the largest size). Writes bench/results/admin.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import psycopg

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "example_project"))

import harness  # noqa: E402

ROWS = """
INSERT INTO gen_durable (fsm, step, status, queue, priority, eligible_at, state, result, last_error,
                         locked_by, lease_expires_at, correlation_key, parent_id, updated_at)
SELECT 'shop.Pipeline', 'start',
       (CASE WHEN i %% 1000 < 300 THEN 'runnable'
             WHEN i %% 1000 < 305 THEN 'executing'
             WHEN i %% 50 = 7 THEN 'failed' ELSE 'done' END)::gen_durable_status,
       'q' || (i %% 3), (i %% 3)::smallint,
       now() - make_interval(secs => (i %% 5000)),
       jsonb_build_object('n', i, 'sku', 'mug'),
       CASE WHEN i %% 1000 >= 305 AND i %% 50 <> 7 THEN jsonb_build_object('ok', true) END,
       CASE WHEN i %% 1000 >= 305 AND i %% 50 = 7 THEN 'ValueError: boom' END,
       CASE WHEN i %% 1000 BETWEEN 300 AND 304 THEN 'bench-host:q' || (i %% 3) || ':w' || (i %% 4) END,
       CASE WHEN i %% 1000 BETWEEN 300 AND 304 THEN now() + interval '60 seconds' END,
       CASE WHEN i %% 7 = 0 THEN 'k' || i END,
       CASE WHEN i %% 1000 >= 305 AND i %% 10 = 9 THEN i - (i %% 1000) + 305 END,
       now() - make_interval(secs => (i %% 86400))
FROM generate_series(%(start)s::bigint, %(total)s::bigint) AS i;
INSERT INTO gen_durable_signals (target_id, name, payload)
SELECT id, 'go', '{}'::jsonb FROM gen_durable WHERE id >= %(start)s::bigint AND id <= %(total)s::bigint AND id %% 13 = 0
  AND status <> 'done'
"""
# Once, after the first size's rows (ids past it: the next size's rows start at total + 2).
EXTRAS = """
INSERT INTO gen_durable (id, fsm, step, status, queue, awaits, correlation_key, state)
OVERRIDING SYSTEM VALUE
VALUES (%(total)s::bigint + 1, 'shop.Order', 'payment_received', 'awaiting_signal', 'orders', '{payment_confirmed}',
        'order:inbox', '{"items": [{"sku": "mug", "qty": 2}]}');
INSERT INTO gen_durable_signals (target_id, name, payload)
SELECT %(total)s::bigint + 1, 'payment_update', jsonb_build_object('seq', i)
FROM generate_series(1, 10000) AS i;
INSERT INTO gen_durable_workers (id, host, pid, queues)
SELECT 'w' || n, 'bench-host', 1000 + n, ARRAY['q0', 'q1', 'q2'] FROM generate_series(0, 3) AS n
"""
SEQUENCE = "SELECT setval(pg_get_serial_sequence('gen_durable', 'id'), (SELECT max(id) FROM gen_durable))"


def pages(cur):
    cur.execute("SELECT id FROM gen_durable WHERE correlation_key = 'order:inbox'")
    inbox = cur.fetchone()[0]
    cur.execute("SELECT parent_id FROM gen_durable WHERE parent_id IS NOT NULL ORDER BY parent_id DESC LIMIT 1")
    parent = cur.fetchone()[0]
    cur.execute("SELECT id FROM gen_durable WHERE status = 'runnable' AND correlation_key IS NOT NULL "
                "ORDER BY id DESC LIMIT 1")
    keyed = cur.fetchone()[0]
    return [
        ("instances", "/admin/gen_durable/instance/"),
        ("instances, status = runnable", "/admin/gen_durable/instance/?status=runnable"),
        ("instances, status = failed", "/admin/gen_durable/instance/?status=failed"),
        # "Show counts" (Django's facets) is off: the same statements as without it.
        ("instances, show counts", "/admin/gen_durable/instance/?_facets=True"),
        ("instances, failed, show counts", "/admin/gen_durable/instance/?status=failed&_facets=True"),
        ("instances, status = executing", "/admin/gen_durable/instance/?status=executing"),
        ("instances, queue q1 runnable", "/admin/gen_durable/instance/?queue=q1&status=runnable"),
        ("instances, machine", "/admin/gen_durable/instance/?machine=shop.Pipeline"),
        ("instances, page 100", "/admin/gen_durable/instance/?p=100"),
        ("instances, search live key", f"/admin/gen_durable/instance/?q=k{keyed}"),
        ("instances, search id", f"/admin/gen_durable/instance/?q={keyed}"),
        ("instances, children of a parent", f"/admin/gen_durable/instance/?parent={parent}"),
        ("detail, 10,000 inbox rows", f"/admin/gen_durable/instance/{inbox}/change/"),
        ("detail, parent with children", f"/admin/gen_durable/instance/{parent}/change/"),
        ("signals of that inbox", f"/admin/gen_durable/signal/?target={inbox}"),
        ("signals", "/admin/gen_durable/signal/"),
        ("cancel confirmation (1 row)", f"/admin/gen_durable/instance/act/cancel/?ids={keyed}"),
        # "all matching" confirmations: the filter and a bounded count (the paginator's)
        ("retry all matching failed, confirmation", "/admin/gen_durable/instance/act/retry/all/?status=failed"),
        ("move all matching q1, confirmation", "/admin/gen_durable/instance/act/move/all/?queue=q1"),
        ("queue overview", "/admin/gen_durable/queueoverview/"),
        (STALE, "/admin/gen_durable/queueoverview/"),
    ]


# The overview as it is when the statistics are stale or missing (no ANALYZE since a bulk
# load): its awaiting counts come from a 1,000-page sample read now.
STALE = "queue overview, statistics stale (sampled)"


class Queries:
    """connection.execute_wrapper counting every statement (sessions, auth included)."""

    def __init__(self):
        self.n = 0

    def __call__(self, execute, sql, params, many, context):
        self.n += 1
        return execute(sql, params, many, context)


class Recorder:
    """connection.execute_wrapper: keeps (sql, params) of statements on gen_durable tables."""

    def __init__(self):
        self.calls = []

    def __call__(self, execute, sql, params, many, context):
        if sql.startswith("-- no_sort") or (
                "gen_durable" in sql and "django_" not in sql and not sql.lstrip().upper().startswith("EXPLAIN")):
            self.calls.append((sql, params))
        return execute(sql, params, many, context)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="300000,1000000", help="table sizes, comma-separated, ascending")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=3.0, help="statement_timeout of every request, seconds")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.rows.split(",")]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes), "--rows: ascending sizes"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")
    command = "bench/.venv/bin/python bench/admin_pages.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = [f"# Admin pages on a {sizes[-1]:,}-row table", ""]
    with harness.scratch_database("admin") as url:
        os.environ["DATABASE_URL"] = url
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        import gen_durable.admin.overview as overview
        from gen_durable import sql as sql_module

        # Every statement of every request under the timeout (the acceptance: "Show counts"
        # answers within 3 s at 300,000 rows): a statement past it fails the page.
        connection.settings_dict.setdefault("OPTIONS", {})["options"] = (
            f"-c statement_timeout={int(a.timeout * 1000)}")
        call_command("migrate", verbosity=0)
        with connection.cursor() as cur:
            cur.execute("SHOW statement_timeout")
            timeout = cur.fetchone()[0]
        env = harness.environment()
        load = os.getloadavg()[0]
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        out += [f"`{command.strip()}` on {started}: a stock PostgreSQL {env.get('postgres', '')} cluster "
                f"(`bench/server`: initdb defaults, autovacuum on, shared_buffers {env.get('shared_buffers')}, "
                f"fsync {env.get('fsync')}), Django {env['packages'].get('Django')}, {env.get('cpus')} CPUs "
                f"shared with other work (other engineers' tests and benchmarks ran on the machine meanwhile; "
                f"load average {load:.1f} at the start). Every request ran under "
                f"`statement_timeout = {a.timeout:g} s` (the session's `SHOW statement_timeout`: {timeout}); a statement "
                "past it would have failed its page. *Queries*: every statement of the request (session, user, "
                "the paginator's EXPLAIN, the overview's set_config); *on gen_durable tables*: those reading the "
                "engine's tables (EXPLAIN excluded), whose plans are below. Django's \"Show counts\" "
                "(`?_facets=True`) is off for these lists (`show_facets = NEVER`): its rows run the statements of "
                "the plain list, well inside the timeout at 300,000 and 1,000,000 rows.", ""]
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        client = Client()
        client.force_login(user)
        previous = 0
        plans = []
        for size in sizes:
            t = time.perf_counter()
            with psycopg.connect(url, autocommit=True) as conn:
                with conn.cursor() as cur:
                    for statement in ROWS.strip().split(";\n"):
                        cur.execute(statement, {"start": previous + (1 if previous == 0 else 2), "total": size})
                    if previous == 0:
                        for statement in EXTRAS.strip().split(";\n"):
                            cur.execute(statement, {"total": size})
                    cur.execute(SEQUENCE)
                conn.execute("VACUUM ANALYZE gen_durable")
                conn.execute("VACUUM ANALYZE gen_durable_signals")
                counts = dict(conn.execute("SELECT status::text, count(*) FROM gen_durable GROUP BY 1").fetchall())
                signals = conn.execute("SELECT count(*) FROM gen_durable_signals").fetchone()[0]
                with conn.cursor() as cur:
                    page_list = pages(cur)
            seeded = time.perf_counter() - t
            previous = size
            total = sum(counts.values())
            out += [f"## {total:,} rows", "",
                    f"Seeded (or grown to this size) in {seeded:.0f} s: "
                    + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))
                    + f"; {signals:,} inbox rows (10,000 on one instance). VACUUM ANALYZE, then each page rendered "
                    f"once to warm up and {a.runs} times timed by Django's test client (the whole request: "
                    "middleware, session, queries, template).", "",
                    "| Page | queries | on gen_durable tables | median ms | min–max ms |",
                    "|---|---:|---:|---:|---:|"]
            for title, path in page_list:
                real = overview.statistics
                if title == STALE:
                    overview.statistics = lambda using=None: {**real(using), "fresh": False}
                try:
                    response = client.get(path)
                    assert response.status_code == 200, (path, response.status_code)
                    times = []
                    for _ in range(a.runs):
                        t = time.perf_counter()
                        response = client.get(path)
                        times.append((time.perf_counter() - t) * 1000)
                        assert response.status_code == 200
                    rec, every = Recorder(), Queries()
                    with connection.execute_wrapper(every), connection.execute_wrapper(rec):
                        client.get(path)
                finally:
                    overview.statistics = real
                med = statistics.median(times)
                gd_calls = [c for c in rec.calls if not c[0].startswith("-- no_sort")]
                out.append(f"| {title} (`{path}`) | {every.n} | {len(gd_calls)} | {med:.1f} | "
                           f"{min(times):.1f}–{max(times):.1f} |")
                print(f"{total:>9,} {title:45s} median {med:7.1f} ms  min {min(times):.1f}  max {max(times):.1f}  "
                      f"queries {every.n} / {len(gd_calls)}")
                if size == sizes[-1]:
                    plans.append((title, path, rec.calls))
            out.append("")
        out += ["Budget: each page < 300 ms median; every statement < the statement_timeout.", "",
                f"## Plans at {sizes[-1]:,} rows", ""]
        from django.db import transaction

        with connection.cursor() as cur:
            for title, path, calls in plans:
                out += [f"### {title} (`{path}`)", ""]
                no_sort = False
                for sql, params in calls:
                    if sql.startswith("-- no_sort"):
                        no_sort = True  # as the page runs the next statement: sorts off, in a savepoint
                        continue
                    with transaction.atomic():
                        if no_sort:
                            cur.execute(sql_module.NO_SORT)
                        cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                        lines = [r[0] for r in cur.fetchall()]
                        transaction.set_rollback(True)
                    if no_sort:
                        lines.insert(0, "(after sql/no_sort.sql: sorts off for this statement)")
                        no_sort = False
                    first = " ".join(sql.split())
                    out += ["```", first[:400] + (" …" if len(first) > 400 else ""), "", *lines, "```", ""]
        connection.close()
    (BENCH / "results" / "admin.md").write_text("\n".join(out) + "\n")
    print("wrote bench/results/admin.md")


if __name__ == "__main__":
    main()
