"""Every admin list stays bounded at any table size: Django's "Show counts" (facets) is
off, and a count that is the planner's estimate is labelled "≈" (docs/admin.md).
The timings at 1,000,000 rows are in bench/results/admin.md (bench/admin_pages.py)."""

import pytest
from django.contrib import admin
from django.db import connection
from django.test.utils import CaptureQueriesContext

import gen_durable.admin.paging as paging
from gen_durable.models import Bucket, Instance, Signal
from tests.factories import InstanceFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/gen_durable/instance/"


def _gd(captured):
    return [q["sql"] for q in captured.captured_queries if "gen_durable" in q["sql"] and "django_" not in q["sql"]]


@pytest.mark.parametrize("model", [Instance, Signal, Bucket])
def test_facets_are_off_on_the_large_tables(model):
    assert admin.site._registry[model].show_facets is admin.ShowFacets.NEVER


def test_show_counts_runs_no_more_statements_than_the_plain_list(admin_client, queue_name):
    InstanceFactory.create_batch(3, queue=queue_name)
    InstanceFactory(queue=queue_name, status="failed")
    for query in ({"status": "failed"}, {}):
        with CaptureQueriesContext(connection) as plain:
            admin_client.get(CHANGELIST, query)
        with CaptureQueriesContext(connection) as faceted:
            page = admin_client.get(CHANGELIST, {**query, "_facets": "True"})
        assert page.status_code == 200
        assert len(_gd(faceted)) == len(_gd(plain)), _gd(faceted)
        # no per-choice COUNT(... FILTER (WHERE ...)) of the facets, and no toggle offering them
        assert not [s for s in _gd(faceted) if "FILTER (WHERE" in s.upper()]
        assert "Show counts" not in page.content.decode()
        assert page.context["cl"].add_facets is False  # Django's changelist never computes them


def test_an_estimated_count_is_labelled_in_the_footer_and_the_header(admin_client, queue_name, monkeypatch):
    InstanceFactory.create_batch(3, queue=queue_name)
    exact = admin_client.get(CHANGELIST, {"queue": queue_name, "q": ""}).content.decode()
    assert "≈" not in exact
    monkeypatch.setattr(paging, "planner_rows", lambda qs: 999_969)
    body = admin_client.get(CHANGELIST, {"queue": queue_name, "q": "0"}).content.decode()
    assert '<span class="gd-estimate"' in body and "≈</span> 999969 instances" in body
    header = body.split('id="changelist-search"')[1].split("</form>")[0]
    assert "≈</span> 999969 results" in header
