"""Admin actions leave an audit trail: one django.contrib.admin LogEntry per changed
instance (who, when, what, why), on the instance's History page (docs/admin.md)."""

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import gen_durable as gd
from gen_durable.models import Instance, QueueOverview
from tests.durable_app.durable import Plain
from tests.durable_app.signal_machines import Recorder

pytestmark = pytest.mark.django_db


def _act(action, *ids):
    return reverse("admin:gen_durable_instance_act", args=[action]) + "?ids=" + ",".join(map(str, ids))


def _entries(id_):
    return list(LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(Instance),
                                        object_id=str(id_)).order_by("id"))


def test_cancel_retry_and_signal_each_leave_a_log_entry_with_who_and_why(admin_client, queue_name):
    admin = User.objects.get(username="admin")
    parked = gd.insert(Recorder, state={"names": ["go"]}, queue=queue_name)
    Instance.objects.filter(id=parked).update(status="awaiting_signal", awaits=["go"])
    admin_client.post(_act("signal", parked), {"ids": str(parked), "name": "go", "payload": '{"a": 1}',
                                                "dedup_key": "k1", "reason": "customer paid by phone"})
    admin_client.post(_act("cancel", parked), {"ids": str(parked), "reason": "duplicate order"})
    admin_client.post(_act("retry", parked), {"ids": str(parked), "reason": ""})
    entries = _entries(parked)
    assert [e.action_flag for e in entries] == [CHANGE] * 3
    assert all(e.user_id == admin.pk and e.action_time is not None for e in entries)
    messages = [e.get_change_message() for e in entries]
    assert messages[0] == ("Delivered signal 'go' (admin action), dedup key 'k1', payload {\"a\": 1}; "
                           "reason: customer paid by phone")
    assert messages[1] == "Cancelled (admin action); reason: duplicate order"
    assert messages[2] == "Retried now (admin action); no reason given"
    assert f"#{parked}" in entries[1].object_repr and "failed" in entries[1].object_repr


def test_the_log_is_on_the_instance_history_page(admin_client, queue_name):
    id_ = gd.insert(Plain, queue=queue_name)
    admin_client.post(_act("cancel", id_), {"ids": str(id_), "reason": "smtp outage, resend later"})
    change = admin_client.get(reverse("admin:gen_durable_instance_change", args=[id_])).content.decode()
    history_url = reverse("admin:gen_durable_instance_history", args=[id_])
    assert history_url in change  # the History button
    history = admin_client.get(history_url).content.decode()
    assert "Cancelled (admin action); reason: smtp outage, resend later" in history and "admin" in history


def test_a_bulk_action_writes_one_entry_per_changed_instance_in_one_insert(admin_client, queue_name):
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(30)]
    finished = gd.insert(Plain, queue=queue_name)
    Instance.objects.filter(id=finished).update(status="done")  # skipped: no entry
    with CaptureQueriesContext(connection) as captured:
        admin_client.post(_act("cancel", *ids, finished), {"ids": ",".join(map(str, ids + [finished])),
                                                           "reason": "bad deploy"})
    inserts = [q["sql"] for q in captured.captured_queries if q["sql"].startswith('INSERT INTO "django_admin_log"')]
    assert len(inserts) == 1
    assert all(len(_entries(i)) == 1 for i in ids) and _entries(finished) == []


def test_pause_and_resume_in_the_overview_are_logged(admin_client, queue_name):
    url = reverse("admin:gen_durable_queueoverview_pause")
    admin_client.post(url, {"queue": queue_name, "op": "pause"})
    admin_client.post(url, {"queue": queue_name, "op": "pause"})  # already paused: nothing changed, no entry
    admin_client.post(url, {"queue": queue_name, "op": "resume"})
    ct = ContentType.objects.get_for_model(QueueOverview, for_concrete_model=False)
    logged = list(LogEntry.objects.filter(content_type=ct, object_id=queue_name).order_by("id")
                  .values_list("change_message", flat=True))
    assert logged == [f"Paused queue '{queue_name}' in the queue overview",
                      f"Resumed queue '{queue_name}' in the queue overview"]
