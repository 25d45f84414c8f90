"""A finished or failed instance is found by its correlation key: gd.get(key) and the
admin's search (index gen_durable_correlation_key; docs/guide.md, docs/admin.md)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import drain
from tests.durable_app.durable import AlwaysRaises, Plain

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/gen_durable/instance/"


def test_get_by_key_answers_for_a_done_and_a_failed_instance_in_one_statement(queue_name):
    done = gd.insert(Plain, queue=queue_name, correlation_key=f"{queue_name}:done")
    failed = gd.insert(AlwaysRaises, queue=queue_name, correlation_key=f"{queue_name}:failed")
    drain(queue=queue_name)
    with CaptureQueriesContext(connection) as captured:
        snap = gd.get(f"{queue_name}:done")
    assert len(captured.captured_queries) == 1
    assert (snap.id, snap.status) == (done, "done")
    snap = gd.get(f"{queue_name}:failed")
    assert (snap.id, snap.status, snap.last_error) == (failed, "failed", "ValueError: kaput")
    assert gd.get(f"{queue_name}:nobody") is None


def test_the_live_holder_of_a_key_comes_first_then_the_newest_finished(queue_name):
    key = f"{queue_name}:order"
    first = gd.insert(Plain, queue=queue_name, correlation_key=key)
    drain(queue=queue_name)
    assert gd.get(key).id == first  # finished: still found
    second = gd.insert(Plain, queue=queue_name, correlation_key=key)  # the key was released: reusable
    assert (gd.get(key).id, gd.get(key).status) == (second, "runnable")
    drain(queue=queue_name)
    assert (gd.get(key).id, gd.get(key).status) == (second, "done")  # both finished: the newest


def test_admin_search_finds_finished_instances_by_key(admin_client, queue_name):
    key = f"{queue_name}:invoice"
    old = gd.insert(Plain, queue=queue_name, correlation_key=key)
    drain(queue=queue_name)
    live = gd.insert(Plain, queue=queue_name, correlation_key=key)
    body = admin_client.get(CHANGELIST, {"q": key}).content.decode()
    assert f">{old}<" in body and f">{live}<" in body
    assert f">{old}<" in admin_client.get(CHANGELIST, {"q": key, "status": "done"}).content.decode()
    assert f">{old}<" not in admin_client.get(CHANGELIST, {"q": key[:-1]}).content.decode()  # exact only


def test_await_result_by_key_answers_once_the_instance_is_done(queue_name):
    key = f"{queue_name}:order:1"
    id_ = gd.insert(Plain, queue=queue_name, correlation_key=key)
    drain(queue=queue_name)
    result = gd.await_result(key, timeout=0)
    assert (result.status, result.snapshot.id) == ("done", id_)  # was not_found once the key was released
