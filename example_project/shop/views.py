"""The shop's JSON endpoints: create an order, receive the payment webhook, read a result.

    POST /orders/                          {"items": [{"sku": "mug", "qty": 2}], "email": "...",
                                            "number": "1001" (optional), "payment_timeout": 30}
                                           → 201 {"id", "order_key", "total", ...}; 409 duplicate
    POST /webhooks/payment/<order_key>/    {"amount": "25.00", "event_id": "evt_1", ...}
                                           → 202 {"signal_id", "duplicate"}; 404 no live order
    GET  /orders/<id>/result/?timeout=5&until=settled|terminal
                                           → 200 {"id", "status", "result", "error", "step", ...}
    POST /orders/<order_key>/receipt-copy/ {"email": "..."}: a Django task (shop/tasks.py)
                                           → 202 {"task_id", "status", "task_url"}
    GET  /tasks/<task_id>/                 → 200 the task's TaskResult as JSON; 404 unknown

The demo endpoints are CSRF-exempt: they are called by machines (a payment provider, a
script), not by a browser with a session. Authenticate real webhooks (signatures).
"""

import json
import math
import secrets

from django.http import JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import gen_durable as gd

from gen_durable.tasks import TaskResultDoesNotExist

from . import catalogue
from .durable import PAYMENT_TIMEOUT, Order
from .tasks import send_receipt_copy

MAX_WAIT = 30.0  # seconds a result request may hold its connection


def _body(request) -> dict:
    if not request.body:
        return {}
    data = json.loads(request.body)
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    return data


def _error(http_status: int, message: str, **extra) -> JsonResponse:
    return JsonResponse({"error": message, **extra}, status=http_status)


@csrf_exempt
@require_POST
def create_order(request):
    """Insert an Order instance keyed "order:<number>" and return its id (one INSERT)."""
    try:
        body = _body(request)
        items = catalogue.validate(body.get("items") or [{"sku": "mug", "qty": 1}])
        number = str(body.get("number") or secrets.token_hex(4))
        timeout = float(body.get("payment_timeout", PAYMENT_TIMEOUT))
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError("payment_timeout must be a number of seconds > 0")
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError and OrderError are ValueErrors
        return _error(400, str(exc))
    order_key = f"order:{number}"
    try:
        instance_id = gd.insert(Order, correlation_key=order_key, state={
            "number": number, "email": body.get("email"), "items": items, "payment_timeout": timeout})
    except gd.DuplicateInstance:
        return _error(409, f"order {order_key} already exists", order_key=order_key)
    except (gd.InvalidInput, gd.SerializationError) as exc:
        return _error(400, str(exc))
    return JsonResponse({
        "id": instance_id,
        "order_key": order_key,
        "total": catalogue.total(items),
        "result_url": reverse("shop-order-result", args=[instance_id]),
        "webhook_url": reverse("shop-payment-webhook", args=[order_key]),
    }, status=201)


@csrf_exempt
@require_POST
def payment_webhook(request, order_key):
    """Deliver the provider's confirmation as the signal "payment_confirmed" (one statement).

    The provider's event id is the dedup key: a redelivered webhook is stored once.
    """
    try:
        payload = _body(request)
    except ValueError as exc:
        return _error(400, str(exc))
    event_id = payload.get("event_id")
    try:
        signal_id = gd.signal(order_key, "payment_confirmed", payload,
                              dedup_key=str(event_id) if event_id else None)
    except gd.NoTarget:
        return _error(404, f"no live order {order_key}")
    except (gd.InvalidInput, gd.SerializationError) as exc:
        return _error(400, str(exc))
    return JsonResponse({"order_key": order_key, "signal_id": signal_id, "duplicate": signal_id is None},
                        status=202)


@require_GET
def order_result(request, instance_id):
    """Wait up to ?timeout= seconds (default 5, max 30) for the instance to settle.

    ?until=settled (default) also answers when the order is parked (status "awaiting");
    ?until=terminal waits for done or failed. "busy" means not yet: ask again.
    """
    try:
        timeout = min(float(request.GET.get("timeout", 5)), MAX_WAIT)
        until = request.GET.get("until", "settled")
        result = gd.await_result(instance_id, timeout, until=until)
    except (ValueError, gd.InvalidInput) as exc:
        return _error(400, str(exc))
    if result.status == "not_found":
        return _error(404, f"no instance {instance_id}", status="not_found")
    snap = result.snapshot
    return JsonResponse({
        "id": instance_id,
        "status": result.status,
        "result": result.result,
        "error": result.error,
        "step": snap.step,
        "row_status": snap.status,
        "attempt": snap.attempt,
        "order_key": snap.correlation_key,
    })


@csrf_exempt
@require_POST
def receipt_copy(request, order_key):
    """Enqueue the Django task `send_receipt_copy` (one INSERT; visible to workers on commit)."""
    try:
        body = _body(request)
        result = send_receipt_copy.enqueue(order_key, body.get("email"))
    except (ValueError, TypeError) as exc:  # a body that is not JSON, arguments that are not JSON
        return _error(400, str(exc))
    return JsonResponse({"task_id": result.id, "status": result.status,
                         "task_url": reverse("shop-task-result", args=[result.id])}, status=202)


@require_GET
def task_result(request, task_id):
    """The TaskResult of a `send_receipt_copy` task, read from its row."""
    try:
        result = send_receipt_copy.get_result(task_id)
    except TaskResultDoesNotExist:
        return _error(404, f"no task {task_id}")
    return JsonResponse({
        "task_id": result.id,
        "status": result.status,
        "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
        "errors": [{"exception": e.exception_class_path, "traceback": e.traceback} for e in result.errors],
        "attempts": result.attempts,
        "worker_ids": result.worker_ids,
        "enqueued_at": result.enqueued_at, "started_at": result.started_at, "finished_at": result.finished_at,
    })
