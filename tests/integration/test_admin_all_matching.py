"""Admin actions on every instance matching the list's filter ("Select all N", docs/admin.md
"All matching"): more rows than MAX_ACTION_ROWS, run in bounded batches by bulk.py, each
run with a summary LogEntry; filters bulk.py cannot express are refused."""

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

import gen_durable.admin.site as site
from gen_durable.models import Instance
from tests.factories import InstanceFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/gen_durable/instance/"
N = site.MAX_ACTION_ROWS + 200


def _rows(n, **kw):
    return Instance.objects.bulk_create(InstanceFactory.build_batch(n, **kw))


def _all(action, **query):
    from urllib.parse import urlencode

    return reverse("admin:gen_durable_instance_act_all", args=[action]) + "?" + urlencode(query)


def _summaries():
    ct = ContentType.objects.get_for_model(Instance)
    return list(LogEntry.objects.filter(content_type=ct, object_id=None).order_by("id"))


def _gd(captured):
    return [q["sql"] for q in captured.captured_queries if "gen_durable" in q["sql"] and "django_" not in q["sql"]]


def test_select_across_goes_to_the_all_matching_page_with_the_filter(admin_client, queue_name):
    rows = _rows(3, queue=queue_name, status="failed")
    response = admin_client.post(f"{CHANGELIST}?status=failed&queue={queue_name}",
                                 {"action": "retry_selected", "select_across": "1", "index": "0",
                                  "_selected_action": [rows[0].id]})
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:gen_durable_instance_act_all", args=["retry"]))
    page = admin_client.get(response["Location"]).content.decode()
    assert f"status = failed, queue = {queue_name}" in page
    assert 'id="gd-all-count">3<' in page
    # the same filter as a shell command
    assert f"durable_bulk retry --status failed --queue {queue_name}" in page


def test_retry_all_matching_more_than_max_action_rows_and_continue(admin_client, queue_name, monkeypatch):
    monkeypatch.setattr(site, "ALL_BATCHES_PER_REQUEST", 1)  # 1,000 rows per run: two runs
    _rows(N, queue=queue_name, status="failed")
    _rows(5, queue=queue_name, status="done")  # not matched by status=failed
    other = _rows(3, queue=queue_name + "x", status="failed")  # another queue
    url = _all("retry", status="failed", queue=queue_name)
    confirm = admin_client.get(url).content.decode()
    assert f'id="gd-all-count">{N:,}<' in confirm  # exact below the paginator's CAP
    first = admin_client.post(url, {"reason": "smtp back"}, follow=True).content.decode()
    assert "1,000 done, 0 skipped of 1,000 matched" in first and 'id="gd-continue"' in first
    assert Instance.objects.filter(queue=queue_name, status="runnable").count() == 1000
    after = first.split('name="after" value="')[1].split('"')[0]
    top = first.split('name="top" value="')[1].split('"')[0]
    second = admin_client.post(url, {"reason": "smtp back", "after": after, "top": top}, follow=True).content.decode()
    assert 'id="gd-all-finished"' in second
    assert Instance.objects.filter(queue=queue_name, status="failed").count() == 0
    assert Instance.objects.filter(queue=queue_name, status="runnable").count() == N
    assert Instance.objects.filter(id__in=[o.id for o in other], status="failed").count() == 3
    logged = _summaries()
    assert [e.action_flag for e in logged] == [CHANGE, CHANGE]
    assert all(e.user_id == User.objects.get(username="admin").pk for e in logged)
    assert logged[0].change_message.startswith("Retried now (admin action, all matching); reason: smtp back; "
                                               f"filter: status = failed, queue = {queue_name}; ids ")
    assert "1,000 done, 0 skipped of 1,000 matched; not finished" in logged[0].change_message
    assert f"; ids {int(after) + 1}..{top};" in logged[1].change_message  # the continuation walked to the top
    assert f"..{after} of ..{top};" in logged[0].change_message
    assert f"{N - 1000:,} done, 0 skipped of {N - 1000:,} matched" in logged[1].change_message
    assert logged[0].object_repr == f"all matching: status = failed, queue = {queue_name}"


