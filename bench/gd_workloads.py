"""gen_durable's own benchmark workloads (docs/design.md#performance-contract), run through the example project.

Each workload has the harness contract ``fn(db_url) -> dict`` (see harness.py): it
migrates the example project (example_project/) against the scratch database, pre-fills
through the public API, and times the real thing — `manage.py rundurable` worker
processes — the same way the alternatives are timed (clock starts before the first
worker is spawned, stops when a poll sees every job done; see
harness.drain_with_processes).

Knobs of the drains: queue concurrency per process, PREFETCH and MIN_DEMAND (feeder),
FLUSH.MAX_BATCH; they are passed as GEN_DURABLE_JSON to the example settings.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import psycopg

import harness

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "example_project"
PY = sys.executable
DONE_SQL = "SELECT count(*) FROM gen_durable WHERE status = 'done'"


def _env(db_url: str, engine: dict | None = None) -> dict:
    env = dict(os.environ)
    env["DATABASE_URL"] = db_url
    engine = dict(engine or {})
    if "QUEUES" in engine:
        # The example's TASKS backend names "email" (E061 refuses a TASKS queue that
        # GEN_DURABLE['QUEUES'] lacks); `rundurable --queue default=N` still serves
        # only "default".
        engine["QUEUES"] = {"orders": 8, "email": 4, **engine["QUEUES"]}
    env["GEN_DURABLE_JSON"] = json.dumps(engine)
    env["GEN_DURABLE_POLL_INTERVAL"] = "0.05"
    env["GEN_DURABLE_MAX_POLL_INTERVAL"] = "0.5"
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def _manage(db_url: str, *args: str, engine: dict | None = None, timeout: float = 300) -> str:
    out = subprocess.run([PY, "manage.py", *args], cwd=PROJECT, env=_env(db_url, engine),
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise harness.BenchError(f"manage.py {' '.join(args)} failed: {out.stderr[-2000:]}")
    return out.stdout


def _shell(db_url: str, code: str, engine: dict | None = None) -> dict:
    """Run `code` in the example project (Django set up); it must print one JSON line."""
    out = _manage(db_url, "shell", "-c", code, engine=engine)
    return json.loads(out.strip().splitlines()[-1])


FILL = """
import json, time, gen_durable as gd
from shop.durable import {machine} as M
t = time.perf_counter()
for i in range(0, {n}, 10000):
    gd.insert_all([gd.Spec(M, state={{"n": i + j}}) for j in range(min(10000, {n} - i))])
