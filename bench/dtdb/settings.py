"""Minimal settings: django-tasks with the django-tasks-db DatabaseBackend on Postgres."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/ for `harness`

from harness import django_db_settings  # noqa: E402

SECRET_KEY = "bench-only-not-secret"
DEBUG = False  # DEBUG=True would record every query in memory and turn on autoreload
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS: list[str] = []

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_tasks",
    "django_tasks_db",
]

DATABASES = {"default": django_db_settings(os.environ["BENCH_DTDB_URL"])}
# Persistent connections. db_worker calls close_old_connections() around every task,
# so with Django's default CONN_MAX_AGE=0 it opens a new Postgres connection per task.
_age = os.environ.get("BENCH_DTDB_CONN_MAX_AGE", "none").lower()
DATABASES["default"]["CONN_MAX_AGE"] = None if _age == "none" else int(_age)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
