"""Guard: every sql/*.sql is loaded and used; none has a bare percent sign (psycopg placeholders)."""

import re
from pathlib import Path

from gen_durable import sql

ROOT = Path(sql.__file__).resolve().parent.parent


def test_every_statement_file_is_loaded_and_used():
    code = "\n".join(p.read_text() for p in ROOT.rglob("*.py") if "sql" not in p.parts and "migrations" not in p.parts)
    for stem in sql.names():
        const = stem.upper()
        assert hasattr(sql, const), f"sql/{stem}.sql is not loaded: add {const} = _load({stem!r}) to sql/__init__.py"
        assert re.search(rf"sql\.{const}\b", code), f"sql/{stem}.sql is never used: delete it or call sql.{const}"


def test_statement_texts_have_no_stray_percent_signs():
    for stem in sql.names():
        text = (Path(sql.__file__).parent / f"{stem}.sql").read_text()
        stray = re.findall(r"%(?![(%])", text.replace("%%", ""))
        assert not stray, f"sql/{stem}.sql has a bare '%' (psycopg reads it as a placeholder); write %% or reword"


def test_statements_are_sent_without_their_header_and_fit_psycopgs_parse_cache():
    """What runs is the first line (the statement's name, for pg_stat_statements and
    logs) and the SQL: psycopg caches the parse of a query up to 4,096 bytes and parses
    a longer one again at every execution."""
    from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

    for stem in sql.names():
        sent = getattr(sql, stem.upper())
        source = (Path(sql.__file__).parent / f"{stem}.sql").read_text()
        assert sent.splitlines()[0] == source.splitlines()[0]
        assert not [line for line in sent.splitlines()[1:] if line.startswith("--")], stem
        assert len(sent.encode()) <= MAX_CACHED_STATEMENT_LENGTH, (
            f"sql/{stem}.sql is {len(sent.encode())} bytes as sent: over psycopg's parse cache")
