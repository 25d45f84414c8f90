"""Settings of the gen_durable example project, read from the environment (django-environ).

Environment:
    DATABASE_URL   postgres://user:pass@host:5432/name; unset = an embedded Postgres in
                   <checkout>/.pgdata (devdb.py), started on first use and reused.
    DEBUG          default off.
    SECRET_KEY     a development default; set a real one anywhere but your laptop.
    ALLOWED_HOSTS  comma-separated; default localhost only.
    GEN_DURABLE_REAPER_INTERVAL, GEN_DURABLE_POLL_INTERVAL, GEN_DURABLE_MAX_POLL_INTERVAL:
                   seconds; the defaults here are short so the demo's await timeouts and
                   retry back-offs resolve within a second (production: 30 / 1 / 5).
"""

import sys
from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/
if str(BASE_DIR) not in sys.path:  # devdb.py sits beside manage.py
    sys.path.insert(0, str(BASE_DIR))

from devdb import database_settings  # noqa: E402

env = environ.Env()

DEBUG = env.bool("DEBUG", default=False)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-gen-durable-example-only")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "gen_durable",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]

# DATABASE_URL (or the embedded server), with server-side binding and prepared
# statements on, so gen_durable's static hot-path SQL is planned once per connection.
DATABASES = {"default": database_settings()}

GEN_DURABLE = {
    # queue -> concurrent steps per worker process (rundurable --processes N multiplies it).
    # A step thread opens a database connection only when its steps use the database, so
    # a queue of quick, database-free steps ("default": the demo's Pipeline) can run many:
    # each step waits on two commits (its claim and its outcome), and more steps in
    # flight share each commit's fsync (group commit).
    "QUEUES": {"orders": 8, "email": 4, "default": 16},
    "POLL_INTERVAL": env.float("GEN_DURABLE_POLL_INTERVAL", default=0.2),
    "MAX_POLL_INTERVAL": env.float("GEN_DURABLE_MAX_POLL_INTERVAL", default=1.0),
    "REAPER": {"INTERVAL": env.float("GEN_DURABLE_REAPER_INTERVAL", default=1.0)},
}
# Any other engine key, as a JSON object merged over the above (bench/ sets QUEUES,
# PREFETCH, MIN_DEMAND, FLUSH this way): GEN_DURABLE_JSON='{"PREFETCH": 50}'.
GEN_DURABLE.update(env.json("GEN_DURABLE_JSON", default={}))

# Django's Tasks framework on gen_durable (shop/tasks.py): tasks share the engine's
# queues; a task that raises is retried up to 3 attempts in all.
TASKS = {
    "default": {
        "BACKEND": "gen_durable.tasks.GenDurableBackend",
        "QUEUES": ["default", "email"],
        "OPTIONS": {"MAX_ATTEMPTS": 3},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

