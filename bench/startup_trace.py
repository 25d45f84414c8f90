"""A worker's start-up as a timeline: spawn → Django set-up → checks → first pick → first flush.

    bench/.venv/bin/python bench/startup_trace.py [--n 20000] [--concurrency 10] [--engine JSON] [-- RUNDURABLE ARGS]

Pre-fills N no-op jobs in a scratch database (bench_startup_trace) on BENCH_DATABASE_URL,
then runs one `manage.py rundurable --burst` of the example project under this file's
tracer (the same interpreter, ``--trace`` below): every phase's start and end in ms since
the spawn, and the first few picks and flushes with the rows they carried. Extra
arguments after ``--`` go to rundurable (default ``--child=0``, as the bench's one-process
rows run it). Children of ``--processes N`` are not traced (they are new interpreters):
read their first completion from the last line (the database's clock).
bench/results/profile/startup.md has what it showed.
"""

from __future__ import annotations

import os
import runpy
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "--trace":
    # The tracer, inside the worker's interpreter: GD_T0 is the spawn time (epoch seconds).
    T0 = float(os.environ["GD_T0"])
    marks: list = []

    def mark(what):
        marks.append(((time.time() - T0) * 1000, what))

    mark("interpreter up")
    import atexit

    atexit.register(lambda: sys.stderr.write("".join(f"  {t:8.1f} ms  {w}\n" for t, w in marks)))

    def wrap(obj, name, label, counts=(1,)):
        fn, seen = getattr(obj, name), [0, 0]

        def traced(*a, **k):
            seen[0] += 1
            n = seen[0]
            if n in counts:
                mark(f"> {label}" + (f" #{n}" if counts != (1,) else ""))
            out = fn(*a, **k)
            try:
                seen[1] += len(out) if isinstance(out, list) else len(a[0])
            except Exception:
                pass
            if n in counts:
                mark(f"< {label}" + (f" #{n} (rows so far {seen[1]})" if counts != (1,) else ""))
            return out

        setattr(obj, name, traced)

    import django
    from django.core.management import base

    wrap(base.BaseCommand, "check", "system checks")
    wrap(base.BaseCommand, "check_migrations", "Django's migration check")
    real_setup = django.setup

    def setup(*a, **k):
        mark("> django.setup()")
        real_setup(*a, **k)
        mark("< django.setup()")
        from gen_durable.management.commands import rundurable as r
        from gen_durable.worker import flusher, scheduler, supervisor

        wrap(r, "wait_for_database", "first connection (wait_for_database)")
        wrap(r.Command, "_require_migrations", "gen_durable's migration check")
        wrap(r.Command, "_check_connection_budget", "connection budget (E031)")
        wrap(supervisor.Supervisor, "start", "Supervisor.start (roles)")
        wrap(supervisor.Supervisor, "_warn_of_stranded_rows", "stranded-row warnings (W004/W006)")
        wrap(supervisor.Supervisor, "stop", "Supervisor.stop")
        wrap(scheduler, "pick", "pick", counts=(1, 2, 3, 10, 20, 40))
        wrap(flusher, "flush", "flush", counts=(1, 2, 3, 10, 20, 40))

    django.setup = setup
    sys.argv = ["manage.py"] + sys.argv[2:]
    sys.path.insert(0, os.getcwd())
    runpy.run_path("manage.py", run_name="__main__")
    sys.exit(0)

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psycopg  # noqa: E402

import gd_workloads as g  # noqa: E402
import harness  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--engine", default=None, help="GEN_DURABLE overrides (JSON); default: none")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"] or ["--child=0"]
    server = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:55442/postgres")
    url = server.rsplit("/", 1)[0] + "/bench_startup_trace"
    with psycopg.connect(server, autocommit=True) as c:
        c.execute("DROP DATABASE IF EXISTS bench_startup_trace")
        c.execute("CREATE DATABASE bench_startup_trace")
    g._manage(url, "migrate", "-v0")
    g._shell(url, g.FILL.format(machine="noop", n=args.n))
    harness.settle(url)
    engine = json.loads(args.engine) if args.engine else {"QUEUES": {"default": args.concurrency}}
    env = g._env(url, engine)
    t0 = time.time()
    env["GD_T0"] = repr(t0)
    subprocess.run([g.PY, os.path.abspath(__file__), "--trace", "rundurable", "--burst", "--queue",
                    f"default={args.concurrency}", "--no-gc", "--no-reaper", "-v0", *extra], cwd=g.PROJECT, env=env)
    with psycopg.connect(url) as c:
        first, last, n = c.execute("SELECT extract(epoch FROM min(updated_at)), extract(epoch FROM max(updated_at)), "
                                   "count(*) FROM gen_durable WHERE status = 'done'").fetchone()
    print(f"first done +{(float(first) - t0) * 1000:.0f} ms, last done +{(float(last) - t0) * 1000:.0f} ms, "
          f"{n:,} done (the database's clock)")


if __name__ == "__main__":
    main()