print(json.dumps({{"enqueue_s": time.perf_counter() - t}}))
"""


SIZES_SQL = """SELECT pg_total_relation_size('gen_durable'), pg_relation_size('gen_durable'),
       pg_indexes_size('gen_durable'), n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE relid = 'gen_durable'::regclass"""
SIZES_COLS = ("total_bytes", "heap_bytes", "indexes_bytes", "n_live_tup", "n_dead_tup",
              "autovacuum_count", "autoanalyze_count")


def _startup_note(res: dict) -> str:
    if res.get("startup") == "outside":
        return (f"start-up outside the clock (gate: workers ready after {res['startup_s']:.2f}s, "
                "clock starts when the gate opens)")
    return "clock includes worker start-up"


def drain(n: int, concurrency: int, processes: int, *, machine="noop", steps_per=1, prefetch=None,
          min_demand=None, max_batch=None, max_delay=None, supervisor=False, producer: dict | None = None,
          speed_probe=False, history=True):
    """A drain of ``n`` pre-filled jobs by ``processes`` `rundurable --burst` workers.

    supervisor: one `rundurable --processes N` (its own supervisor forks the children)
    instead of N separately spawned children. producer: {"prefill", "backlog", "batch"}
    — pre-fill only ``prefill`` rows and insert the rest from a producer process during
    the drain, topping the runnable backlog up to ``backlog`` in insert_all batches of
    ``batch`` (continuous inserts); table/index sizes are sampled at every quarter.
    history: False turns the per-instance timeline off (HISTORY ENABLED False), the
    control of its cost (bench/results/history_cost.md).
    """
    knobs = {"QUEUES": {"default": concurrency}}
    if not history:
        knobs["HISTORY"] = {"ENABLED": False}
    if max_batch is not None or max_delay is not None:  # else the defaults (FLUSH left out)
        knobs["FLUSH"] = {"MAX_BATCH": 500 if max_batch is None else max_batch,
                          "MAX_DELAY": 0.005 if max_delay is None else max_delay}
    if prefetch is not None:
        knobs["PREFETCH"] = prefetch
    if min_demand is not None:
        knobs["MIN_DEMAND"] = min_demand

    def workload(db_url: str) -> dict:
        _manage(db_url, "migrate", "-v0")
        fill = _shell(db_url, FILL.format(machine=machine, n=producer["prefill"] if producer else n))
        harness.settle(db_url)
        cmd = [PY, "manage.py", "rundurable", "--queue", f"default={concurrency}", "--no-gc", "--no-reaper", "-v0"]
        if not producer:
            cmd.insert(3, "--burst")  # with a producer, the queue may run dry for a moment
        if supervisor:
            cmds = [cmd + ["--processes", str(processes)]]
        else:
            cmds = [cmd + [f"--child={i}"] for i in range(processes)]
        env_knobs = dict(knobs)
        if harness.STARTUP == "outside":
            # A first pick waits at the start-up gate (a table lock) for a second or two;
            # LOCK_TIMEOUT (5 s) must not cut it off. No drain here waits on a row lock.
            env_knobs["LOCK_TIMEOUT"] = 30
        extra = []
        if producer:
            extra = [[PY, "manage.py", "shell", "-c", PRODUCER.format(machine=machine, total=n - producer["prefill"],
                                                                       backlog=producer["backlog"],
                                                                       batch=producer["batch"])]]
        q = n // 4
        res = harness.drain_with_processes(cmds, done_url=db_url, done_sql=DONE_SQL, expected=n,
                                           env=_env(db_url, env_knobs), cwd=PROJECT, timeout=600,
                                           gate_table="gen_durable", gate_waiters=processes,
                                           marks=[0, q, 2 * q, 3 * q, n], mark_sql=SIZES_SQL, extra_procs=extra,
                                           speed_probe=speed_probe)
        steps = n * steps_per
        sample = harness.rate_sample(steps, res["elapsed_s"], unit="steps/s" if steps_per > 1 else "jobs/s")
        sizes = [dict(zip(("mark", "t"), (m["mark"], round(m["t"], 2)))) | dict(zip(SIZES_COLS, m["row"] or ()))
                 for m in res["marks"]]
        return sample | {
                "enqueue_s": fill["enqueue_s"], "enqueue_rate": (producer["prefill"] if producer else n) / fill["enqueue_s"],
                "knobs": {**knobs, "processes": processes, "machine": machine,
                          **({"supervisor": "rundurable --processes N"} if supervisor else {}),
                          **({"producer": producer} if producer else {})},
                "workers_cpu_s": res.get("workers_cpu_s"), "startup_s": res.get("startup_s"),
                "sizes": sizes, **({"probe": res["probe"]} if res.get("probe") else {}),
                "note": _startup_note(res)}

    return workload


PRODUCER = """
import time, gen_durable as gd
from django.db import connection
from shop.durable import {machine} as M
left = {total}
while left:
    with connection.cursor() as c:
        c.execute("SELECT count(*) FROM gen_durable WHERE status = 'runnable'")
        backlog = c.fetchone()[0]
    if backlog >= {backlog}:
        time.sleep(0.02)
        continue
    k = min({batch}, left, {backlog} - backlog)
    gd.insert_all([gd.Spec(M, state={{"p": left - j}}) for j in range(k)])
    left -= k
"""


def insert_all_rate(db_url: str) -> dict:
    _manage(db_url, "migrate", "-v0")
    r = _shell(db_url, """
