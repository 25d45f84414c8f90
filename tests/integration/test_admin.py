"""The admin: pages, query counts, actions, permissions (docs/admin.md).

Browser tests are in tests/browser/; the scale benchmark in bench/admin_pages.py.
"""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

import gen_durable as gd
from gen_durable.admin.paging import CAP, EstimatedCountPaginator
from gen_durable.models import Instance, Signal
from gen_durable.testing import drain
from tests.durable_app.durable import Confirms, Plain
from tests.durable_app.signal_machines import FanOut, Recorder
from tests.factories import ExecutingFactory, InstanceFactory, TerminalFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/gen_durable/instance/"


def _change(id_):
    return reverse("admin:gen_durable_instance_change", args=[id_])


def _act(action, *ids, next_=None):
    url = reverse("admin:gen_durable_instance_act", args=[action]) + "?ids=" + ",".join(map(str, ids))
    return url + (f"&next={next_}" if next_ else "")


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="gen_durable", codename__startswith="view_"))
    client.force_login(user)
    return client


def _gd_queries(captured):
    return [q["sql"] for q in captured.captured_queries if "gen_durable" in q["sql"] and "django_" not in q["sql"]]


# --- changelist -----------------------------------------------------------------------
def test_changelist_lists_filters_and_searches_without_counting_the_table(admin_client, queue_name):
    ids = [gd.insert(Plain, queue=queue_name, correlation_key=f"{queue_name}:{i}") for i in range(3)]
    TerminalFactory(queue=queue_name, fsm="tests.Plain")
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(CHANGELIST)
    assert page.status_code == 200
    assert all(f">{i}<" in page.content.decode() for i in ids)
    sqls = _gd_queries(captured)
    # one EXPLAIN (the estimate), one capped count (small table), one page of rows
    assert len(sqls) == 3, sqls
    assert sqls[0].startswith("EXPLAIN")
    assert re.search(r"COUNT\(\*\).*FROM \(SELECT .* LIMIT %d\)" % (CAP + 1), sqls[1], re.S), sqls[1]
    assert not any(re.search(r"COUNT\(\*\)", s) and f"LIMIT {CAP + 1}" not in s for s in sqls)
    assert "ORDER BY \"gen_durable\".\"id\" DESC" in sqls[2]

    body = admin_client.get(CHANGELIST, {"status": "done", "queue": queue_name}).content.decode()
    assert f">{ids[0]}<" not in body and "1 instance" in body
    body = admin_client.get(CHANGELIST, {"q": f"{queue_name}:1"}).content.decode()
    assert f'>{ids[1]}<' in body and f'>{ids[0]}<' not in body
    body = admin_client.get(CHANGELIST, {"q": str(ids[2])}).content.decode()
    assert f'>{ids[2]}<' in body and f'>{ids[1]}<' not in body
    # a substring of a key finds nothing: exact lookups only
    assert "0 instances" in admin_client.get(CHANGELIST, {"q": queue_name}).content.decode()


@pytest.mark.parametrize("url, query", [
    (CHANGELIST, {"status": "bogus"}), (CHANGELIST, {"queue": "a\x00b"}), (CHANGELIST, {"fsm": "\x00"}),
    (CHANGELIST, {"correlation_key": "k\x00"}), ("/admin/gen_durable/signal/", {"name": "\x00"}),
], ids=["status", "queue", "fsm", "correlation-key", "signal-name"])
def test_a_filter_postgres_cannot_run_answers_like_a_bad_lookup_not_500(admin_client, url, query):
    # An enum value that does not exist, or a NUL no text column holds, failed in Postgres
    # (500); Django's answer to a bad lookup is the list again with its ?e=1 notice.
    response = admin_client.get(url, query)
    assert (response.status_code, response.headers.get("Location", "").split("?")[-1]) == (302, "e=1")
    assert admin_client.get(url, {"e": "1"}).status_code == 200


def test_filter_choices_come_from_settings_and_registry_not_the_table(admin_client):
    body = admin_client.get(CHANGELIST).content.decode()
    for choice in ("?status=awaiting_children", "?queue=default", "?machine=tests.Counter",
                   "?machine=tests.signals.Recorder"):
        assert choice in body, choice


