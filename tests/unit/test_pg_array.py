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
    (TEXTS, "text[]"),
    ([dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc), None], "timestamptz[]"),
    ([], "bigint[]"),
])
def test_round_trips_through_the_cast(values, cast):
    with connection.cursor() as cur:
        cur.execute(f"SELECT %s::{cast}", [pg_array(values)])
        assert cur.fetchone()[0] == values
