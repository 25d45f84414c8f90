from django.apps import AppConfig


class DurableAppConfig(AppConfig):
    name = "tests.durable_app"
    label = "durable_app"