def test_changelist_sorts_only_by_id():
    from django.contrib import admin

    assert admin.site._registry[Instance].sortable_by == ("id",)
    assert admin.site._registry[Instance].show_full_result_count is False


def test_paginator_shows_the_planner_estimate_above_the_cap(queue_name):
    InstanceFactory.create_batch(3, queue=queue_name)
    qs = Instance.objects.filter(queue=queue_name).order_by("-id")
    pages = EstimatedCountPaginator(qs, 2)
    assert (pages.count, pages.estimated, pages.num_pages) == (3, False, 2)

    import gen_durable.admin.paging as paging

    original = paging.planner_rows
    paging.planner_rows = lambda qs: 5_000_000
    try:
        big = EstimatedCountPaginator(qs, 2)
        assert (big.count, big.estimated) == (5_000_000, True)
        assert list(big.page(2).object_list) == [qs[2]]
    finally:
        paging.planner_rows = original


# --- detail ---------------------------------------------------------------------------
def test_detail_with_10000_inbox_rows_is_bounded(admin_client, queue_name):
    id_ = gd.insert(Recorder, state={"names": ["never"]}, queue=queue_name)
    with connection.cursor() as cur:
        cur.execute("INSERT INTO gen_durable_signals (target_id, name, payload) "
                    "SELECT %s, 'go', jsonb_build_object('i', i) FROM generate_series(1, 10000) i", [id_])
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(_change(id_))
    assert page.status_code == 200
    body = page.content.decode()
    assert body.count("<tr><td>") == 20  # the newest 20 inbox rows
    assert "9,980 more signals" in body and f"?target={id_}" in body
    assert "{&quot;i&quot;: 10000}" in body
    sqls = _gd_queries(captured)
    assert len(sqls) == 5, sqls  # the row, 20 signals, the inbox count, children, the newest 50 timeline entries
    assert all("LIMIT" in s or "COUNT" in s or '"id" = ' in s for s in sqls)
    # the "see all" link lists that inbox
    listing = admin_client.get(reverse("admin:gen_durable_signal_changelist"), {"target": id_})
    assert listing.status_code == 200 and "10000 signals" in listing.content.decode()


def test_detail_pretty_prints_and_links_parent_children_lease_and_await(admin_client, queue_name):
    parent = gd.insert(FanOut, state={"kids": [{"i": 1, "fail": True}, {"i": 2}], "tag": "é"}, queue=queue_name)
    drain(queue=queue_name)
    kids = list(Instance.objects.filter(parent_id=parent).order_by("id"))
    body = admin_client.get(_change(parent)).content.decode()
    assert '&quot;tag&quot;: &quot;é&quot;' in body  # indented JSON, unicode kept
    for kid in kids:
        assert _change(kid.id) in body
    assert "kid 1 failed" in body
    kid_page = admin_client.get(_change(kids[0].id)).content.decode()
    assert f'<a href="{_change(parent)}">#{parent}</a>' in kid_page

    running = ExecutingFactory(queue=queue_name, locked_by="host:q:tok")
    page = admin_client.get(_change(running.id)).content.decode()
    assert "host:q:tok" in page
    # Timestamps to the second, as the list shows them (not Django's "9:35 a.m.").
    lease = timezone.localtime(Instance.objects.get(id=running.id).lease_expires_at)
    assert lease.isoformat(sep=" ", timespec="seconds") in page and "Lease expires at" in page
    parked = gd.insert(Recorder, state={"names": ["go"], "timeout": 600}, queue=queue_name)
    drain(queue=queue_name)
    page = admin_client.get(_change(parked)).content.decode()
    assert "go" in page and "Await deadline" in page


def test_detail_says_what_governs_a_rows_limits_and_flags_an_unknown_rate_limit(admin_client, queue_name, settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"crm": {"allowed": 10, "period": 1}},
                            "CONCURRENCY_LIMITS": {"pdf": {"limit": 4}}}
    stalled = InstanceFactory(fsm="tests.Plain", queue=queue_name, rate_limit="stirpe:7", concurrency_key="pdf:a").id
    page = admin_client.get(_change(stalled)).content.decode()
    assert "stirpe:7 <strong class=\"gd-warning\">not configured in GEN_DURABLE['RATE_LIMITS']" in page
    assert "pdf:a <span class=\"gd-note\">(gate pdf: at most 4 executing for “pdf”)</span>" in page
    fine = gd.insert(Plain, queue=queue_name, rate_limit=("crm", 7), concurrency_key="solo:1")
    page = admin_client.get(_change(fine)).content.decode()
    assert "class=\"gd-warning\"" not in page
    assert "crm:7 <span class=\"gd-note\">(10 per second, burst 10)</span>" in page
    assert "solo:1 <span class=\"gd-note\">(at most one executing per key)</span>" in page


