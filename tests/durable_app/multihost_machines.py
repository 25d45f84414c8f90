"""The machines of the multi-host and multi-database tests (tests/faults/test_multihost.py,
tests/integration/test_databases.py), imported by durable.py so worker subprocesses have them."""

import os
import time

from django.db import connection

import gen_durable as gd


class HostLogged(gd.Machine):
    """One step that logs its run in the side table gd_test_steplog: a row stamped with
    the server's clock and the client address it came from (the "host") when it starts,
    its end stamped when it finishes, state["sleep"] seconds later. Each statement
    commits on its own (autocommit), so a run is visible while it lasts."""

    name = "tests.HostLogged"

    @gd.step
    def start(self, ctx):
        with connection.cursor() as cur:
            cur.execute("INSERT INTO gd_test_steplog (id, host, pid, started_at) "
                        "VALUES (%s, inet_client_addr(), %s, clock_timestamp()) RETURNING run",
                        [ctx.id, os.getpid()])
            run = cur.fetchone()[0]
        time.sleep(ctx.state.get("sleep", 0))
        with connection.cursor() as cur:
            cur.execute("UPDATE gd_test_steplog SET ended_at = clock_timestamp() WHERE run = %s", [run])
        return gd.Done({})


class DbLogged(gd.Machine):
    """HostLogged for the two-database multi-host test: logs its run in gd_test_dblog
    (on the "default" alias, whichever database the row lives in) with state["db"], the
    label of the database it was inserted in, so runs of equal ids in two databases
    stay apart."""

    name = "tests.DbLogged"

    @gd.step
    def start(self, ctx):
        with connection.cursor() as cur:
            cur.execute("INSERT INTO gd_test_dblog (db, id, host, pid, started_at) "
                        "VALUES (%s, %s, inet_client_addr(), %s, clock_timestamp()) RETURNING run",
                        [ctx.state["db"], ctx.id, os.getpid()])
            run = cur.fetchone()[0]
        time.sleep(ctx.state.get("sleep", 0))
        with connection.cursor() as cur:
            cur.execute("UPDATE gd_test_dblog SET ended_at = clock_timestamp() WHERE run = %s", [run])
        return gd.Done({})


class SignalsSibling(gd.Machine):
    """Signals state["target"] (a correlation key) "go" in its own database (ctx.database),
    and records which alias that was (tests/integration/test_databases.py)."""

    name = "tests.SignalsSibling"

    @gd.step
    def start(self, ctx):
        try:
            gd.signal(ctx.state["target"], "go", using=ctx.database)
            sent = True
        except gd.NoTarget:
            sent = False
        return gd.Done({"database": ctx.database, "sent": sent})
