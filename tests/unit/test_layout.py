"""The package layout's promises (ARCHITECTURE.md "Package layout"): the stable import
paths of the integrations, and an engine that does not import the admin."""

import subprocess
import sys

from django.utils.module_loading import import_string


def test_the_integrations_keep_their_import_paths():
    import gen_durable.integrations.otel
    import gen_durable.integrations.tasks
    import gen_durable.otel
    import gen_durable.tasks

    assert gen_durable.tasks is gen_durable.integrations.tasks
    assert gen_durable.otel is gen_durable.integrations.otel
    # the string a project's TASKS setting holds
    assert import_string("gen_durable.tasks.GenDurableBackend") is gen_durable.integrations.tasks.GenDurableBackend
    assert import_string("gen_durable.otel.install") is gen_durable.integrations.otel.install


def test_the_engine_and_the_worker_import_neither_the_admin_nor_an_integration():
    # A fresh interpreter with only the app installed (Django's admin, when installed,
    # imports gen_durable.admin itself): what the public API and the worker pull in.
    code = (
        "import django, sys; from django.conf import settings;"
        "settings.configure(INSTALLED_APPS=['gen_durable'], USE_TZ=True);"
        "django.setup();"
        "import gen_durable, gen_durable.worker.supervisor, gen_durable.worker.scheduler, gen_durable.testing;"
        "print(sorted(m for m in sys.modules if m.startswith(('gen_durable.admin', 'gen_durable.integrations', 'django.contrib.admin'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