def test_the_detail_page_has_no_form_that_saves(admin_client, queue_name):
    id_ = gd.insert(Plain, queue=queue_name)
    body = admin_client.get(_change(id_)).content.decode()
    assert 'name="_save"' not in body
    assert admin_client.post(_change(id_), {"step": "x"}).status_code == 405
    assert Instance.objects.get(id=id_).step == "start"
    assert admin_client.get("/admin/gen_durable/instance/add/").status_code == 403


# --- actions ----------------------------------------------------------------------------
def test_cancel_action_confirms_then_cancels_with_the_reason(admin_client, queue_name):
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(2)]
    done = gd.insert(Plain, queue=queue_name, schedule_in=0)
    Instance.objects.filter(id=done).update(status="done")
    # bulk: the changelist action redirects to the confirmation page
    response = admin_client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": ids + [done]})
    assert response.status_code == 302 and "/act/cancel/" in response["Location"]
    confirm = admin_client.get(response["Location"])
    assert confirm.status_code == 200 and "Yes, cancel 3 instances" in confirm.content.decode()
    assert Instance.objects.filter(id__in=ids, status="runnable").count() == 2  # nothing yet
    result = admin_client.post(response["Location"].split("?")[0],
                               {"ids": ",".join(map(str, ids + [done])), "reason": "operator said so",
                                "next": CHANGELIST}, follow=True)
    text = result.content.decode()
    assert "Cancelled: 2 instances" in text and "Skipped 1" in text and "already finished" in text
    assert set(Instance.objects.filter(id__in=ids).values_list("status", "last_error")) == {("failed", "operator said so")}


def test_retry_and_signal_actions_per_row(admin_client, queue_name):
    parked = gd.insert(Recorder, state={"names": ["go"]}, queue=queue_name)
    drain(queue=queue_name)
    page = admin_client.get(_change(parked)).content.decode()
    assert "gd-act-signal" in page and "gd-act-retry" in page
    bad = admin_client.post(_act("signal", parked), {"ids": str(parked), "name": "go", "payload": "{nope"})
    assert bad.status_code == 200 and "not valid JSON" in bad.content.decode()
    deep = admin_client.post(_act("signal", parked), {"ids": str(parked), "name": "go",
                                                      "payload": "[" * 100_000 + "]" * 100_000})
    assert deep.status_code == 200 and "nested too deeply to decode" in deep.content.decode()
    assert not Signal.objects.filter(target_id=parked).exists()
    ok = admin_client.post(_act("signal", parked), {"ids": str(parked), "name": "go", "payload": '{"a": 1}',
                                                     "next": _change(parked)}, follow=True)
    assert f"Delivered signal &#x27;go&#x27; to 1 instance (#{parked})." in ok.content.decode()
    assert "wakes nothing" not in ok.content.decode()  # it awaited "go"
    assert Instance.objects.get(id=parked).status == "runnable"
    assert list(Signal.objects.filter(target_id=parked).values_list("payload", flat=True)) == [{"a": 1}]
    other = gd.insert(Recorder, state={"names": ["confirmed"]}, queue=queue_name)
    drain(queue=queue_name)
    typo = admin_client.post(_act("signal", other), {"ids": str(other), "name": "confirmd", "payload": "{}",
                                                     "next": _change(other)}, follow=True).content.decode()
    assert (f"Signal &#x27;confirmd&#x27; wakes nothing yet: #{other} awaits &#x27;confirmed&#x27;. It is stored"
            in typo)
    assert Instance.objects.get(id=other).status == "awaiting_signal"
    never = gd.insert(Confirms, queue=queue_name)  # its only Await names 'confirmed' by a literal
    typo = admin_client.post(_act("signal", never), {"ids": str(never), "name": "confirmd", "payload": "{}",
                                                     "next": _change(never)}, follow=True).content.decode()
    assert ("Signal &#x27;confirmd&#x27; is stored in the inbox but will wake nothing: tests.Confirms&#x27;s "
            "steps await only &#x27;confirmed&#x27; — did you mean &#x27;confirmed&#x27;?" in typo)

    failed = gd.insert(Plain, queue=queue_name)
    Instance.objects.filter(id=failed).update(status="failed", attempt=4)
    admin_client.post(_act("retry", failed), {"ids": str(failed)})
    row = Instance.objects.get(id=failed)
    assert (row.status, row.attempt) == ("runnable", 0)