def test_cancel_all_matching_needs_a_reason_and_stores_it(admin_client, queue_name):
    _rows(N, queue=queue_name, status="runnable")
    _rows(4, queue=queue_name, status="done")  # cancel acts on live rows only
    url = _all("cancel", queue=queue_name)
    assert "This field is required" in admin_client.post(url, {"reason": ""}, follow=True).content.decode()
    assert Instance.objects.filter(queue=queue_name, status="runnable").count() == N
    page = admin_client.post(url, {"reason": "bad deploy"}, follow=True).content.decode()
    assert f"{N:,} done, 0 skipped of {N:,} matched" in page and 'id="gd-all-finished"' in page
    assert Instance.objects.filter(queue=queue_name, status="failed", last_error="bad deploy").count() == N
    assert Instance.objects.filter(queue=queue_name, status="done").count() == 4
    (entry,) = _summaries()
    assert entry.change_message.startswith("Cancelled (admin action, all matching); reason: bad deploy; "
                                           f"filter: queue = {queue_name};")


def test_move_all_matching_validates_the_target_queue(admin_client, queue_name):
    _rows(N, queue=queue_name, status="runnable")
    executing = _rows(2, queue=queue_name, status="executing", locked_by="w")
    url = _all("move", queue=queue_name)
    typo = admin_client.post(url, {"to_queue": "emial"}, follow=True).content.decode()
    assert "queue &#x27;emial&#x27; is not declared" in typo and "did you mean" in typo
    # The shell line is offered only for a valid target: the typo is not repeated there.
    command = typo.split('id="gd-all-command">')[1].split("<")[0]
    assert "emial" not in command and command.endswith("--to-queue QUEUE")
    assert _summaries() == []
    page = admin_client.post(url, {"to_queue": queue_name + "_slow", "reason": "overloaded"}, follow=True).content.decode()
    assert f"{N:,} done" in page
    assert Instance.objects.filter(queue=queue_name + "_slow").count() == N
    assert Instance.objects.filter(id__in=[e.id for e in executing], queue=queue_name).count() == 2
    (entry,) = _summaries()
    assert f"Moved to queue '{queue_name}_slow' (admin action, all matching); reason: overloaded" in entry.change_message


@pytest.mark.parametrize("query, named", [
    ({"q": "order:1"}, "the search 'order:1'"),
    ({"parent": "5"}, "the filter parent='5'"),
    ({"updated_at__gte": "2026-01-01"}, "the filter updated_at__gte='2026-01-01'"),
    ({"status": "nope"}, "the status 'nope'"),
])
def test_a_filter_bulk_cannot_express_is_refused_not_widened(admin_client, queue_name, query, named):
    rows = _rows(3, queue=queue_name, status="runnable")
    url = _all("cancel", queue=queue_name, **query)
    for response in (admin_client.get(url), admin_client.post(url, {"reason": "x"})):
        body = response.content.decode()
        assert 'id="gd-refused"' in body and named.replace("'", "&#x27;") in body and 'id="gd-confirm"' not in body
    assert Instance.objects.filter(id__in=[r.id for r in rows], status="runnable").count() == 3
    assert _summaries() == []


def test_signal_has_no_all_matching_form(admin_client, queue_name):
    rows = _rows(2, queue=queue_name)
    response = admin_client.post(f"{CHANGELIST}?queue={queue_name}",
                                 {"action": "signal_selected", "select_across": "1", "index": "0",
                                  "_selected_action": [rows[0].id]}, follow=True)
    assert "applies to selected instances only" in response.content.decode()
    assert admin_client.get(reverse("admin:gen_durable_instance_act_all", args=["signal"])).status_code == 404


def test_view_only_staff_are_refused(client, queue_name):
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="gen_durable",
                                                         codename__startswith="view_"))
    client.force_login(user)
    rows = _rows(3, queue=queue_name, status="failed")
    url = _all("retry", queue=queue_name)
    assert client.get(url).status_code == 403
    assert client.post(url, {"reason": "x"}).status_code == 403
    client.post(f"{CHANGELIST}?queue={queue_name}", {"action": "retry_selected", "select_across": "1",
                                                     "index": "0", "_selected_action": [rows[0].id]})
    assert Instance.objects.filter(queue=queue_name, status="failed").count() == 3
    assert _summaries() == []


