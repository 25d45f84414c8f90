from django.contrib import admin
from django.urls import path

from gen_durable.integrations.prometheus import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    # the database metrics for Prometheus (docs/observability.md, "Prometheus")
    path("metrics/", metrics_view, name="gd-metrics"),
    path("metrics/other/", metrics_view, {"using": "other"}, name="gd-metrics-other"),
]