def test_signal_form_takes_names_and_dedup_keys_as_long_as_the_api_does(admin_client, queue_name):
    """The form's limit is the API's (MAX_NAME_LENGTH, 255), not a narrower one of its own."""
    from gen_durable.outcomes import MAX_NAME_LENGTH

    parked = gd.insert(Recorder, state={"names": ["go"]}, queue=queue_name)
    drain(queue=queue_name)
    page = admin_client.get(_act("signal", parked)).content.decode()
    assert page.count(f'maxlength="{MAX_NAME_LENGTH}"') == 2  # name and dedup key
    name, key = "n" * MAX_NAME_LENGTH, "k" * MAX_NAME_LENGTH
    ok = admin_client.post(_act("signal", parked), {"ids": str(parked), "name": name, "payload": "{}",
                                                     "dedup_key": key}, follow=True)
    assert f"Delivered signal &#x27;{name}&#x27; to 1 instance (#{parked})." in ok.content.decode()
    assert list(Signal.objects.filter(target_id=parked).values_list("name", "dedup_key")) == [(name, key)]
    too_long = admin_client.post(_act("signal", parked), {"ids": str(parked), "name": name + "n", "payload": "{}"})
    assert too_long.status_code == 200 and "Ensure this value has at most 255 characters" in too_long.content.decode()
    assert Signal.objects.filter(target_id=parked).count() == 1


def test_action_selection_is_capped(admin_client, queue_name, monkeypatch):
    import gen_durable.admin.site as gd_admin

    monkeypatch.setattr(gd_admin, "MAX_ACTION_ROWS", 2)
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(3)]
    response = admin_client.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": ids}, follow=True)
    assert "Select at most 2 instances" in response.content.decode()
    assert Instance.objects.filter(id__in=ids, status="runnable").count() == 3


def test_view_only_staff_see_everything_and_change_nothing(viewer, queue_name):
    id_ = gd.insert(Plain, queue=queue_name)
    page = viewer.get(_change(id_))
    assert page.status_code == 200 and "gd-act-cancel" not in page.content.decode()
    listing = viewer.get(CHANGELIST).content.decode()
    assert "cancel_selected" not in listing
    assert viewer.get(_act("cancel", id_)).status_code == 403
    assert viewer.post(_act("cancel", id_), {"ids": str(id_), "reason": "x"}).status_code == 403
    assert viewer.post(CHANGELIST, {"action": "cancel_selected", "_selected_action": [id_]}).status_code in (200, 302)
    assert Instance.objects.get(id=id_).status == "runnable"
    overview = viewer.get(reverse("admin:gen_durable_queueoverview_changelist"))
    assert overview.status_code == 200 and 'class="gd-pause"' not in overview.content.decode()
    assert viewer.post(reverse("admin:gen_durable_queueoverview_pause"), {"queue": queue_name, "op": "pause"}).status_code == 403
    assert queue_name not in gd.paused_queues()
    for model in ("signal", "bucket", "bucketconfig"):
        assert viewer.get(f"/admin/gen_durable/{model}/").status_code == 200


# --- overview --------------------------------------------------------------------------
def test_admin_index_links_the_overview(admin_client):
    body = admin_client.get("/admin/").content.decode()
    assert reverse("admin:gen_durable_queueoverview_changelist") in body and "Queue overview" in body


