"""Internal: run named statements on Django's connection for an alias.

Statements go through `connections[alias].cursor()` so they join the caller's
`transaction.atomic()`, are counted by Django's query capture, and — with
OPTIONS server_side_binding + prepare_threshold — are prepared once per connection.
"""

from __future__ import annotations

from django.db import connections

from .conf import database_alias


def connection(using: str | None = None):
    return connections[database_alias(using)]


def fetchall(sql: str, params=None, using: str | None = None) -> list[tuple]:
    with connection(using).cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchall() if cur.description else []


def fetchone(sql: str, params=None, using: str | None = None):
    with connection(using).cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone() if cur.description else None


def execute(sql: str, params=None, using: str | None = None) -> int:
    with connection(using).cursor() as cur:
        cur.execute(sql, params)
        return cur.rowcount


def _text_element(v) -> str:
    return "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pg_array(values) -> str:
    """Render a batch column as a Postgres array literal ('{1,"a b",NULL}').

    Hot-path batches travel as typed arrays through unnest (SPEC §0). psycopg dumps a
    Python list element by element in Python (~120 µs per 50-element array here);
    rendering the literal ourselves and letting the statement's cast (`::bigint[]`,
    `::text[]`…) parse it server-side costs a fraction of that, and a flush carries
    sixteen arrays. Elements: None, bool, int, float, str, datetime (ISO 8601).
    Homogeneous int and str columns (ids, names, JSON texts) take a fast path.
    """
    values = list(values)
    kinds = {type(v) for v in values}
    kinds.discard(type(None))
    if kinds == {int} or not kinds:
        return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"
    if kinds == {str}:
        return "{" + ",".join(map(_text_element, values)) + "}"
    out = []
    for v in values:
        if v is None:
            out.append("NULL")
        elif v is True:
            out.append("t")
        elif v is False:
            out.append("f")
        elif isinstance(v, int):
            out.append(str(int(v)))  # int(): an IntEnum's str/repr is its name
        elif isinstance(v, float):
            out.append(repr(float(v)))
        elif isinstance(v, str):
            out.append(_text_element(v))
        else:  # datetime and friends
            out.append('"' + v.isoformat() + '"')
    return "{" + ",".join(out) + "}"
