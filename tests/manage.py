#!/usr/bin/env python
"""manage.py for the test settings: the fault and command tests run `rundurable` in a
child process with it (`python tests/manage.py rundurable ...`). Set
GEN_DURABLE_TEST_DB_NAME to reach the database pytest-django created."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "example_project")]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
