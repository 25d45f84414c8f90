from django.urls import path

from . import views

# Mounted at the site root by example_project/urls.py; also usable as a ROOT_URLCONF (tests).

urlpatterns = [
    path("orders/", views.create_order, name="shop-create-order"),
    path("orders/<int:instance_id>/result/", views.order_result, name="shop-order-result"),
    path("webhooks/payment/<str:order_key>/", views.payment_webhook, name="shop-payment-webhook"),
    path("orders/<str:order_key>/receipt-copy/", views.receipt_copy, name="shop-receipt-copy"),
    path("tasks/<str:task_id>/", views.task_result, name="shop-task-result"),
]