def test_statements_are_bounded_per_batch(admin_client, queue_name):
    _rows(N, queue=queue_name, status="runnable")
    url = _all("move", queue=queue_name)
    with CaptureQueriesContext(connection) as captured:
        admin_client.post(url, {"to_queue": queue_name + "_b"})
    statements = _gd(captured)
    reads = [s for s in statements if "bulk_select" in s]
    moves = [s for s in statements if "bulk_move" in s]
    # min/max once, then per batch of 1,000: one keyset read, one UPDATE — no statement per row
    assert (len(statements), len(reads), len(moves)) == (5, 2, 2)
    with CaptureQueriesContext(connection) as captured:
        admin_client.post(_all("cancel", queue=queue_name + "_b"), {"reason": "r"})
    statements = _gd(captured)
    # cancel is gd.cancel per row (its own guarded statement): min/max, 2 reads, N cancels
    assert len([s for s in statements if "bulk_select" in s]) == 2
    assert len(statements) == 1 + 2 + N


def test_the_bounded_count_past_the_cap(admin_client, queue_name, monkeypatch):
    import gen_durable.admin.paging as paging

    _rows(3, queue=queue_name, status="failed")
    monkeypatch.setattr(paging, "planner_rows", lambda qs: 200_000)
    page = admin_client.get(_all("retry", queue=queue_name, status="failed")).content.decode()
    assert "more than 10,000 (the planner estimates ≈ 200,000)" in page


def test_move_selected_rows(admin_client, queue_name):
    rows = _rows(3, queue=queue_name, status="runnable")
    done = _rows(1, queue=queue_name, status="done")
    ids = [r.id for r in rows + done]
    url = reverse("admin:gen_durable_instance_act", args=["move"]) + "?ids=" + ",".join(map(str, ids))
    admin_client.post(url, {"ids": ",".join(map(str, ids)), "to_queue": queue_name + "_b", "reason": "rebalance"})
    assert Instance.objects.filter(queue=queue_name + "_b").count() == 3
    assert Instance.objects.get(id=done[0].id).queue == queue_name
    ct = ContentType.objects.get_for_model(Instance)
    assert LogEntry.objects.filter(content_type=ct, object_id=str(rows[0].id)).get().change_message == (
        f"Moved to queue '{queue_name}_b' (admin action); reason: rebalance")


def test_retry_without_a_status_filter_takes_failed_only_as_retry_where(admin_client, queue_name):
    failed = _rows(2, queue=queue_name, status="failed")
    _rows(3, queue=queue_name, status="done")  # never read to be skipped
    _rows(1, queue=queue_name, status="awaiting_children")
    parked = _rows(2, queue=queue_name, status="awaiting_signal")
    scheduled = _rows(2, queue=queue_name, status="runnable")
    eligible = dict(Instance.objects.filter(id__in=[r.id for r in scheduled]).values_list("id", "eligible_at"))
    url = _all("retry", queue=queue_name)
    confirm = admin_client.get(url).content.decode()
    assert "<td>failed</td>" in confirm and 'id="gd-all-count">2<' in confirm
    assert f"durable_bulk retry --queue {queue_name} --status failed</code>" in confirm
    page = admin_client.post(url, {"reason": ""}, follow=True).content.decode()
    assert "2 done, 0 skipped of 2 matched" in page
    assert set(Instance.objects.filter(id__in=[r.id for r in failed]).values_list("status", flat=True)) == {"runnable"}
    # Negative control: the parked and scheduled rows were not woken.
    assert set(Instance.objects.filter(id__in=[r.id for r in parked]).values_list("status", flat=True)) == {
        "awaiting_signal"}
    assert dict(Instance.objects.filter(id__in=eligible).values_list("id", "eligible_at")) == eligible


def test_retry_all_matching_still_wakes_parked_rows_when_asked(admin_client, queue_name):
    parked = _rows(2, queue=queue_name, status="awaiting_signal")
    url = _all("retry", queue=queue_name, status="awaiting_signal")
    confirm = admin_client.get(url).content.decode()
    assert f"--status awaiting_signal --queue {queue_name}" in confirm and 'id="gd-all-count">2<' in confirm
    assert "2 done" in admin_client.post(url, {"reason": ""}, follow=True).content.decode()
    assert not Instance.objects.filter(id__in=[r.id for r in parked], status="awaiting_signal").exists()


