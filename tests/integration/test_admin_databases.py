"""The admin across databases: `?database=ALIAS` on the changelist, detail, actions and
overview (docs/admin.md)."""

import pytest
from django.urls import reverse

import gen_durable as gd
from gen_durable.models import Instance
from tests.durable_app.durable import Plain

pytestmark = pytest.mark.django_db(databases=["default", "other"])

CHANGELIST = "/admin/gen_durable/instance/"
OVERVIEW = "/admin/gen_durable/queueoverview/"


@pytest.fixture
def rows(queue_name):
    """One instance on each database, each in a queue of its own."""
    return {"default": (gd.insert(Plain, queue=queue_name + "-d"), queue_name + "-d"),
            "other": (gd.insert(Plain, queue=queue_name + "-o", using="other"), queue_name + "-o")}


def test_the_changelist_shows_the_selected_databases_rows(admin_client, rows):
    default = admin_client.get(CHANGELIST).content.decode()
    other = admin_client.get(CHANGELIST + "?database=other").content.decode()
    assert rows["default"][1] in default and rows["other"][1] not in default
    assert rows["other"][1] in other and rows["default"][1] not in other
    # Filters keep the selector: a status filter on "other" still lists "other"'s row.
    filtered = admin_client.get(CHANGELIST + "?database=other&status=runnable").content.decode()
    assert rows["other"][1] in filtered and rows["default"][1] not in filtered


def test_an_unknown_database_is_a_404(admin_client):
    assert admin_client.get(CHANGELIST + "?database=nope").status_code == 404
    assert admin_client.get(OVERVIEW + "?database=nope").status_code == 404


def test_two_databases_in_one_request_are_a_400(admin_client):
    """Which database an action runs on is never a guess: on main the last value won."""
    assert admin_client.get(CHANGELIST + "?database=default&database=other").status_code == 400
    assert admin_client.get(OVERVIEW + "?database=other&database=default").status_code == 400
    assert admin_client.post(CHANGELIST + "?database=default", {"database": "other"}).status_code == 400
    assert admin_client.get(CHANGELIST + "?database=other&database=other").status_code == 200


def test_the_detail_page_reads_the_selected_database(admin_client, rows):
    id_, queue = rows["other"]
    url = reverse("admin:gen_durable_instance_change", args=[id_])
    page = admin_client.get(url + "?database=other")
    assert page.status_code == 200 and queue in page.content.decode()
    assert "(database other)" in page.content.decode()
    # From the changelist, Django keeps the filters in _changelist_filters: the same page.
    kept = admin_client.get(url + "?_changelist_filters=database%3Dother")
    assert kept.status_code == 200 and queue in kept.content.decode()
    # Without the selector the page reads default, where this id is another row or none.
    plain = admin_client.get(url)
    assert plain.status_code in (200, 302) and queue not in plain.content.decode()


def test_actions_run_on_the_selected_database(admin_client, rows):
    id_, _queue = rows["other"]
    url = reverse("admin:gen_durable_instance_act", args=["cancel"])
    confirm = admin_client.get(url + f"?ids={id_}&database=other")
    assert confirm.status_code == 200 and 'name="database" value="other"' in confirm.content.decode()
    done = admin_client.post(url, {"ids": str(id_), "reason": "from the admin", "database": "other",
                                   "next": CHANGELIST + "?database=other"})
    assert done.status_code == 302
    row = Instance.objects.using("other").get(id=id_)
    assert (row.status, row.last_error) == ("failed", "from the admin")
    # default's row of the same id is untouched
    assert Instance.objects.using("default").get(id=rows["default"][0]).status == "runnable"


def test_the_overview_shows_the_selected_database_and_pauses_there(admin_client, rows):
    other = admin_client.get(OVERVIEW + "?database=other").content.decode()
    assert rows["other"][1] in other and rows["default"][1] not in other
    assert "Queue overview (database other)" in other
    assert f'?queue={rows["other"][1]}&amp;database=other' in other  # the queue's link keeps the database
    admin_client.post(OVERVIEW + "pause/", {"queue": rows["other"][1], "op": "pause", "database": "other"})
    assert gd.paused_queues(using="other") == [rows["other"][1]]
    assert rows["other"][1] not in gd.paused_queues()


def test_the_selector_lists_the_routed_databases(admin_client, rows, settings):
    # Without routes there is one engine database: no selector.
    assert 'id="gd-databases"' not in admin_client.get(OVERVIEW).content.decode()
    assert 'data-filter-title="database"' not in admin_client.get(CHANGELIST).content.decode()
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "DATABASES": {"QUEUES": {rows["other"][1]: "other"}}}
    page = admin_client.get(OVERVIEW).content.decode()
    assert 'id="gd-databases"' in page and '<a href="?database=other">other</a>' in page
    assert 'data-filter-title="database"' in admin_client.get(CHANGELIST).content.decode()
