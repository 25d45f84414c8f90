from django.apps import AppConfig


class ShopConfig(AppConfig):
    """The example shop. Its machines live in shop/durable.py, which gen_durable
    auto-discovers (no registration list needed)."""

    name = "shop"
    verbose_name = "Example shop"
    default_auto_field = "django.db.models.BigAutoField"
