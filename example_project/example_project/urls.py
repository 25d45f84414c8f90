"""URLs: the Django admin (gen_durable's instances live there) and the shop's endpoints."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("shop.urls")),
]
