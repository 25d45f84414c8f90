from django.apps import AppConfig


class GenDurableConfig(AppConfig):
    name = "gen_durable"
    verbose_name = "Durable execution"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401  (registers the system checks)

        # Machines in <app>/durable.py register themselves on import (SPEC §1).
        autodiscover_modules("durable")
