"""A real crash undoes a claim the feeder committed asynchronously, and the next claim
of that row by the same worker gets a counter above the one the lost claim handed out
(docs/design.md#leases, "Claims across a crash"), on a cluster of the test's own.

The scheduler's side (which claims it sends as held, and the flush guard turning the
first run's late outcome stale) is tests/races/test_claims_across_a_crash.py.
"""

import json

import pytest

from gen_durable import db, sql
from tests.faults.cluster import PG_BIN, OwnCluster
from tests.faults.test_database_down import DBNAME, prepare

WORKER = "crash-worker"


def _pick(conn, queue, held=None):
    params = {"queue": queue, "limit": 10, "worker": WORKER, "ttl": 60.0, "gates": "{}",
              "held_ids": None, "held_claims": None}
    if held:
        params["held_ids"], params["held_claims"] = db.pg_array(list(held)), db.pg_array(list(held.values()))
    return {r[0]: r[-1] for r in conn.execute(sql.PICK, params).fetchall()}  # id -> claim


@pytest.mark.slow
def test_a_claim_lost_in_a_crash_is_not_minted_again_to_the_same_worker():
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no Postgres binaries in {PG_BIN}")
    # The WAL writer waits 10 s between flushes: an asynchronous commit stays in memory
    # for the immediate stop to lose.
    cluster = OwnCluster(wal_writer_delay="'10s'").start()
    try:
        prepare(cluster)
        with cluster.connect(DBNAME) as c:
            id_ = c.execute("INSERT INTO gen_durable (fsm, step, state, queue) VALUES "
                            "('tests.Counter', 'start', %s, 'q') RETURNING id",
                            [json.dumps({"target": 3})]).fetchone()[0]
            c.execute("CHECKPOINT")
        with cluster.connect(DBNAME) as feeder:
            feeder.execute("SET synchronous_commit = off")  # as the worker's feeder connection
            first = _pick(feeder, "q")
            assert list(first) == [id_]
            cluster.stop("immediate")  # a crash: the claim's commit never reached the WAL on disk
        cluster.start()

        with cluster.connect(DBNAME) as feeder:
            row = feeder.execute("SELECT status::text, locked_by, claim FROM gen_durable WHERE id = %s",
                                 [id_]).fetchone()
            assert row == ("runnable", None, first[id_] - 1)  # the claim is gone
            # Control: claimed again as before, the row gets the very counter the first
            # run holds — that run's late outcome would pass the flush guard.
            with feeder.transaction(force_rollback=True):
                assert _pick(feeder, "q") == first
            # Held: the claim the worker still holds from before the crash.
            again = _pick(feeder, "q", held=first)
            assert again[id_] > first[id_]
    finally:
        cluster.destroy()
