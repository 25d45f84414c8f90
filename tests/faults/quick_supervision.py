"""`manage.py` with quick supervision constants (back-off 0.1-0.2 s, 3 rapid deaths),
so a test can watch a host give up on a child that keeps dying within seconds.
Children started by the host run this script too (the host re-runs its own argv)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]  # as tests/manage.py
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.core.management import execute_from_command_line

    from gen_durable.management.commands import rundurable

    rundurable.RESTART_BACKOFF = (0.1, 0.2)
    rundurable.MAX_RAPID_DEATHS = 3
    execute_from_command_line(sys.argv)
