"""Failures at a glance: a truncated error column on the instances list and the failed
rows in the overview's completions chart (docs/admin.md)."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from gen_durable.admin.site import ERROR_COLUMN
from tests.factories import InstanceFactory, TerminalFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/gen_durable/instance/"


def test_the_list_shows_the_error_cut_by_postgres(admin_client, queue_name):
    long = TerminalFactory(queue=queue_name, status="failed", result=None,
                           last_error="RuntimeError: smtp down " + "x" * 3000)
    short = TerminalFactory(queue=queue_name, status="failed", result=None, last_error="ValueError: kaput")
    ok = TerminalFactory(queue=queue_name)
    with CaptureQueriesContext(connection) as captured:
        body = admin_client.get(CHANGELIST, {"queue": queue_name}).content.decode()
    sqls = [q["sql"] for q in captured.captured_queries if 'FROM "gen_durable"' in q["sql"]]
    [page] = [s for s in sqls if s.startswith('SELECT "gen_durable"."id"')]
    assert not [s for s in sqls if "COUNT" in s.upper() and "SUBSTRING" in s]  # the count cuts nothing
    assert f'SUBSTRING("gen_durable"."last_error", 1, {ERROR_COLUMN + 1})' in page
    assert page.count('"gen_durable"."last_error"') == 1  # only inside SUBSTRING: the whole text is not loaded
    cell = re.search(r'<td class="field-error">(.*?)</td>', body.split(f">{long.id}<")[1], re.S).group(1)
    text = re.search(r'>([^<]*)</span>', cell).group(1)
    assert text.startswith("RuntimeError: smtp down") and text.endswith("…") and len(text) == ERROR_COLUMN
    assert ">ValueError: kaput<" in body.split(f">{short.id}<")[1].split("</tr>")[0]
    assert '<td class="field-error">—</td>' in body.split(f">{ok.id}<")[1].split("</tr>")[0]


def test_a_done_rows_error_of_an_earlier_attempt_is_shown_as_such_not_in_red(admin_client, queue_name):
    recovered = TerminalFactory(queue=queue_name, last_error="TimeoutError: gateway")  # done after a retry
    failed = TerminalFactory(queue=queue_name, status="failed", result=None, last_error="TimeoutError: gateway")
    body = admin_client.get(CHANGELIST, {"queue": queue_name}).content.decode()
    done_cell = body.split(f">{recovered.id}<")[1].split("</tr>")[0]
    assert 'class="gd-error-earlier"' in done_cell and ">earlier attempt: TimeoutError: gateway<" in done_cell
    assert 'class="gd-error"' not in done_cell
    assert 'class="gd-error" title="TimeoutError: gateway"' in body.split(f">{failed.id}<")[1].split("</tr>")[0]


def test_the_completions_chart_draws_failures_in_red(admin_client, queue_name):
    TerminalFactory.create_batch(3, queue=queue_name)
    TerminalFactory.create_batch(2, queue=queue_name, status="failed", result=None, last_error="E: x")
    body = admin_client.get(reverse("admin:gen_durable_queueoverview_changelist")).content.decode()
    chart = body.split('id="gd-completions"')[1].split("</svg>")[0]
    failed = re.findall(r'<rect class="bar-failed"[^>]*><title>[^:]+:\d\d: (\d+) failed of (\d+)</title>', chart)
    assert failed and sum(int(f) for f, _ in failed) >= 2
    assert all(int(f) <= int(n) for f, n in failed)
    assert re.search(r'class="gd-failed-total">\d+ failed<', body)
