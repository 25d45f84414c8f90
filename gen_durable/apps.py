from django.apps import AppConfig


class GenDurableConfig(AppConfig):
    name = "gen_durable"
    verbose_name = "Durable execution"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the system checks)

        # Machines in <app>/durable.py register themselves on import (docs/guide.md).
        autodiscover_modules("durable")
        if _tasks_on_gen_durable():
            # Django tasks live in <app>/tasks.py by convention; the worker resolves a
            # task row's function through the registry, which these imports fill.
            _import_tasks()

        from .conf import get_settings

        if get_settings().OPENTELEMETRY:  # off by default: the integration is not even imported
            from .integrations.otel import install_from_settings

            install_from_settings()


def _import_tasks():
    """autodiscover_modules("tasks"), but a module that raises InvalidTask (a @task whose
    queue the settings no longer have) is recorded for check E100 instead of stopping
    every manage.py command with a traceback."""
    from importlib import import_module

    from django.apps import apps
    from django.utils.module_loading import module_has_submodule

    from .integrations.tasks import IMPORT_ERRORS, InvalidTask

    IMPORT_ERRORS.clear()
    for app_config in apps.get_app_configs():
        if module_has_submodule(app_config.module, "tasks"):
            try:
                import_module(f"{app_config.name}.tasks")
            except InvalidTask as exc:
                IMPORT_ERRORS.append((f"{app_config.name}.tasks", str(exc)))


def _tasks_on_gen_durable() -> bool:
    """Whether settings.TASKS configures a gen_durable.tasks.GenDurableBackend (or subclass)."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    tasks = getattr(settings, "TASKS", None)
    if not isinstance(tasks, dict):
        return False
    for conf in tasks.values():
        path = conf.get("BACKEND") if isinstance(conf, dict) else None
        if not isinstance(path, str):
            continue
        try:
            backend = import_string(path)
        except ImportError:
            continue  # the tasks framework reports it when the backend is first used
        if getattr(backend, "gd_autodiscover_tasks", False):
            return True
    return False