import json, time, gen_durable as gd
from shop.durable import noop
from django.db import connection
specs = [gd.Spec(noop, state={}) for _ in range(100000)]
connection.ensure_connection()  # connected before the clock, as the raw ceiling's client is
t = time.perf_counter(); ids = gd.insert_all(specs); dt = time.perf_counter() - t
assert len(ids) == 100000 and None not in ids
print(json.dumps({"s": dt}))""")
    return harness.rate_sample(100000, r["s"], unit="rows/s") | {
            "note": "one insert_all call of 100,000 specs (validation + one statement); "
                    "connection opened before the clock"}


def insert_single_rate(db_url: str) -> dict:
    _manage(db_url, "migrate", "-v0")
    r = _shell(db_url, """
import json, time, gen_durable as gd
from shop.durable import noop
t = time.perf_counter()
for _ in range(3000): gd.insert(noop, state={})
print(json.dumps({"s": time.perf_counter() - t}))""")
    return harness.rate_sample(3000, r["s"], unit="rows/s") | {
            "note": "3,000 sequential gd.insert calls, one connection, autocommit"}


def signal_rate(db_url: str) -> dict:
    _manage(db_url, "migrate", "-v0")
    r = _shell(db_url, """
import json, time, gen_durable as gd
from gen_durable.testing import drain
from shop.durable import Waiter
ids = gd.insert_all([gd.Spec(Waiter, correlation_key=f"w{i}") for i in range(3000)])
drain(queue="default", max_steps=10000)
t = time.perf_counter()
for i in range(3000): gd.signal(f"w{i}", "go", {"i": i})
print(json.dumps({"s": time.perf_counter() - t}))""")
    return harness.rate_sample(3000, r["s"], unit="signals/s") | {
            "note": "3,000 sequential gd.signal calls by correlation key, each waking a parked instance"}


PRODUCE = """
import json, threading, time, gen_durable as gd
from django.db import connections
from shop.durable import noop
N, THREADS, MODE = {n}, 8, {mode!r}
producer = gd.Producer(max_batch=1000, max_delay=0.1, max_buffer=20000) if MODE == "producer" else None
returned = []