def _result(page):
    return page.split('id="gd-all-result">')[1].split("</td>")[0]


def test_next_off_site_is_not_followed_by_the_back_links(admin_client, queue_name):
    _rows(1, queue=queue_name, status="failed")
    for evil in ("//evil.example/x", "https://evil.example/x", "/\\evil.example/x"):
        page = admin_client.get(_all("cancel", queue=queue_name, next=evil)).content.decode()
        assert f'href="{evil}"' not in page
        assert f'href="{CHANGELIST}"' in page  # the list instead
    page = admin_client.get(_all("cancel", queue=queue_name, next=f"{CHANGELIST}?queue={queue_name}")).content.decode()
    assert f'href="{CHANGELIST}?queue={queue_name}"' in page  # a path on this site is kept


@pytest.mark.parametrize("after, top, why", [
    (str(2**70), str(2**70 + 5), "out of range"),
    ("abc", "TOP", "not ids"),
    ("-1", "TOP", "not ids"),
    ("", "TOP", "needs both"),
    ("5", "", "needs both"),
    ("TOP", "5", "out of range"),  # after past top
])
def test_a_tampered_continue_is_refused_and_acts_on_nothing(admin_client, queue_name, monkeypatch, after, top, why):
    monkeypatch.setattr(site, "ALL_BATCHES_PER_REQUEST", 1)
    monkeypatch.setattr(site, "ALL_BATCH", 10)  # 10 rows per run: small tables
    _rows(15, queue=queue_name, status="failed")
    url = _all("retry", status="failed", queue=queue_name)
    first = admin_client.post(url, {}, follow=True).content.decode()
    real_top = first.split('name="top" value="')[1].split('"')[0]
    Instance.objects.filter(queue=queue_name, status="runnable").update(status="failed")  # they failed again
    response = admin_client.post(url, {"after": after.replace("TOP", real_top), "top": top.replace("TOP", real_top)})
    assert response.status_code == 400
    page = response.content.decode()
    assert 'id="gd-bad-continue"' in page and why in page
    assert Instance.objects.filter(queue=queue_name, status="failed").count() == 15  # nothing retried
    assert len(_summaries()) == 1  # the first run only


def test_the_result_page_is_reached_by_a_redirect_and_a_reload_acts_on_nothing(admin_client, queue_name, monkeypatch):
    monkeypatch.setattr(site, "ALL_BATCHES_PER_REQUEST", 1)
    monkeypatch.setattr(site, "ALL_BATCH", 10)
    _rows(12, queue=queue_name, status="failed")
    url = _all("retry", status="failed", queue=queue_name)
    confirm = admin_client.get(url).content.decode()
    token = confirm.split('name="run" value="')[1].split('"')[0]
    response = admin_client.post(url, {"reason": "r", "run": token})
    assert response.status_code == 302
    location = response["Location"]
    assert f"run={token}" in location and "after=" in location and "top=" in location  # the Continue state
    Instance.objects.filter(queue=queue_name).update(status="failed")  # they failed again
    for _reload in range(2):
        page = admin_client.get(location).content.decode()
        assert "10 done, 0 skipped of 10 matched" in _result(page) and 'id="gd-continue"' in page
    # the first form sent again (a browser's "resend"): shown, not run
    again = admin_client.post(url, {"reason": "r", "run": token}, follow=True).content.decode()
    assert "already been done" in again
    assert Instance.objects.filter(queue=queue_name, status="failed").count() == 12
    assert len(_summaries()) == 1
    # Continue from the result page: its own token, the rest of the rows
    after = page.split('name="after" value="')[1].split('"')[0]
    top = page.split('name="top" value="')[1].split('"')[0]
    next_token = page.split('name="run" value="')[1].split('"')[0]
    assert next_token != token
    done = admin_client.post(location, {"reason": "r", "after": after, "top": top, "run": next_token}, follow=True)
    assert 'id="gd-all-finished"' in done.content.decode()
    assert Instance.objects.filter(queue=queue_name, status="runnable").count() == 2
    assert len(_summaries()) == 2


