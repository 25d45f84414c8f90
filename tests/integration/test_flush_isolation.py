"""A flush failing on one outcome's data retries outcome by outcome; only a lost
connection counts as connection loss. The one classification is db.is_connection_error
(docs/design.md#connections)."""

import psycopg
import pytest
from django.db import DataError, IntegrityError, OperationalError, connection

import gen_durable as gd
from gen_durable import db
from gen_durable.models import Instance
from gen_durable.worker.claims import pick
from gen_durable.worker.executor import Entry, execute
from gen_durable.worker.flusher import Flusher
from tests.factories import ExecutingFactory
from tests.integration.test_bad_input import Ok


def _incompressible(n):
    import random
    import string

    return "".join(random.Random(9).choices(string.ascii_letters + string.digits, k=n))


def _raises(sql):
    with pytest.raises(Exception) as info:
        with connection.cursor() as cur:
            cur.execute(sql)
    return info.value


@pytest.mark.django_db
def test_data_integrity_and_limit_errors_are_not_connection_errors():
    limit = _raises("SELECT array_fill(0, ARRAY[1000000000])")  # 54000 program_limit_exceeded
    assert isinstance(limit, OperationalError)  # psycopg files 54xxx under OperationalError…
    assert not db.is_connection_error(limit)   # …but the connection is fine
    assert not db.is_connection_error(_raises("SELECT 1/0"))                   # 22012
    assert not db.is_connection_error(_raises("SELECT 'x'::int"))              # 22P02
    assert not db.is_connection_error(_raises("SELECT * FROM no_such_table"))  # 42P01
    assert not db.is_connection_error(ValueError("not a database error"))


def test_a_terminated_session_and_a_closed_connection_are_connection_errors(transactional_db):
    params = connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as victim, psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [victim.info.backend_pid])
        with pytest.raises(psycopg.Error) as info:
            victim.execute("SELECT 1")
        assert db.is_connection_error(info.value)
        with pytest.raises(psycopg.Error) as closed:
            victim.execute("SELECT 1")  # now closed on the client side: no SQLSTATE
        assert db.is_connection_error(closed.value)


def test_a_program_limit_error_in_a_flush_fails_that_outcome_alone(committed, queue_name):
    ids = [gd.insert(Ok, queue=queue_name) for _ in range(9)]
    jobs = pick(queue_name, 20, "w", 60)
    entries = [execute(j) for j in jobs]
    # A row written before keys were bounded: its 10,000-character key is reserved only
    # while runnable, so the Next that returns it to runnable must put it in the unique
    # index, and Postgres refuses (54000, "index row requires … bytes").
    poisoned = ExecutingFactory(fsm=Ok.name, queue=queue_name, locked_by="w")
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET correlation_scope = '{runnable}', correlation_key = %s WHERE id = %s",
                    [_incompressible(10_000), poisoned.id])
    entries.append(Entry(id=poisoned.id, worker="w", kind="next", step="second", fsm=Ok.name, from_step="start"))
    Flusher()._flush([(e, None) for e in entries])
    rows = {r.id: r for r in Instance.objects.filter(id__in=[*ids, poisoned.id])}
    assert all(rows[i].status == "runnable" and rows[i].step == "second" for i in ids)
    assert rows[poisoned.id].status == "failed"
    assert rows[poisoned.id].last_error.startswith("outcome could not be stored")