def work(t):
    for i in range(N // THREADS):
        if producer is None:
            gd.insert(noop, state={{"t": t, "i": i}})
        else:
            producer.insert(noop, state={{"t": t, "i": i}})
    returned.append(time.perf_counter())
    connections.close_all()

threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
t0 = time.perf_counter()
for t in threads: t.start()
for t in threads: t.join()
calls_s = max(returned) - t0
if producer is not None:
    assert producer.flush(300) and producer.inserted == N
durable_s = time.perf_counter() - t0
with connections["default"].cursor() as cur:
    cur.execute("SELECT count(*) FROM gen_durable")
    assert cur.fetchone()[0] == N
print(json.dumps({{"calls_s": calls_s, "durable_s": durable_s}}))
"""


def produce_rate(mode: str, n: int = 40_000):
    """Enqueue rate from 8 threads: `gd.Producer` (buffered) or plain `gd.insert` (mode)."""

    def workload(db_url: str) -> dict:
        _manage(db_url, "migrate", "-v0")
        r = _shell(db_url, PRODUCE.format(n=n, mode=mode))
        return harness.rate_sample(n, r["durable_s"], unit="rows/s") | {
            "calls_rate": n / r["calls_s"],
            "note": (f"{n:,} rows from 8 threads until all are committed; the calls themselves "
                     f"returned at {n / r['calls_s']:,.0f} rows/s"
                     + (" (Producer: max_batch 1000, max_delay 0.1 s)" if mode == "producer"
                        else " (one autocommit INSERT per call, a connection per thread)"))}

    return workload


def _lone_latency(db_url: str, target: str, state: str, until: str) -> dict:
    """Insert one `shop.durable.<target>` at a time (100 of them) into an idle worker (poll
    interval 5 s: only NOTIFY wakes it fast); insert→done on the database clock."""
    _manage(db_url, "migrate", "-v0")
    env = _env(db_url, {"QUEUES": {"default": 4}, "POLL_INTERVAL": 5, "MAX_POLL_INTERVAL": 5})
    env["GEN_DURABLE_POLL_INTERVAL"] = env["GEN_DURABLE_MAX_POLL_INTERVAL"] = "5"
    proc = subprocess.Popen([PY, "manage.py", "rundurable", "--queue", "default=4", "--no-gc", "-v0"],
                            cwd=PROJECT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        r = _shell(db_url, f"""
import json, time, gen_durable as gd
from django.db import connection
from shop.durable import {target}
time.sleep(3)   # the worker is up and idle
lat = []
for i in range(100):
    id_ = gd.insert({target}, state={state})
    res = gd.await_result(id_, 10, until="{until}")
    assert res.status == "done", res
    with connection.cursor() as c:
        c.execute("SELECT extract(epoch FROM updated_at - inserted_at) FROM gen_durable WHERE id = %s", [id_])
        lat.append(float(c.fetchone()[0]))
    time.sleep(0.05)
print(json.dumps({{"lat": lat}}))""")
    finally:
        proc.terminate()
        proc.wait(15)
    lat = sorted(r["lat"])
    p50 = statistics.median(lat)
    p99 = lat[int(len(lat) * 0.99) - 1]
    return {"rate": p50 * 1000, "unit": "ms p50", "n": len(lat), "elapsed_s": sum(lat), "p99_ms": p99 * 1000}


def chain_latency(machine: str):
    """A lone 5-step `shop.<machine>` at a time into an idle worker: insert→done of the whole
    chain. With and without inline continuation (run both: --only
    gd_chain_latency_5step,gd_chain_latency_5step_inline): what inline buys a lone chain is
    the four re-picks (NOTIFY, wake, claim) between its steps."""

    def workload(db_url: str) -> dict:
        out = _lone_latency(db_url, machine, '{"n": 0}', "terminal")
        out["note"] = (f"a lone 5-step {machine}: insert→done on the database clock, idle worker; "
                       f"p99 {out['p99_ms']:.1f} ms")
        return out

    return workload


def idle_latency(db_url: str) -> dict:
    """Insert one job at a time into an idle worker; insert→done on the database clock."""
    out = _lone_latency(db_url, "noop", "{}", "settled")
    out["note"] = ("insert→done on the database clock, idle worker polling every 5 s (NOTIFY wake-up); "
                   f"p99 {out['p99_ms']:.1f} ms")
    return out


def sustained(n=200_000, concurrency=50, processes=2, producer=None, prefetch=None, min_demand=None, max_batch=100,
              history=True):
    """Drain n jobs; report the rate of each quarter (by completion order) and the
    table/index sizes when each quarter was done."""
    inner = drain(n, concurrency, processes, prefetch=concurrency if prefetch is None else prefetch,
                  min_demand=concurrency // 2 if min_demand is None else min_demand, max_batch=max_batch,
                  producer=producer, speed_probe=True, history=history)

    def workload(db_url: str) -> dict:
        out = inner(db_url)
        with psycopg.connect(db_url) as conn:
            stamps = [r[0] for r in conn.execute(
                "SELECT extract(epoch FROM updated_at) FROM gen_durable ORDER BY updated_at")]
        q = len(stamps) // 4
        rates, bounds = [], []
        for i in range(4):
            part = stamps[i * q:(i + 1) * q]
            rates.append(len(part) / max(float(part[-1]) - float(part[0]), 1e-6))
            bounds.append((float(part[0]), float(part[-1])))
        out["quarter_rates"] = [round(r) for r in rates]
        out["last_vs_first"] = round(rates[3] / rates[0], 3)
        # The host's speed in each quarter (harness.SpeedProbe) over the first's: a quarter
        # the host ran 1.3× slower in is read at 1.3× its rate (bench/results/history.md, round 10).
        factors = harness.speed_factors(out.pop("probe", None), bounds)
        out["host_speed"] = [None if f is None else round(1 / f, 3) for f in factors]
        if None not in factors:
            adjusted = [r * f for r, f in zip(rates, factors)]
            out["last_vs_first_at_host_speed"] = round(adjusted[3] / adjusted[0], 3)
        mb = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
        sz = "; ".join(f"{m['mark']:,}: {mb(m['heap_bytes'])}+{mb(m['indexes_bytes'])} MB, dead {m['n_dead_tup']:,},"
                       f" av {m['autovacuum_count']}" for m in out["sizes"] if m.get("heap_bytes") is not None)
        speed = ("" if "last_vs_first_at_host_speed" not in out else
                 f"; host speed per quarter {', '.join(f'{x:.2f}' for x in out['host_speed'])}, "
                 f"last/first at the first quarter's host speed = {out['last_vs_first_at_host_speed']:.2f}")
        out["note"] = (f"quarters (jobs/s): {', '.join(f'{r:,.0f}' for r in rates)}; "
                       f"last/first = {rates[3] / rates[0]:.2f}{speed}; {out['note']}; sizes at done = "
                       f"heap+indexes: {sz}")
        return out

    return workload


WORKLOADS = {
    # What a user gets without a knob: QUEUES {"default": 10}, the adaptive claim-ahead
    # (PREFETCH / MIN_DEMAND None), FLUSH {"MAX_BATCH": 100, "MAX_DELAY": 0.005}.
    "gd_drain_defaults_p1": drain(20_000, 10, 1),
    # The same with the per-instance timeline off: its cost (bench/results/history_cost.md).
    "gd_drain_defaults_p1_nohistory": drain(20_000, 10, 1, history=False),
    "gd_drain_c10_p1": drain(20_000, 10, 1),
    # The same with the claim-ahead of the old defaults (PREFETCH 0, MIN_DEMAND 1): the cliff.
    "gd_drain_c10_p1_pf0": drain(20_000, 10, 1, prefetch=0, min_demand=1, max_batch=100),
    # The realistic rows: a job that writes one row with the ORM, one that blocks 20 ms on
    # I/O, one that awaits 20 ms; concurrency 50, one process, the other settings default
    # (the peers' rows pgqueuer_<job>_c50 / procrastinate_<job>_c50 do the same work).
    "gd_write_row_c50_p1": drain(5_000, 50, 1, machine="write_row"),
    "gd_sleep_20ms_c50_p1": drain(4_000, 50, 1, machine="sleep_20ms"),
    "gd_async_sleep_20ms_c50_p1": drain(4_000, 50, 1, machine="async_sleep_20ms"),
    # The best one-process setting of the tuning sweep (docs/performance.md, "Tuning").
    "gd_drain_tuned_p1": drain(20_000, 1, 1, prefetch=500, min_demand=100, max_batch=500),
    "gd_drain_c50_p1": drain(20_000, 50, 1, prefetch=50, min_demand=25),
    "gd_drain_c50_p2": drain(20_000, 50, 2, prefetch=50, min_demand=25),
    "gd_drain_c100_p2": drain(20_000, 100, 2, prefetch=100, min_demand=50),
    # Sub-millisecond steps: few threads (less GIL hand-off) and a deep prefetch.
    "gd_drain_c16_p1": drain(20_000, 16, 1, prefetch=200, min_demand=50),
    "gd_drain_c16_p2": drain(20_000, 16, 2, prefetch=200, min_demand=50),
    "gd_pipeline_5step_c50_p2": drain(4_000, 50, 2, machine="Pipeline", steps_per=5, prefetch=50, min_demand=25),
    # The same machine with inline continuation (run it with the line above: --only both).
    "gd_pipeline_5step_inline_c50_p2": drain(4_000, 50, 2, machine="InlinePipeline", steps_per=5,
                                             prefetch=50, min_demand=25),
    # Inline continuation with the few-thread, deep-prefetch configuration of gd_drain_c16_p2:
    # a continuation waits for its flush without holding a thread, so more claimed rows
    # (PREFETCH) keep the threads busy meanwhile.
    "gd_pipeline_5step_inline_c16_p2": drain(4_000, 16, 2, machine="InlinePipeline", steps_per=5,
                                             prefetch=200, min_demand=50),
    "gd_pipeline_5step_inline_c16_p2_nohistory": drain(4_000, 16, 2, machine="InlinePipeline", steps_per=5,
                                                       prefetch=200, min_demand=50, history=False),
    # 1,000 `async def` steps that each await 1 s, at concurrency 1,000 in one process:
    # the elapsed time (clock includes worker start-up) shows they overlap.
    "gd_async_1000x1s_c1000_p1": drain(1_000, 1000, 1, machine="AsyncPing", prefetch=0),
    "gd_insert_all_100k": insert_all_rate,
    "gd_insert_single": insert_single_rate,
    # Enqueue from 8 threads, buffered producer vs plain insert (run both: --only both).
    "gd_produce_8threads_producer": produce_rate("producer"),
    "gd_produce_8threads_insert": produce_rate("insert"),
    "gd_signal": signal_rate,
    "gd_idle_latency": idle_latency,
    "gd_chain_latency_5step": chain_latency("Pipeline"),
    "gd_chain_latency_5step_inline": chain_latency("InlinePipeline"),
    "gd_sustained_200k": sustained(),
    # The same drain named as the 200k comparison with pgqueuer_200k / raw_claim_complete_200k.
    "gd_drain_200k_c50_p2": sustained(),
    # 50k pre-filled; a producer process tops the runnable backlog up to 30k until
    # 200k were inserted, while 2 workers drain (autovacuum's server: its vacuums run).
    "gd_sustained_inserts_200k": sustained(producer={"prefill": 50_000, "backlog": 30_000, "batch": 2_000}),
    # Round 2's tuned configuration (a 200k sweep, start-up outside, one run each: 2 × 16,
    # PREFETCH 200, MIN_DEMAND 50, FLUSH.MAX_BATCH 300 ≈ 17.1k jobs/s; 2 × 16 / 500 / 200 /
    # 500 ≈ 16.3k; 2 × 32 / 300 / 100 / 300 ≈ 13.9k; the fixed 2 × 50 / 50 / 25 / 100 ≈ 12.2k):
    # few threads, a deep buffer and larger group commits.
    "gd_drain_c16_p2_fb300": drain(20_000, 16, 2, prefetch=200, min_demand=50, max_batch=300),
    "gd_drain_c4_p2_fb300": drain(20_000, 4, 2, prefetch=200, min_demand=50, max_batch=300),
    "gd_drain_c8_p2_fb300": drain(20_000, 8, 2, prefetch=200, min_demand=50, max_batch=300),
    # The 5-step inline machine in that tuned configuration (compare with the line above).
    "gd_pipeline_5step_inline_c16_p2_fb300": drain(4_000, 16, 2, machine="InlinePipeline", steps_per=5,
                                                   prefetch=200, min_demand=50, max_batch=300),
    "gd_drain_200k_c16_p2_fb300": sustained(concurrency=16, prefetch=200, min_demand=50, max_batch=300),
    # Round 4's tuned configuration (a 20k sweep, start-up outside, 3 runs each, after the
    # round's worker changes: 2 × 8 / PREFETCH 500 / MIN_DEMAND 100 / FLUSH.MAX_BATCH 500
    # ≈ 34.2k jobs/s; 2 × 4 / 500 / 100 / 500 ≈ 33.7k; 2 × 4 / 1000 / 250 / 500 ≈ 33.5k;
    # 2 × 16 / 500 / 100 / 500 ≈ 32.9k; round 3's 2 × 16 / 200 / 50 / 300 ≈ 28.8k): a buffer
    # deep enough that the feeder claims in large batches while the threads run, and
    # group commits of up to 500 outcomes.
    "gd_drain_c8_p2_pf500": drain(20_000, 8, 2, prefetch=500, min_demand=100, max_batch=500),
    "gd_drain_200k_c8_p2_pf500": sustained(concurrency=8, prefetch=500, min_demand=100, max_batch=500),
    # The same with one step thread per process: for steps that never wait (no I/O), a
    # second thread in a CPython process only adds GIL hand-offs (the 20k sweep: 2 × 1
    # ≈ 38.7k, 2 × 2 ≈ 36.8k, 2 × 8 ≈ 35.2k jobs/s; bench/results/history.md "Round 4").
    "gd_drain_c1_p2_pf500": drain(20_000, 1, 2, prefetch=500, min_demand=100, max_batch=500),
    "gd_drain_200k_c1_p2_pf500": sustained(concurrency=1, prefetch=500, min_demand=100, max_batch=500),
    # The same with the timeline off (HISTORY ENABLED False): what the timeline costs at 200k.
    "gd_drain_200k_c1_p2_pf500_nohistory": sustained(concurrency=1, prefetch=500, min_demand=100, max_batch=500,
                                                     history=False),
    "gd_pipeline_5step_inline_c1_p2_pf500": drain(4_000, 1, 2, machine="InlinePipeline", steps_per=5,
                                                  prefetch=500, min_demand=100, max_batch=500),
    # The same machine over 200,000 steps (40,000 instances), beside the 200k job drain:
    # the 20k-step run above is over in about a second and a half on a slow machine, where
    # the start and the tail weigh on it (bench/results/history.md "Round 6").
    "gd_pipeline_5step_inline_40k_c1_p2_pf500": drain(40_000, 1, 2, machine="InlinePipeline", steps_per=5,
                                                      prefetch=500, min_demand=100, max_batch=500),
    # The inline machine's best of that sweep (2 × 16 ≈ 38.3k steps/s; 2 × 8 ≈ 34.0k;
    # 2 × 4 ≈ 34.2k), with the job drain in the same configuration beside it.
    "gd_pipeline_5step_inline_c16_p2_pf500": drain(4_000, 16, 2, machine="InlinePipeline", steps_per=5,
                                                   prefetch=500, min_demand=100, max_batch=500),
    "gd_drain_c16_p2_pf500": drain(20_000, 16, 2, prefetch=500, min_demand=100, max_batch=500),
    # Multi-process scaling: one `rundurable --processes N` (its supervisor forks N).
    "gd_drain_c16_procs1": drain(20_000, 16, 1, prefetch=200, min_demand=50, supervisor=True),
    "gd_drain_c16_procs2": drain(20_000, 16, 2, prefetch=200, min_demand=50, supervisor=True),
    "gd_drain_c16_procs4": drain(20_000, 16, 4, prefetch=200, min_demand=50, supervisor=True),
    # `--processes 2` as users run it (the parent sets Django up, then forks its
    # children): the defaults, and the drains' tuned configuration over 20,000 jobs.
    "gd_drain_defaults_procs2": drain(20_000, 10, 2, supervisor=True),
    "gd_drain_c1_pf500_procs2": drain(20_000, 1, 2, prefetch=500, min_demand=100, max_batch=500, supervisor=True),
    # ... and in the drains' tuned configuration (one step thread per process, PREFETCH
    # 500, MIN_DEMAND 100, FLUSH.MAX_BATCH 500), over 200,000 jobs: on 2 cores, where
    # one process per core saturates (bench/results/history.md "Multi-process scaling").
    **{f"gd_drain_200k_c1_pf500_procs{n}": drain(200_000, 1, n, prefetch=500, min_demand=100, max_batch=500,
                                                 supervisor=True) for n in (1, 2, 4)},
}
# Drains whose clock can start inside or outside worker start-up (run_all.py --startup).
STARTUP_SENSITIVE = {name for name in WORKLOADS if name.startswith(("gd_drain", "gd_pipeline", "gd_sustained"))}
