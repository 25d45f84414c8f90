"""The queue overview's done / failed / awaiting counts do not depend on ANALYZE
(docs/admin.md, "Queue overview"): done and failed are counted through their partial
indexes (a lower bound "≥" past COUNT_CAP), awaiting rows are counted exactly on a small
table and estimated from a bounded sample — said so — on a large one whose statistics
are missing or stale."""

import re

import pytest
from django.urls import reverse

import gen_durable.admin.overview as overview
from gen_durable.models import Instance
from tests.factories import InstanceFactory

pytestmark = pytest.mark.django_db

URL = "/admin/gen_durable/queueoverview/"


def _cells(body, queue):
    row = re.search(rf'<tr id="gd-queue-{re.escape(queue)}">(.*?)</tr>', body, re.S).group(1)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    return dict(zip(("queue", "runnable", "due", "oldest", "executing", "awaiting_signal", "awaiting_children",
                     "done", "failed"), cells))


def _rows(queue, **per_status):
    for status, n in per_status.items():
        Instance.objects.bulk_create(InstanceFactory.build_batch(n, queue=queue, status=status))


def test_counts_are_exact_without_analyze(clean_tables, admin_client, queue_name, settings):
    # clean_tables: a table the earlier tests' rolled-back rows grew past SAMPLE_PAGES
    # would take the sampled path; a small table is the case under test.
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "QUEUES": {**settings.GEN_DURABLE["QUEUES"], queue_name: 1}}
    _rows(queue_name, failed=3, done=2, awaiting_signal=4, awaiting_children=1)
    body = admin_client.get(URL).content.decode()
    cells = _cells(body, queue_name)
    assert (cells["awaiting_signal"], cells["awaiting_children"], cells["done"], cells["failed"]) == ("4", "1", "2", "3")
    assert "·" not in body.split('id="gd-queues"')[1].split("</table>")[0]
    assert "Awaiting rows are counted exactly" in body


def test_past_the_cap_done_and_failed_are_lower_bounds(admin_client, queue_name, settings, monkeypatch):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "QUEUES": {**settings.GEN_DURABLE["QUEUES"], queue_name: 1}}
    monkeypatch.setattr(overview, "COUNT_CAP", 2)
    _rows(queue_name, failed=5)
    cells = _cells(admin_client.get(URL).content.decode(), queue_name)
    assert cells["failed"].startswith("≥ ") and cells["done"].startswith("≥ ")
    body = admin_client.get(URL).content.decode()
    assert "“≥ N” means at least N" in body


def test_a_large_table_with_stale_statistics_is_sampled_and_says_so(admin_client, queue_name, settings,
                                                                     monkeypatch):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "QUEUES": {**settings.GEN_DURABLE["QUEUES"], queue_name: 1}}
    _rows(queue_name, awaiting_signal=2)
    real = overview.statistics
    monkeypatch.setattr(overview, "statistics", lambda using=None: {
        **real(using), "pages": 35_000, "fresh": False, "analyzed": None})
    body = admin_client.get(URL).content.decode()
    assert _cells(body, queue_name)["awaiting_signal"].startswith("≈ ")
    assert "estimated from a sample of 1,000 of the table's 35,000 pages read now" in body
    assert "the table has not been analysed yet" in body


def test_the_sorts_off_setting_stays_inside_its_savepoint(admin_client):
    """The overview turns sorts off for its capped counts only: the request's (here the
    test's) transaction has them on again afterwards."""
    from django.db import connection

    assert connection.in_atomic_block  # the test's transaction, as ATOMIC_REQUESTS would be
    admin_client.get(URL)
    with connection.cursor() as cur:
        cur.execute("SHOW enable_sort")
        assert cur.fetchone()[0] == "on"