@pytest.mark.parametrize("action, status", [("retry", "executing"), ("retry", "done"), ("retry", "awaiting_children"),
                                            ("move", "executing"), ("move", "done"), ("cancel", "done"),
                                            ("cancel", "failed")])
def test_a_status_the_action_cannot_act_on_is_said_plainly_and_counts_0(admin_client, queue_name, action, status):
    _rows(4, queue=queue_name, status=status)
    url = _all(action, status=status, queue=queue_name)
    page = admin_client.get(url).content.decode()
    assert 'id="gd-all-count">0<' in page
    assert f"This action does nothing to {status} rows" in page and 'id="gd-confirm"' not in page
    assert f"<td>{status}</td>" not in page  # not listed as a status acted on
    response = admin_client.post(url, {"reason": "x", "to_queue": queue_name + "_b"})
    assert response.status_code == 400
    assert Instance.objects.filter(queue=queue_name, status=status).count() == 4
    assert _summaries() == []


def test_a_gap_in_the_id_space_is_jumped_over_in_one_run(admin_client, queue_name):
    base = 10**12  # an old parked row, then (after rows since deleted) the matching ones 3,000,000 ids later
    Instance.objects.bulk_create([InstanceFactory.build(id=base, queue=queue_name + "_old", status="awaiting_signal")])
    Instance.objects.bulk_create([InstanceFactory.build(id=base + 3_000_000 + i, queue=queue_name, status="failed")
                                  for i in range(10)])
    url = _all("retry", status="failed", queue=queue_name)
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.post(url, {}, follow=True).content.decode()
    assert "10 done, 0 skipped of 10 matched" in _result(page) and 'id="gd-all-finished"' in page
    assert Instance.objects.filter(queue=queue_name, status="runnable").count() == 10
    statements = _gd(captured)
    # min/max, the empty window after the old row, one jump (bulk_next), the window with the rows
    assert len([s for s in statements if "bulk_select" in s]) == 2
    assert len([s for s in statements if "bulk_next" in s]) == 1


def test_a_database_error_part_way_still_logs_the_partial_counts(admin_client, queue_name, monkeypatch):
    from django.db import OperationalError

    from gen_durable import calls

    _rows(10, queue=queue_name, status="runnable")
    real, seen = calls.cancel, []

    def times_out_on_the_sixth(id_, reason, using=None):
        seen.append(id_)
        if len(seen) == 6:
            raise OperationalError("canceling statement due to statement timeout")
        return real(id_, reason, using=using)

    monkeypatch.setattr(calls, "cancel", times_out_on_the_sixth)
    response = admin_client.post(_all("cancel", queue=queue_name), {"reason": "bad deploy"}, follow=True)
    assert response.status_code == 200
    assert Instance.objects.filter(queue=queue_name, status="failed", last_error="bad deploy").count() == 5
    (entry,) = _summaries()
    assert "5 done, 0 skipped of 10 matched; not finished; interrupted: OperationalError: canceling statement" \
        in entry.change_message
    page = response.content.decode()
    assert "interrupted by a database error after 5 done" in page  # the admin's error message
    assert "interrupted: canceling statement" in _result(page)
    assert 'id="gd-continue"' in page  # carries on from where it stopped
    monkeypatch.setattr(calls, "cancel", real)
    after = page.split('name="after" value="')[1].split('"')[0]
    assert int(after) == seen[5] - 1  # a Continue starts at the row the error stopped on


@pytest.mark.django_db(databases=["default", "other"])
def test_the_summary_names_a_database_that_is_not_the_default(admin_client, queue_name):
    Instance.objects.using("other").bulk_create(InstanceFactory.build_batch(2, queue=queue_name, status="runnable"))
    admin_client.post(_all("cancel", queue=queue_name, database="other"), {"reason": "x", "database": "other"})
    assert Instance.objects.using("other").filter(queue=queue_name, status="failed").count() == 2
    (entry,) = _summaries()
    assert f"filter: queue = {queue_name}; database: other; ids " in entry.change_message
    assert entry.object_repr == f"all matching: queue = {queue_name}; database: other"
