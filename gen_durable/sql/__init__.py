"""Internal: the engine's SQL, one statement per file, loaded once at import.

Each `.sql` file starts with a header (purpose, typed parameters, index used, guard,
spec §). Texts are static — no SQL is built at run time — so psycopg's prepared
statement cache plans each shape once per connection (SPEC §0).
"""

from pathlib import Path

_DIR = Path(__file__).parent


def _load(name: str) -> str:
    return (_DIR / f"{name}.sql").read_text()


INSERT = _load("insert")
INSERT_ALL = _load("insert_all")


def names() -> list[str]:
    """Every statement file's stem (for the guard test that each one is used)."""
    return sorted(p.stem for p in _DIR.glob("*.sql"))
