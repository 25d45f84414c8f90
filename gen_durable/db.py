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
