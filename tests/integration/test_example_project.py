"""The example project (example_project/): its machines, views and settings.

The suite runs on tests.settings, where `shop` is not an installed app; importing
shop.durable registers its machines, and the views are mounted with
override_settings(ROOT_URLCONF="shop.urls"). One test boots the example project's
own settings in a subprocess to check that gen_durable auto-discovers shop/durable.py.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client, override_settings

import gen_durable as gd
from gen_durable import registry
from gen_durable.testing import assert_awaiting, assert_done, assert_failed, drain, fire_timeouts
from gen_durable.tasks import machine_for
from shop.durable import (AsyncPing, InlinePipeline, Order, Pipeline, ShipParcel, Waiter, async_sleep_20ms, noop,
                         send_receipt, sleep_20ms, write_row)
from shop.tasks import noop as noop_task
from shop.tasks import send_receipt_copy

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"
SHOP_MACHINES = {Order: "shop.Order", ShipParcel: "shop.ShipParcel", Pipeline: "shop.Pipeline",
                 send_receipt: "shop.send_receipt", noop: "shop.noop", write_row: "shop.write_row",
                 sleep_20ms: "shop.sleep_20ms", async_sleep_20ms: "shop.async_sleep_20ms",
                 Waiter: "shop.Waiter", InlinePipeline: "shop.InlinePipeline", AsyncPing: "shop.AsyncPing",
                 machine_for(send_receipt_copy): "shop.tasks.send_receipt_copy",
                 machine_for(noop_task): "shop.tasks.noop"}

shop_urls = override_settings(ROOT_URLCONF="shop.urls")


def post(client, url, body):
    return client.post(url, body, content_type="application/json")


def test_shop_machines_are_registered():
    for cls, name in SHOP_MACHINES.items():
        assert cls.name == name
        assert registry.get(name, 1) is cls
    assert set(Order.steps) == {"reserve_stock", "charge", "payment_received", "join_shipping", "release_stock"}
    assert Order.queue == "orders" and send_receipt.queue == "email" and send_receipt.max_attempts == 5
    assert send_receipt().backoff(0) == pytest.approx(0.2)


def test_example_project_settings_autodiscover_the_shop():
    """A fresh process on example_project.settings finds shop/durable.py with no import of it."""
    code = ("import json; from gen_durable import registry; from django.conf import settings; "
            "print(json.dumps({'machines': sorted(n for n, v in registry.all_machines() if n.startswith('shop.')), "
            "'queues': settings.GEN_DURABLE['QUEUES'], "
            "'options': settings.DATABASES['default']['OPTIONS']}))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "example_project.settings"}
    out = subprocess.run([sys.executable, "manage.py", "shell", "-v", "0", "-c", code], cwd=EXAMPLE, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["machines"] == sorted(SHOP_MACHINES.values())
    assert set(found["queues"]) == {"orders", "email", "default"}
    assert found["options"].items() >= {"server_side_binding": True, "prepare_threshold": 1}.items()


@pytest.mark.django_db
@shop_urls
def test_order_flows_to_done_through_the_webhook_view():
    client = Client()
    resp = post(client, "/orders/", {"number": "t-100", "email": "ann@example.com",
                                     "items": [{"sku": "mug", "qty": 2}, {"sku": "tee", "qty": 1}]})
    assert resp.status_code == 201, resp.content
    order = resp.json()
    oid = order["id"]
    assert order["order_key"] == "order:t-100" and order["total"] == "44.00"
    assert order["webhook_url"] == "/webhooks/payment/order:t-100/"

    # reserve_stock → charge → parked on the payment webhook
    assert drain("orders")["await"] == 1
    assert_awaiting(oid, "payment_confirmed")
    parked = client.get(f"/orders/{oid}/result/?timeout=0").json()
    assert parked["status"] == "awaiting" and parked["step"] == "payment_received"

    # The provider calls back (twice: a redelivery with the same event id is stored once).
    hook = {"event_id": "evt_t100", "amount": "44.00"}
    resp = post(client, order["webhook_url"], hook)
    assert resp.status_code == 202 and resp.json()["duplicate"] is False
    resp = post(client, order["webhook_url"], hook)
    assert resp.status_code == 202 and resp.json() == {"order_key": "order:t-100", "signal_id": None,
                                                       "duplicate": True}

    # payment_received → two ShipParcel children → join_shipping → done (+ a receipt job)
    tally = drain("orders")
    assert tally["schedule_children"] == 1 and tally["done"] == 3, tally
    row = assert_done(oid)
    assert row["result"] == {"order": "t-100", "total": "44.00", "payment_id": f"pi_{oid}",
                             "tracking": [f"TRK{oid:09d}-0", f"TRK{oid:09d}-1"]}
    result = client.get(f"/orders/{oid}/result/?timeout=1&until=terminal").json()
    assert result["status"] == "done" and result["step"] == "join_shipping" and result["error"] is None
    assert result["result"]["tracking"] == row["result"]["tracking"]

    # The receipt is keyed by the order and its key stays reserved once sent.
    assert drain("email")["done"] == 1
    receipt = gd.get("receipt:order:t-100")
    assert receipt.fsm == "shop.send_receipt" and receipt.status == "done"
    assert receipt.result == {"sent_to": "ann@example.com", "order": "t-100", "attempts": 1}
    with pytest.raises(gd.DuplicateInstance):
        send_receipt.insert(args={}, correlation_key="receipt:order:t-100",
                            correlation_scope=["runnable", "executing", "done", "failed"])

    # A finished order takes no more webhooks; a second order with the same number is refused.
    assert post(client, order["webhook_url"], hook).status_code == 404
    assert post(client, "/orders/", {"number": "t-100"}).status_code == 201  # the key is free once done


@pytest.mark.django_db
@shop_urls
def test_a_view_enqueues_a_django_task_and_reads_its_result():
    client = Client()
    resp = post(client, "/orders/order:t-150/receipt-copy/", {"email": "bo@example.com"})
    assert resp.status_code == 202, resp.content
    queued = resp.json()
    assert queued["status"] == "READY" and queued["task_url"] == f"/tasks/{queued['task_id']}/"
    assert client.get(queued["task_url"]).json()["status"] == "READY"
    assert drain("default")["done"] == 1
    done = client.get(queued["task_url"]).json()
    assert done["status"] == "SUCCESSFUL" and done["attempts"] == 1 and done["errors"] == []
    assert done["return_value"] == {"sent_to": "bo@example.com", "order_key": "order:t-150", "attempt": 1}

    bad = post(client, "/orders/order:t-150/receipt-copy/", {"email": "nobody"}).json()
    drain("default")  # the default backend of tests.settings does not retry
    failed = client.get(bad["task_url"]).json()
    assert failed["status"] == "FAILED" and failed["errors"][0]["exception"] == "builtins.ValueError"
    assert client.get("/tasks/999999999/").status_code == 404
    assert client.post("/orders/order:t-150/receipt-copy/", "not json",
                       content_type="application/json").status_code == 400


@pytest.mark.django_db
@shop_urls
def test_unpaid_order_times_out_and_bad_requests_are_refused():
    client = Client()
    resp = post(client, "/orders/", {"number": "t-200", "payment_timeout": 30})
    oid = resp.json()["id"]
    assert post(client, "/orders/", {"number": "t-200"}).status_code == 409  # live key
    assert post(client, "/orders/", {"items": [{"sku": "unicorn"}]}).status_code == 400
    assert post(client, "/orders/", {"payment_timeout": -1}).status_code == 400
    assert client.post("/orders/", "not json", content_type="application/json").status_code == 400
    assert client.get("/orders/").status_code == 405
    assert post(client, "/webhooks/payment/order:nobody/", {}).status_code == 404
    assert client.get("/orders/999999999/result/?timeout=0").status_code == 404
    assert client.get(f"/orders/{oid}/result/?timeout=-1").status_code == 400

    drain("orders")
    assert_awaiting(oid, "payment_confirmed")
    assert fire_timeouts() >= 1
    drain("orders")
    assert_failed(oid, "payment not confirmed within 30s; reservation res-order:t-200 released")
    result = client.get(f"/orders/{oid}/result/?timeout=0").json()
    assert result["status"] == "failed" and result["step"] == "release_stock"


@pytest.mark.django_db
@shop_urls
def test_wrong_amount_and_missing_stock_fail_the_order():
    client = Client()
    short = post(client, "/orders/", {"number": "t-300", "items": [{"sku": "cap", "qty": 1}]}).json()
    big = post(client, "/orders/", {"number": "t-301", "items": [{"sku": "poster", "qty": 5}]}).json()
    drain("orders")
    assert_failed(big["id"], "only 3 poster in stock, 5 ordered")
    assert post(client, short["webhook_url"], {"amount": "1.00"}).status_code == 202
    drain("orders")
    assert_failed(short["id"], "paid '1.00', due 15.25")


@pytest.mark.django_db
def test_send_receipt_retries_then_gives_up():
    flaky = send_receipt.insert(args={"order": "r1", "email": "bob@example.com", "fail_first": 2})
    hopeless = send_receipt.insert(args={"order": "r2", "fail_first": 99})
    tally = drain("email")
    assert tally["retry"] == 2 + 4 and tally["done"] == 1 and tally["stop"] == 1, tally
    assert_done(flaky, {"sent_to": "bob@example.com", "order": "r1", "attempts": 3})
    assert_failed(hopeless, "SMTP server unavailable (simulated, attempt 5)")


@pytest.mark.django_db
def test_pipeline_runs_five_steps():
    ids = gd.insert_all([gd.Spec(Pipeline, state={"n": n}) for n in range(3)])
    tally = drain("default")
    assert tally["next"] >= 12 and tally["done"] >= 3
    for n, id_ in enumerate(ids):
        assert_done(id_, {"n": n, "bucket": n})


# --- scripts/demo: a DATABASE_URL naming a database the server lacks ----------------------

def _url_for(name, **changes):
    """A DATABASE_URL reaching the test server (TCP or a socket directory) for database `name`."""
    from urllib.parse import quote, urlencode

    from django.db import connection

    conf = {**connection.settings_dict, **changes}
    auth = quote(conf["USER"] or "", safe="") + (f":{quote(conf['PASSWORD'], safe='')}" if conf["PASSWORD"] else "")
    query = {k: v for k, v in (("host", conf["HOST"]), ("port", conf["PORT"])) if v not in (None, "")}
    return f"postgresql://{auth}@/{name}?{urlencode(query)}"


def test_ensure_database_creates_the_database_database_url_names(monkeypatch):
    """The new user's `DATABASE_URL=postgres://…/newuser_demo scripts/demo` died after
    bootstrap in `migrate` with `database "newuser_demo" does not exist`."""
    import psycopg

    import devdb

    name = f"gd_demo_created_{os.getpid()}"
    monkeypatch.setenv("DATABASE_URL", _url_for(name))
    try:
        assert devdb.ensure_database() == name
        with psycopg.connect(_url_for(name)) as conn:  # it exists and takes connections
            assert conn.execute("SELECT current_database()").fetchone() == (name,)
        assert devdb.ensure_database() is None  # a second run: nothing to do
    finally:
        with psycopg.connect(_url_for("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_ensure_database_fails_in_one_line_when_the_server_cannot_be_used(monkeypatch):
    import socket

    import devdb

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("DATABASE_URL", f"postgres://someone:s3cret@127.0.0.1:{port}/newuser_demo")
    with pytest.raises(SystemExit) as exc:
        devdb.ensure_database()
    message = str(exc.value.code)
    assert message.startswith("cannot use database 'newuser_demo' of DATABASE_URL=postgres://someone:***@127.0.0.1:")
    assert "\n" not in message and "s3cret" not in message and "refused" in message
    monkeypatch.setenv("DATABASE_URL", "mysql://a@b/c")
    with pytest.raises(SystemExit, match="not a PostgreSQL URL"):
        devdb.ensure_database()
    monkeypatch.delenv("DATABASE_URL")
    assert devdb.ensure_database() is None  # the embedded server: its postgres database exists


@pytest.mark.django_db
@pytest.mark.parametrize("embedded", [True, False])
def test_the_demos_closing_hint_keeps_database_url_when_it_was_used(monkeypatch, embedded):
    from io import StringIO

    import devdb
    from shop.management.commands.demo import Command

    monkeypatch.setattr(devdb, "EMBEDDED", embedded)
    monkeypatch.setenv("DATABASE_URL", "postgres://demo:pw@db.internal:5432/newuser_demo")
    out = StringIO()
    Command(stdout=out).admin_user()
    text = out.getvalue()
    assert "../.venv/bin/python manage.py runserver" in text
    if embedded:
        assert "DATABASE_URL" not in text
    else:
        assert "keep DATABASE_URL set (postgres://demo:***@db.internal:5432/newuser_demo) and run" in text
