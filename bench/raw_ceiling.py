"""Raw Postgres ceilings: what the database itself can do with no queue library on top.

Two workloads, both against a minimal jobs table:

    CREATE TABLE raw_jobs (id bigserial PRIMARY KEY, queue text, status text,
                           payload jsonb, attempts int, created_at, updated_at)
    CREATE INDEX raw_jobs_pending ON raw_jobs (id) WHERE status = 'pending'

* ``raw_claim_complete`` — the canonical claim+complete pattern. The table is
  pre-filled with N pending rows (not timed). Then C client *processes* (no GIL
  sharing) each loop, as fast as they can, over two autocommit statements:

      claim:    WITH c AS (SELECT id FROM raw_jobs WHERE status = 'pending'
                           ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)
                UPDATE raw_jobs j SET status = 'running', attempts = attempts + 1,
                       updated_at = now()
                FROM c WHERE j.id = c.id RETURNING j.id
      complete: UPDATE raw_jobs SET status = 'done', updated_at = now()
                WHERE id = ANY(%s)

  until a claim comes back empty. Rate = N / (time from the start signal until the
  last client finishes). Two round-trips and two commits per batch of 50; no job
  code runs, so this is the ceiling any Postgres queue with this claim shape can
  approach on this machine (on 2 cores the clients compete with Postgres for CPU).

  Why the index is ``(id) WHERE status = 'pending'`` and the claim has no queue
  filter: with ``(queue, id) WHERE status = 'pending'`` and ``WHERE queue = $1``,
  once the table is ANALYZEd while every row is pending (exactly what auto-analyze
  does after a bulk enqueue) the planner prefers the primary key + a filter — same
  order, same estimated cost — and every claim then re-walks all the already-done
  rows: the drain goes O(n²) and runs ~3-5x slower at 20k rows. The ceiling uses the
  shape the planner cannot get wrong.

* ``raw_insert_unnest`` — batch insert ceiling for the insert_all comparison: insert
  100,000 rows with ``INSERT ... SELECT * FROM unnest(%b::text[], %b::jsonb[])``
  (binary-format array parameters) in chunks (default 10,000 rows per statement,
  each its own autocommit transaction), one client. Rate = rows / elapsed.
  ``raw_insert_unnest_text`` is the same with psycopg's default text-format ``%s``
  parameters, which is what a ``%(name)s::text[]`` statement pays: psycopg escapes
  every element of a text array literal in Python, roughly halving the rate.

Standalone: ``bench/.venv/bin/python bench/raw_ceiling.py [--runs N] [--clients C] ...``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time

import psycopg

import harness

N_DRAIN = 20_000
N_INSERT = 100_000
CLIENTS = 4
BATCH = 50
INSERT_CHUNK = 10_000
TIMEOUT_S = 110.0

DDL = """
CREATE TABLE raw_jobs (
    id          bigserial PRIMARY KEY,
    queue       text        NOT NULL DEFAULT 'default',
    status      text        NOT NULL DEFAULT 'pending',
    payload     jsonb       NOT NULL DEFAULT '{}',
    attempts    int         NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX raw_jobs_pending ON raw_jobs (id) WHERE status = 'pending';
"""

INSERT_SQL = (
    "INSERT INTO raw_jobs (queue, payload) "
    "SELECT * FROM unnest(%b::text[], %b::jsonb[])"
)
# The same statement with psycopg's default text-format parameters (%s). Dumping a
# list of JSON strings as a *text* array literal quotes/escapes every element in
# Python (psycopg's array dumper), which costs about as much as the insert itself.
INSERT_SQL_TEXT = INSERT_SQL.replace("%b", "%s")

CLAIM_SQL = """
WITH c AS (
    SELECT id FROM raw_jobs
    WHERE status = 'pending'
    ORDER BY id
    LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE raw_jobs j
SET status = 'running', attempts = j.attempts + 1, updated_at = now()
FROM c WHERE j.id = c.id
RETURNING j.id
"""

COMPLETE_SQL = "UPDATE raw_jobs SET status = 'done', updated_at = now() WHERE id = ANY(%s)"


def _create_schema(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(DDL)


def _chunks(n: int, chunk: int) -> list[tuple[list[str], list[str]]]:
    """The parameter arrays, built before the clock starts (the ceiling times Postgres)."""
    out = []
    for lo in range(0, n, chunk):
        k = min(chunk, n - lo)
        out.append((["default"] * k, ['{"n": %d}' % (lo + i) for i in range(k)]))
    return out


def _insert(conn: psycopg.Connection, chunks: list[tuple[list[str], list[str]]],
            sql: str = INSERT_SQL) -> None:
    for params in chunks:
        conn.execute(sql, params)


def _client(url: str, batch: int, start: mp.Event, deadline_s: float, out: mp.Queue) -> None:
    claimed = 0
    err = None
    try:
        with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
            start.wait()
            t_end = time.monotonic() + deadline_s
            while time.monotonic() < t_end:
                ids = [r[0] for r in conn.execute(CLAIM_SQL, (batch,)).fetchall()]
                if not ids:
                    break
                conn.execute(COMPLETE_SQL, (ids,))
                claimed += len(ids)
    except Exception as exc:  # reported to the parent
        err = repr(exc)
    out.put((claimed, err))


def claim_complete(url: str, *, n: int = N_DRAIN, clients: int = CLIENTS, batch: int = BATCH,
                   timeout: float = TIMEOUT_S) -> dict:
    _create_schema(url)
    chunks = _chunks(n, INSERT_CHUNK)
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = time.perf_counter()
        _insert(conn, chunks)
        enqueue_s = time.perf_counter() - t0
    harness.settle(url)

    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(url, batch, start, timeout, out), daemon=True)
             for _ in range(clients)]
    for p in procs:
        p.start()
    try:
        time.sleep(0.5)  # let every client connect before the start signal
        t0 = time.perf_counter()
        start.set()
        results = [out.get(timeout=timeout + 10) for _ in procs]
        elapsed = time.perf_counter() - t0
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
    errors = [e for _, e in results if e]
    if errors:
        raise harness.BenchError(f"raw client failed: {errors[0]}")
    total = sum(c for c, _ in results)
    done = harness.count(url, "SELECT count(*) FROM raw_jobs WHERE status = 'done'")
    if total != n or done != n:
        raise harness.BenchError(f"claimed {total}, done {done}, expected {n} (time bound hit?)")
    return harness.rate_sample(n, elapsed, unit="rows/s", enqueue_s=enqueue_s) | {
        "knobs": {"clients": clients, "batch": batch, "client": "psycopg3 processes, prepared"},
        "note": "claim (FOR UPDATE SKIP LOCKED, LIMIT batch) + complete (UPDATE ... = ANY), "
                "2 autocommit round-trips per batch; no job code",
    }


def insert_unnest(url: str, *, n: int = N_INSERT, chunk: int = INSERT_CHUNK,
                  text_params: bool = False, timeout: float = TIMEOUT_S) -> dict:
    _create_schema(url)
    chunks = _chunks(n, chunk)
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        t0 = time.perf_counter()
        _insert(conn, chunks, INSERT_SQL_TEXT if text_params else INSERT_SQL)
        elapsed = time.perf_counter() - t0
    if elapsed > timeout:
        raise harness.BenchTimeout(f"insert took {elapsed:.0f}s")
    got = harness.count(url, "SELECT count(*) FROM raw_jobs")
    if got != n:
        raise harness.BenchError(f"inserted {got}, expected {n}")
    return harness.rate_sample(n, elapsed, unit="rows/s") | {
        "knobs": {"chunk": chunk, "clients": 1,
                  "params": "text (%s)" if text_params else "binary (%b)"},
        "note": "INSERT ... SELECT FROM unnest(text[], jsonb[]); one autocommit statement per chunk; "
                "table has PK + partial pending index; arrays built before the clock starts",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--which", choices=["claim", "insert", "both"], default="both")
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--clients", type=int, default=CLIENTS)
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--chunk", type=int, default=INSERT_CHUNK)
    ap.add_argument("--text-params", action="store_true", help="insert with text-format (%%s) arrays")
    ap.add_argument("--save", action="store_true", help="merge into bench/results/")
    a = ap.parse_args()
    out = []
    if a.which in ("claim", "both"):
        out.append(harness.run_benchmark(
            "raw_claim_complete",
            lambda u: claim_complete(u, n=a.n or N_DRAIN, clients=a.clients, batch=a.batch), a.runs))
    if a.which in ("insert", "both"):
        out.append(harness.run_benchmark(
            "raw_insert_unnest_text" if a.text_params else "raw_insert_unnest",
            lambda u: insert_unnest(u, n=a.n or N_INSERT, chunk=a.chunk, text_params=a.text_params),
            a.runs))
    harness.print_table(out)
    if a.save:
        harness.save_results(out, env=harness.environment())
    else:
        print(json.dumps([{k: s[k] for k in ("name", "rate_median", "knobs")} for s in out]))


if __name__ == "__main__":
    main()
