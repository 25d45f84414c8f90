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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
