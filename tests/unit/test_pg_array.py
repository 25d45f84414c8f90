"""db.pg_array renders literals that Postgres parses back to the same values."""

import datetime as dt

import pytest
from django.db import connection

from gen_durable.db import pg_array

TEXTS = ["plain", "", "a,b", 'quote "q"', "back\\slash", "{brace}", "NULL", " spaced ", "ünï", None]


@pytest.mark.django_db
@pytest.mark.parametrize("values, cast", [
    ([1, -2, 2**62, None], "bigint[]"),
    ([1.5, 0.0, 1e-9, None], "float8[]"),
    ([True, False, None], "bool[]"),
    ([1.0, 0.25, -3e300, 1e-9], "float8[]"),     # no NULL: the float fast path
    ([True, False, True], "bool[]"),              # no NULL: the bool fast path
    (TEXTS, "text[]"),
    ([dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc), None], "timestamptz[]"),
    ([], "bigint[]"),
])
def test_round_trips_through_the_cast(values, cast):
    with connection.cursor() as cur:
        cur.execute(f"SELECT %s::{cast}", [pg_array(values)])
        assert cur.fetchone()[0] == values


@pytest.mark.django_db
@pytest.mark.parametrize("values", [
    [t for t in TEXTS if t is not None],          # no NULL: escaped as one joined string
    ["a\x1fb", 'c"d', "e"],                       # holds the joining separator: per element
])
def test_text_columns_round_trip_on_both_paths(values):
    with connection.cursor() as cur:
        cur.execute("SELECT %s::text[]", [pg_array(values)])
        assert cur.fetchone()[0] == values


@pytest.mark.django_db
@pytest.mark.parametrize("values, expected", [
    (["q"] * 4, (None, "q")),
    ([1, True], ("{1,t}", None)),          # equal but of two types: an array
    ([None, None], (None, None)),
    ([1.0, 2.0], ("{1.0,2.0}", None)),
])
def test_batch_column_sends_a_repeated_value_once(values, expected):
    from gen_durable.db import batch_column

    assert batch_column(values) == expected


@pytest.mark.django_db
@pytest.mark.parametrize("values, cast", [
    ([None] * 3, "text[]"),
    (["host:1-abc"] * 3, "text[]"),
    (['quote "q" and \\'] * 3, "text[]"),   # the one element is escaped like any other
    ([1.0] * 3, "float8[]"),
    ([0.0] * 2, "float8[]"),
    ([False] * 3, "bool[]"),
    ([7] * 3, "bigint[]"),
    ([1, True], "text[]"),                  # equal but of two types: rendered element by element
])
def test_a_repeated_value_renders_like_its_elements(values, cast):
    """A column of one repeated value (a flush's worker and NULL columns) is rendered once
    and repeated: the same literal the element-wise path gives, parsed back the same."""
    expected = "{" + ",".join(pg_array([v])[1:-1] for v in values) + "}"
    assert pg_array(values) == expected
    if cast != "text[]" or all(isinstance(v, str) or v is None for v in values):
        with connection.cursor() as cur:
            cur.execute(f"SELECT %s::{cast}", [pg_array(values)])
            assert cur.fetchone()[0] == values


def test_a_flush_of_one_kind_sends_its_shared_columns_once_and_its_null_columns_as_null(settings):
    """flush.sql's parameters (worker/flusher.py `_arrays`): worker, kind and weight as one
    value when the batch shares it, an all-NULL column as NULL (unnest pads it), a column
    that varies as its array; delay only for a retry, set_key true or NULL."""
    from gen_durable.worker.executor import Entry
    from gen_durable.worker.flusher import _arrays

    chain = [Entry(id=i, worker="w-1", kind="inline", step="b", state=None) for i in (3, 4)]
    p = _arrays(chain)
    assert (p["worker"], p["worker_1"], p["kind"], p["kind_1"], p["weight"], p["weight_1"]) == \
        (None, "w-1", None, "inline", None, 1.0)
    assert [p[c] for c in ("state", "result", "error", "delay", "awaits", "timeout", "set_key",
                           "new_key", "rate_limit", "detail")] == [None] * 10
    assert (p["id"], p["step"], p["inline"]) == ("{3,4}", '{"b","b"}', "{3,4}")

    mixed = [Entry(id=1, worker="w-1", kind="retry", delay=2.5, weight=2.0),
             Entry(id=2, worker="w-2", kind="next", step="s", delay=9.0, set_key=True, new_key="k:1"),
             Entry(id=5, worker="w-1", kind="done", result='{"ok":true}', set_key=False)]
    p = _arrays(mixed)
    assert (p["worker"], p["worker_1"]) == ('{"w-1","w-2","w-1"}', None)
    assert (p["kind"], p["weight"], p["weight_1"]) == ('{"retry","next","done"}', "{2.0,1.0,1.0}", None)
    assert (p["delay"], p["set_key"], p["new_key"]) == ("{2.5,NULL,NULL}", "{NULL,t,NULL}", '{NULL,"k:1",NULL}')
    assert (p["step"], p["result"], p["state"]) == ('{NULL,"s",NULL}', '{NULL,NULL,"{\\"ok\\":true}"}', None)
