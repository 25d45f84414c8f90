"""Interleaved A/B drains of two checkouts' engines: spawn → first done, total, drain, worker CPU.

    bench/.venv/bin/python bench/ab_drain.py ROUNDS NAME=CONCURRENCY|ENGINE_JSON[|RUNDURABLE ARGS[|PYTHONPATH]] ...

Each round runs every configuration once, in order, each on a fresh scratch database
(bench_ab_drain on BENCH_DATABASE_URL): pre-fill N no-op jobs (ENGINE_JSON's "_machine" and
"_n" choose another machine of the example project and count), settle, time one
`manage.py rundurable --burst` (RUNDURABLE ARGS default `--child=0`; e.g. `--processes 2`),
read first and last completion from the database's clock. PYTHONPATH lets one
configuration run another checkout's engine: a directory whose sitecustomize.py drops the
editable install's finder and puts that checkout first on sys.path (bench/results/profile/
startup.md, "Before / after"). Prints each run and the medians. N: env N (default 20,000).
"""
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psycopg  # noqa: E402

import gd_workloads as g  # noqa: E402
import harness  # noqa: E402

SERVER = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:55442/postgres")
URL = SERVER.rsplit("/", 1)[0] + "/bench_ab_drain"
rounds = int(sys.argv[1])
cfgs = []
for a in sys.argv[2:]:
    name, rest = a.split("=", 1)
    conc, eng, *more = rest.split("|")
    cfgs.append((name, int(conc), json.loads(eng), more[0].split() if more and more[0] else ["--child=0"],
                 more[1] if len(more) > 1 else None))
N = int(os.environ.get("N", 20000))
res = {c[0]: [] for c in cfgs}
for r in range(rounds):
    for name, conc, eng, args, pp in cfgs:
        with psycopg.connect(SERVER, autocommit=True) as c:
            c.execute("DROP DATABASE IF EXISTS bench_ab_drain")
            c.execute("CREATE DATABASE bench_ab_drain")
        g._manage(URL, "migrate", "-v0")
        eng = dict(eng)
        machine, n_jobs = eng.pop("_machine", "noop"), eng.pop("_n", N)
        g._shell(URL, g.FILL.format(machine=machine, n=n_jobs))
        harness.settle(URL)
        eng.setdefault("QUEUES", {"default": conc})
        env = g._env(URL, eng)
        if pp:
            env["PYTHONPATH"] = pp
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.time()
        subprocess.run([g.PY, "manage.py", "rundurable", "--burst", "--queue", f"default={conc}", "--no-gc",
                        "--no-reaper", "-v0", *args], cwd=g.PROJECT, env=env, check=True)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        with psycopg.connect(URL) as c:
            f, last = c.execute("SELECT extract(epoch FROM min(updated_at)), extract(epoch FROM max(updated_at)) "
                                "FROM gen_durable WHERE status = 'done'").fetchone()
        cpu = ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime
        sys_cpu = ru1.ru_stime - ru0.ru_stime
        switches = (ru1.ru_nvcsw + ru1.ru_nivcsw) - (ru0.ru_nvcsw + ru0.ru_nivcsw)
        row = dict(start=float(f) - t, total=float(last) - t, drain=float(last) - float(f), cpu=cpu, n=n_jobs,
                   sys=sys_cpu, switches=switches)
        res[name].append(row)
        print(f"r{r} {name:12s} first {row['start'] * 1000:5.0f} ms  total {row['total'] * 1000:5.0f} ms  "
              f"drain {row['drain'] * 1000:5.0f} ms  ({row['n'] / row['drain']:,.0f}/s)  cpu {cpu:.2f}s (sys {sys_cpu:.2f}s, {switches:,} context switches)  "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
print("medians:")
for name, rows in res.items():
    def m(k, rows=rows):
        return statistics.median(x[k] for x in rows)
    n = rows[0]["n"]
    print(f"  {name:12s} first {m('start') * 1000:.0f} ms, total {m('total') * 1000:.0f} ms ({n / m('total'):,.0f}/s), "
          f"drain {m('drain') * 1000:.0f} ms ({n / m('drain'):,.0f}/s), cpu {m('cpu'):.2f}s")
