"""Settings for the test suite: real Postgres only (DATABASE_URL or embedded)."""

import json
import os

from devdb import database_settings

SECRET_KEY = "tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "django.contrib.staticfiles",  # the admin's CSS for the browser tests (tests/browser)
    "gen_durable",
    "tests.durable_app",
]
DATABASES = {"default": database_settings()}
# GEN_DURABLE_TEST_DB lets two checkouts run their suites on one server at once.
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("GEN_DURABLE_TEST_DB", "test_gen_durable")}
# A second alias on the same server, its own database: queue groups on several databases
# (docs/scaling.md). Tests that use it say so (pytest-django's `databases=`); its test
# database name follows the default's, so parallel checkouts stay apart there too.
DATABASES["other"] = dict(database_settings(), TEST={"NAME": DATABASES["default"]["TEST"]["NAME"] + "_other"})
# The admin's middleware, so the whole project passes `manage.py check` (the worker
# subprocesses of the fault tests run with system checks on).
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
GEN_DURABLE = {
    "QUEUES": {"default": 4},
    # The suite's per-test queues (the queue_name fixture: q<n>_<hex>) and the few
    # literal names tests use; tests of the strictness itself override this.
    "EXTRA_QUEUES": ["q*", "browser_q", "email*", "other", "x", "z", "held", "stranded-*", "emials", "orders", "mail", "odd", "yyy*"],
    "LEASE_TTL": 3,
    "HEARTBEAT_INTERVAL": 0.5,
    "POLL_INTERVAL": 0.05,
    "MAX_POLL_INTERVAL": 0.2,
    "FLUSH": {"MAX_BATCH": 100, "MAX_DELAY": 0.005},
    "REAPER": {"INTERVAL": 0.2},
    "GC": {"INTERVAL": 0.5, "RETENTION": 86400, "BATCH": 1000},
    "DRAIN_TIMEOUT": 2,
}
# Django tasks (tests/durable_app/tasks.py) on gen_durable; "retrying" retries at once.
TASKS = {
    "default": {"BACKEND": "gen_durable.tasks.GenDurableBackend", "QUEUES": ["default"]},
    "retrying": {"BACKEND": "gen_durable.tasks.GenDurableBackend", "QUEUES": ["default"],
                 "OPTIONS": {"MAX_ATTEMPTS": 3, "BACKOFF": "tests.durable_app.backoff.no_backoff"}},
    # Tasks on the second database (tests/integration/test_databases.py).
    "other": {"BACKEND": "gen_durable.tasks.GenDurableBackend", "QUEUES": ["default"],
              "OPTIONS": {"DATABASE": "other"}},
}
# Child processes of the fault and command tests (tests/races/test_faults.py,
# tests/integration/test_rundurable.py) load these settings too: point them at the test
# database pytest-django created, and let a test adjust engine keys (JSON object merged
# over GEN_DURABLE). Unset in the pytest process itself.
if os.environ.get("GEN_DURABLE_TEST_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["GEN_DURABLE_TEST_DB_NAME"]
if os.environ.get("GEN_DURABLE_TEST_OTHER_DB_NAME"):
    DATABASES["other"]["NAME"] = os.environ["GEN_DURABLE_TEST_OTHER_DB_NAME"]
if os.environ.get("GEN_DURABLE_TEST_DB_OVERRIDE"):  # JSON merged over the database's settings
    DATABASES["default"].update(json.loads(os.environ["GEN_DURABLE_TEST_DB_OVERRIDE"]))
if os.environ.get("GEN_DURABLE_TEST_OTHER_DB_OVERRIDE"):  # the same, for the "other" alias
    DATABASES["other"].update(json.loads(os.environ["GEN_DURABLE_TEST_OTHER_DB_OVERRIDE"]))
if os.environ.get("GEN_DURABLE_TEST_SETTINGS"):
    GEN_DURABLE.update(json.loads(os.environ["GEN_DURABLE_TEST_SETTINGS"]))
if os.environ.get("GEN_DURABLE_TEST_BACKGROUND_THREAD"):
    # A thread running in the process from its start, as an exporter's or a client
    # library's would: `rundurable --processes N` must then start its children as new
    # interpreters, never fork (tests/faults/test_supervision.py).
    import threading
    import time

    threading.Thread(target=time.sleep, args=(10**6,), name="test-background", daemon=True).start()
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
LOGGING = {"version": 1, "disable_existing_loggers": False}
if os.environ.get("GEN_DURABLE_TEST_LOG_BUFFER"):
    # gen_durable's records held in memory until the process exits (a MemoryHandler in
    # front of a file), as a buffering log shipper would: a forked worker child must
    # write its own records at its exit and never a copy of its parent's
    # (tests/faults/test_supervision.py).
    LOGGING = {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": os.environ["GEN_DURABLE_TEST_LOG_BUFFER"]},
            "buffer": {"class": "logging.handlers.MemoryHandler", "capacity": 10_000, "flushLevel": 50,  # CRITICAL
                       "target": "file"},
        },
        "loggers": {"gen_durable": {"handlers": ["buffer"], "level": "INFO"}},
    }
    # ...and an exit function registered at start-up, as a pid file's clean-up would be:
    # it appends this process's pid, so only the processes that ran it are listed.
    import atexit

    def _note_exit(path=os.environ["GEN_DURABLE_TEST_LOG_BUFFER"] + ".atexit"):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")

    atexit.register(_note_exit)
