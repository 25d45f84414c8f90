"""Bulk by filter: gd.cancel_where / retry_where / move_where and manage.py durable_bulk
(docs/guide.md "Bulk operations")."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

import gen_durable as gd
from gen_durable.models import Instance
from gen_durable.testing import drain
from tests.durable_app.durable import Plain
from tests.factories import ExecutingFactory, InstanceFactory, TerminalFactory

pytestmark = pytest.mark.django_db


def _failed(n, queue):
    return [TerminalFactory(queue=queue, fsm="tests.Plain", step="start", status="failed", result=None,
                            last_error="RuntimeError: smtp down", attempt=4).id for _ in range(n)]


def test_retry_where_retries_every_match_in_bounded_batches_with_progress(queue_name):
    ids = _failed(25, queue_name)
    others = _failed(3, f"{queue_name}_other")
    done = TerminalFactory(queue=queue_name).id
    seen = []
    with CaptureQueriesContext(connection) as captured:
        result = gd.retry_where(status="failed", queue=queue_name, batch=10,
                                progress=lambda *counts: seen.append(counts))
    assert (result.done, result.skipped, result.scanned, result.batches) == (25, 0, 25, 3)
    assert seen == [(10, 0, 10), (20, 0, 20), (25, 0, 25)]
    sqls = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]  # the test's transaction
    reads = [s for s in sqls if s.startswith("-- bulk_select")]
    assert len(reads) == 3 and len(sqls) == 1 + 3 + 25  # the id range, a read per batch, a retry per row
    assert set(Instance.objects.filter(id__in=ids).values_list("status", "attempt")) == {("runnable", 0)}
    assert set(Instance.objects.filter(id__in=others).values_list("status", flat=True)) == {"failed"}
    assert Instance.objects.get(id=done).status == "done"
    assert drain(queue=queue_name)["done"] == 25


def test_cancel_where_cancels_live_rows_of_a_machine_and_keeps_the_reason(queue_name):
    live = [gd.insert(Plain, queue=queue_name) for _ in range(4)]
    other_machine = InstanceFactory(queue=queue_name, fsm="tests.Counter").id
    finished = TerminalFactory(queue=queue_name, fsm="tests.Plain").id
    result = gd.cancel_where(reason="bad deploy 4711", queue=queue_name, machine=Plain, batch=3)
    assert (result.done, result.scanned, result.batches) == (4, 4, 2)
    assert set(Instance.objects.filter(id__in=live).values_list("status", "last_error")) == {
        ("failed", "bad deploy 4711")}
    assert Instance.objects.get(id=other_machine).status == "runnable"
    assert Instance.objects.get(id=finished).status == "done"


def test_move_where_moves_waiting_rows_and_leaves_executing_ones(queue_name):
    target = f"{queue_name}_new"
    waiting = [gd.insert(Plain, queue=queue_name) for _ in range(5)]
    claimed = ExecutingFactory(queue=queue_name, fsm="tests.Plain", step="start").id
    finished = TerminalFactory(queue=queue_name).id
    result = gd.move_where(to_queue=target, queue=queue_name, status=["runnable", "executing"], batch=2)
    assert (result.done, result.skipped, result.scanned) == (5, 1, 6)
    assert result.reasons == [f"#{claimed}: executing, done, or already in the queue"]
    assert set(Instance.objects.filter(id__in=waiting).values_list("queue", flat=True)) == {target}
    assert Instance.objects.get(id=claimed).queue == queue_name
    assert Instance.objects.get(id=finished).queue == queue_name
    assert drain(queue=queue_name).get("done", 0) == 0  # negative control: nothing left there to run
    assert drain(queue=target)["done"] == 5


def test_move_where_refuses_an_undeclared_target_before_any_row_moves(queue_name):
    waiting = [gd.insert(Plain, queue=queue_name) for _ in range(3)]
    with CaptureQueriesContext(connection) as captured:
        with pytest.raises(gd.InvalidInput, match="queue 'defualt' is not declared; did you mean 'default'"):
            gd.move_where(to_queue="defualt", queue=queue_name)
    assert not [q for q in captured.captured_queries if "gen_durable" in q["sql"]]  # not even the id range
    assert set(Instance.objects.filter(id__in=waiting).values_list("queue", flat=True)) == {queue_name}
    # EXTRA_QUEUES is honoured (tests/settings.py declares "emials"):
    assert gd.move_where(to_queue="emials", queue=queue_name).done == 3


def test_the_command_refuses_an_undeclared_target_queue_dry_run_too(queue_name):
    waiting = [gd.insert(Plain, queue=queue_name) for _ in range(2)]
    for extra in ([], ["--dry-run"]):
        out = StringIO()
        with pytest.raises(CommandError, match="queue 'defualt' is not declared; did you mean 'default'"):
            call_command("durable_bulk", "move", "--queue", queue_name, "--to-queue", "defualt", *extra, stdout=out)
        assert "match" not in out.getvalue()
    assert set(Instance.objects.filter(id__in=waiting).values_list("queue", flat=True)) == {queue_name}


def test_the_command_exits_non_zero_on_an_undeclared_target_queue(queue_name, capsys):
    from django.core.management import execute_from_command_line

    with pytest.raises(SystemExit) as exited:
        execute_from_command_line(["manage.py", "durable_bulk", "move", "--queue", queue_name, "--to-queue",
                                   "defualt", "--dry-run"])
    assert exited.value.code == 1 and "queue 'defualt' is not declared" in capsys.readouterr().err


@pytest.mark.parametrize("kwargs, message", [
    ({"status": "bogus"}, "status must be"),
    ({"status": []}, "status must be"),
    ({"batch": 0}, "batch must be"),
    ({"batch": 10_001}, "batch must be"),
    ({"queue": ""}, "queue must be"),
])
def test_a_bad_filter_is_rejected(kwargs, message):
    with pytest.raises(gd.InvalidInput, match=message):
        gd.retry_where(**kwargs)


def test_the_command_retries_moves_and_counts(queue_name):
    _failed(12, queue_name)
    out = StringIO()
    call_command("durable_bulk", "retry", "--queue", queue_name, "--dry-run", stdout=out)
    assert "retry: 12 instances match (dry run: nothing changed)" in out.getvalue()
    assert Instance.objects.filter(queue=queue_name, status="failed").count() == 12
    out = StringIO()
    call_command("durable_bulk", "retry", "--queue", queue_name, "--batch", "5", stdout=out)
    text = out.getvalue()
    assert "retry: 5 matched so far, 5 done, 0 skipped" in text and "retry: 12 done, 0 skipped of 12 matched in 3 batches" in text
    out = StringIO()
    call_command("durable_bulk", "move", "--queue", queue_name, "--to-queue", f"{queue_name}_b", stdout=out)
    assert "move: 12 done" in out.getvalue()
    assert Instance.objects.filter(queue=f"{queue_name}_b").count() == 12


def test_the_command_notes_a_machine_name_nobody_registers_and_keeps_working(queue_name):
    retired = [TerminalFactory(queue=queue_name, fsm="accounts.Nope", step="start", status="failed",
                               result=None).id]
    out, err = StringIO(), StringIO()
    call_command("durable_bulk", "retry", "--queue", queue_name, "--machine", "accounts.Nope", stdout=out,
                 stderr=err)
    assert err.getvalue().strip() == ("note: no registered machine is named 'accounts.Nope'; a retired machine's "
                                      "rows still match")
    assert "retry: 1 done" in out.getvalue()  # the retired machine's row still matched
    assert Instance.objects.get(id=retired[0]).status == "runnable"
    err = StringIO()
    call_command("durable_bulk", "retry", "--queue", queue_name, "--machine", "tests.Plain", "--dry-run",
                 stdout=StringIO(), stderr=err)
    assert err.getvalue() == ""  # a registered one: no note
    err = StringIO()
    call_command("durable_bulk", "retry", "--queue", queue_name, "--machine", "tests.Plian", "--dry-run",
                 stdout=StringIO(), stderr=err)
    assert "no registered machine is named 'tests.Plian' (did you mean 'tests.Plain'?)" in err.getvalue()


@pytest.mark.parametrize("argv, message", [
    (["move"], "--to-queue"),
    (["cancel"], "--reason"),
    (["retry", "--to-queue", "x"], "for move only"),
    (["retry", "--batch", "0"], "batch must be"),
])
def test_the_command_rejects_what_it_would_ignore(argv, message):
    with pytest.raises(CommandError, match=message):
        call_command("durable_bulk", *argv, stdout=StringIO())


def test_sparse_matches_are_found_across_windows_of_the_primary_key(queue_name, monkeypatch):
    from gen_durable import bulk

    monkeypatch.setattr(bulk, "WINDOW", 4)  # every read looks at 4 ids at most
    ids = []
    for _ in range(6):
        ids += _failed(1, queue_name)
        InstanceFactory.create_batch(5, queue=queue_name)  # non-matching rows between the matches
    result = gd.retry_where(queue=queue_name, batch=2)
    assert (result.done, result.scanned) == (6, 6)
    assert set(Instance.objects.filter(id__in=ids).values_list("status", flat=True)) == {"runnable"}


def test_a_gap_in_the_id_space_costs_one_probe_not_a_read_per_window(queue_name):
    base = 10**12  # an old parked row; the rows after it deleted; the matches 3,000,000 ids later
    InstanceFactory(id=base, queue=f"{queue_name}_old", status="awaiting_signal")
    Instance.objects.bulk_create([InstanceFactory.build(id=base + 3_000_000 + i, queue=queue_name, status="failed")
                                  for i in range(10)])
    out = StringIO()
    with CaptureQueriesContext(connection) as captured:
        call_command("durable_bulk", "retry", "--queue", queue_name, stdout=out)
    assert "retry: 10 done, 0 skipped of 10 matched in 1 batch\n" in out.getvalue()
    assert Instance.objects.filter(queue=queue_name, status="runnable").count() == 10
    sent = [q["sql"] for q in captured.captured_queries]
    # one read of the empty window after the old row, one jump, one read of the rows
    assert len([s for s in sent if "bulk_select" in s]) == 2
    assert len([s for s in sent if "bulk_next" in s]) == 1
