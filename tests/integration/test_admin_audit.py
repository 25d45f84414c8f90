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


@pytest.mark.django_db(databases=["default", "other"])
def test_an_action_on_another_database_logs_the_rows_it_changed_there(admin_client, queue_name):
    from tests.factories import InstanceFactory

    x = gd.insert(Plain, queue=queue_name, using="other")
    # the default database has another instance with the same id (another machine, another step)
    Instance.objects.using("default").filter(id=x).delete()
    Instance.objects.using("default").bulk_create([InstanceFactory.build(id=x, queue=queue_name, step="decoy_step")])
    admin_client.post(_act("cancel", x) + "&database=other", {"ids": str(x), "reason": "dup", "database": "other"})
    assert Instance.objects.using("other").get(id=x).status == "failed"
    (entry,) = _entries(x)
    assert "decoy_step" not in entry.object_repr and "failed" in entry.object_repr, entry.object_repr
    # and a row only the other database has is logged too
    y = gd.insert(Plain, queue=queue_name, using="other")
    Instance.objects.using("default").filter(id=y).delete()
    Instance.objects.using("other").filter(id=y).update(status="failed")
    admin_client.post(_act("retry", y) + "&database=other", {"ids": str(y), "database": "other"})
    assert Instance.objects.using("other").get(id=y).status == "runnable"
    assert len(_entries(y)) == 1


@pytest.mark.parametrize("evil", ["//evil.example/x", "https://evil.example/x", "/\\evil.example/x"])
def test_next_off_site_is_not_followed(admin_client, queue_name, evil):
    id_ = gd.insert(Plain, queue=queue_name)
    response = admin_client.post(_act("cancel", id_), {"ids": str(id_), "reason": "x", "next": evil})
    assert response.status_code == 302 and response["Location"] == reverse("admin:gen_durable_instance_changelist")
    page = admin_client.get(_act("cancel", id_) + "&next=" + evil).content.decode()
    assert f'href="{evil}"' not in page
    kept = f"{reverse('admin:gen_durable_instance_changelist')}?queue={queue_name}"
    response = admin_client.post(_act("retry", id_), {"ids": str(id_), "next": kept})
    assert response["Location"] == kept  # a path on this site is followed
