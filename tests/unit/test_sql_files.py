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