def test_overview_counts_ages_unserved_queues_and_chart_in_fixed_queries(admin_client, queue_name):
    served, lonely = f"{queue_name}_served", f"{queue_name}_lonely"
    for q in (served, lonely):
        gd.insert(Plain, queue=q)
    ExecutingFactory(queue=served, locked_by=f"h:{served}:tok1")
    TerminalFactory(queue=served)
    with connection.cursor() as cur:
        cur.execute("INSERT INTO gen_durable_workers (id, host, pid, queues) VALUES ('tok1', 'h', 1, %s)", [[served]])
        cur.execute("UPDATE gen_durable SET eligible_at = now() - interval '2 hours' WHERE queue = %s", [lonely])
        cur.execute("ANALYZE gen_durable")
    gd.pause_queue(served)
    url = reverse("admin:gen_durable_queueoverview_changelist")
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(url)
    assert page.status_code == 200
    body = page.content.decode()
    sqls = _gd_queries(captured)
    assert len(sqls) == 12, sqls
    assert not any("COUNT(*)" in s.upper() and "LIMIT" not in s.upper() and "status = 'executing'" not in s
                   and "TABLESAMPLE" not in s
                   and "gen_durable_gc" not in s and "updated_at" not in s
                   and "unknown_since IS NOT NULL" not in s for s in sqls)  # its index holds only those rows (tests/plans)
    row = re.search(rf'<tr id="gd-queue-{re.escape(lonely)}">(.*?)</tr>', body, re.S).group(1)
    assert "2.0 h" in row and "unserved" in row
    served_row = re.search(rf'<tr id="gd-queue-{re.escape(served)}">(.*?)</tr>', body, re.S).group(1)
    assert "paused" in served_row and "Resume" in served_row and "unserved" not in served_row
    assert "gd-unserved" in body and lonely in body
    assert f"h:{served}:tok1" in body
    assert '<svg class="gd-chart"' in body and body.count('<rect class="bar"') == 60
    assert "<script" not in body.split('id="gd-overview"')[1].split("</div>")[0]

    # more queues cost no more statements
    for i in range(5):
        gd.insert(Plain, queue=f"{queue_name}_x{i}")
    with CaptureQueriesContext(connection) as captured:
        admin_client.get(url)
    assert len(_gd_queries(captured)) == 12


def test_overview_pause_and_resume_buttons(admin_client, queue_name):
    url = reverse("admin:gen_durable_queueoverview_pause")
    admin_client.post(url, {"queue": queue_name, "op": "pause"})
    assert queue_name in gd.paused_queues()
    page = admin_client.get(reverse("admin:gen_durable_queueoverview_changelist")).content.decode()
    assert queue_name in page
    response = admin_client.post(url, {"queue": queue_name, "op": "resume"}, follow=True)
    assert f"Queue &#x27;{queue_name}&#x27; resumed." in response.content.decode()
    assert queue_name not in gd.paused_queues()
    assert admin_client.get(url).status_code == 405


def test_a_django_task_row_shows_its_function_path_and_attempt_log(admin_client, queue_name):
    row = InstanceFactory(fsm="shop.tasks.send_receipt_copy", step="perform", queue=queue_name, status="failed",
                          attempt_log=[{"worker": "h:q:tok", "error": "SMTPError: down"}])
    listing = admin_client.get(CHANGELIST, {"queue": queue_name}).content.decode()
    assert "shop.tasks.send_receipt_copy" in listing
    detail = admin_client.get(_change(row.id)).content.decode()
    assert "SMTPError: down" in detail and "Attempt log" in detail
    # A machine's row keeps no attempt log (its timeline has the attempts): no empty field.
    machine_row = InstanceFactory(queue=queue_name, status="failed", last_error="RuntimeError: x")
    assert "Attempt log" not in admin_client.get(_change(machine_row.id)).content.decode()


def test_detail_flags_a_weight_above_the_burst_of_a_rate_limit_lowered_after_insert(
        admin_client, queue_name, settings):
    """A row whose weight exceeds its rate limit's burst is never admitted (re-offered
    every minute): the page says so, as it does for an unconfigured name."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"crm": {"allowed": 10, "period": 1}}}
    heavy = gd.insert(Plain, queue=queue_name, rate_limit=("crm", 7), weight=8)
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "RATE_LIMITS": {"crm": {"allowed": 10, "period": 1, "burst": 5}}}
    page = admin_client.get(_change(heavy)).content.decode()
    assert "crm:7 <strong class=\"gd-warning\">weight 8 exceeds the burst 5" in page
