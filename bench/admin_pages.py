"""Admin pages and the queue overview on a 1,000,000-row table: render time and plans.

    .venv/bin/python bench/admin_pages.py [--rows 1000000] [--runs 7]

Seeds a scratch database (bench_admin) with ≈30 % runnable rows over 3 queues and 3
priorities, 0.5 % executing, the rest terminal (2 % of those failed, every tenth a
child; finished over the last 24 h, the GC retention), keys on every seventh row, an
inbox row on ≈1 in 13 live or failed rows, and one instance parked with 10,000 inbox
signals. VACUUM ANALYZE, then renders each page through Django's test client as a
logged-in superuser (one warm-up, then --runs timed renders: median and min–max), and
records EXPLAIN (ANALYZE, BUFFERS) of every statement each page ran on the
gen_durable tables. Writes bench/results/admin.md.
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

SEED = """
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
FROM generate_series(1, %(total)s) AS i;
INSERT INTO gen_durable_signals (target_id, name, payload)
SELECT id, 'go', '{}'::jsonb FROM gen_durable WHERE id %% 13 = 0 AND status <> 'done';
INSERT INTO gen_durable (fsm, step, status, queue, awaits, correlation_key, state)
VALUES ('shop.Order', 'payment_received', 'awaiting_signal', 'orders', '{payment_confirmed}', 'order:inbox',
        '{"items": [{"sku": "mug", "qty": 2}]}');
INSERT INTO gen_durable_signals (target_id, name, payload)
SELECT currval(pg_get_serial_sequence('gen_durable', 'id')), 'payment_update', jsonb_build_object('seq', i)
FROM generate_series(1, 10000) AS i;
INSERT INTO gen_durable_workers (id, host, pid, queues)
SELECT 'w' || n, 'bench-host', 1000 + n, ARRAY['q0', 'q1', 'q2'] FROM generate_series(0, 3) AS n
"""


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
        ("queue overview", "/admin/gen_durable/queueoverview/"),
    ]


class Recorder:
    """connection.execute_wrapper: keeps (sql, params) of statements on gen_durable tables."""

    def __init__(self):
        self.calls = []

    def __call__(self, execute, sql, params, many, context):
        if "gen_durable" in sql and "django_" not in sql and not sql.lstrip().upper().startswith("EXPLAIN"):
            self.calls.append((sql, params))
        return execute(sql, params, many, context)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost")
    out = ["# Admin pages on a 1,000,000-row table", ""]
    with harness.scratch_database("admin") as url:
        os.environ["DATABASE_URL"] = url
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client

        call_command("migrate", verbosity=0)
        t = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            with conn.cursor() as cur:
                for statement in SEED.strip().split(";\n"):
                    cur.execute(statement, {"total": a.rows})
            conn.execute("VACUUM ANALYZE gen_durable")
            conn.execute("VACUUM ANALYZE gen_durable_signals")
            counts = dict(conn.execute("SELECT status::text, count(*) FROM gen_durable GROUP BY 1").fetchall())
            signals = conn.execute("SELECT count(*) FROM gen_durable_signals").fetchone()[0]
            with conn.cursor() as cur:
                page_list = pages(cur)
        seeded = time.perf_counter() - t
        env = harness.environment()
        load = os.getloadavg()[0]
        out += [f"Generated by `bench/admin_pages.py` ({env.get('cpus')} CPUs shared with other work, load average "
                f"{load:.1f} at the start; Postgres {env.get('postgres', '')}, Django {env['packages'].get('Django')}); "
                f"seeded in {seeded:.0f} s: " + ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items()))
                + f"; {signals:,} inbox rows (10,000 on one instance). VACUUM ANALYZE, then each page rendered "
                f"once to warm up and {a.runs} times timed by Django's test client (the whole request: "
                "middleware, session, queries, template).", "",
                "| Page | median ms | min–max ms | statements on gen_durable tables |", "|---|---:|---:|---:|"]
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        client = Client()
        client.force_login(user)
        plans = []
        for title, path in page_list:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)
            times = []
            for _ in range(a.runs):
                t = time.perf_counter()
                response = client.get(path)
                times.append((time.perf_counter() - t) * 1000)
                assert response.status_code == 200
            rec = Recorder()
            with connection.execute_wrapper(rec):
                client.get(path)
            med = statistics.median(times)
            out.append(f"| {title} (`{path}`) | {med:.1f} | {min(times):.1f}–{max(times):.1f} | {len(rec.calls)} |")
            print(f"{title:40s} median {med:7.1f} ms  min {min(times):.1f}  max {max(times):.1f}  statements {len(rec.calls)}")
            plans.append((title, path, rec.calls))
        out += ["", "Budget: each page < 300 ms median.", "", "## Plans", ""]
        with connection.cursor() as cur:
            for title, path, calls in plans:
                out += [f"### {title} (`{path}`)", ""]
                for sql, params in calls:
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                    lines = [r[0] for r in cur.fetchall()]
                    first = " ".join(sql.split())
                    out += ["```", first[:400] + (" …" if len(first) > 400 else ""), "", *lines, "```", ""]
        connection.close()
    (BENCH / "results" / "admin.md").write_text("\n".join(out) + "\n")
    print("wrote bench/results/admin.md")


if __name__ == "__main__":
    main()
