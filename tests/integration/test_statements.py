"""Statement counts of the hot path (docs/design.md#performance-contract).

A flush's entries here are built as the worker builds them (`ran`: the attempt that ran
and its times), so each committed batch also writes its timeline entries — one
history_insert.sql statement after the commit, in its own short transaction behind
history_begin.sql's settings (HISTORY, docs/design.md#history).

Counted with `django_assert_num_queries` (every statement sent through Django's
connection). The flush tests use committed rows (`transactional_db`) so its
`transaction.atomic()` is a real transaction, which Django logs as BEGIN and COMMIT
("BEGIN, one UPDATE, COMMIT"), instead of
savepoints inside the test's transaction.
"""

import re

import pytest
from django.db import connection

import gen_durable as gd
from gen_durable import sql
from gen_durable.outcomes import Await, Done, Next
from gen_durable.worker import claims, executor
from gen_durable.worker.flusher import flush
from gen_durable.tasks import machine_for
from tests.durable_app import tasks as task_functions
from tests.durable_app.durable import Counter, Flaky, Flow, Plain, noop

WORKER = "stmt-worker"


def ran(entry, job):
    """`entry` as the worker's executor leaves it: stamped with the attempt that ran."""
    entry.attempt, entry.began, entry.ended = job.attempt, 0.0, 0.0
    return entry


def outcome(result, machine, job):
    return ran(executor.to_entry(result, machine, job, consumed=(), presented=()), job)


def claimed(queue, n, machine=Counter):
    gd.insert_all([gd.Spec(machine, queue=queue) for _ in range(n)])
    jobs = claims.pick(queue, n, WORKER, 60)
    assert len(jobs) == n
    return jobs


@pytest.mark.django_db
def test_empty_pick_is_one_statement(django_assert_num_queries, queue_name):
    with django_assert_num_queries(1):
        assert claims.pick(queue_name, 10, WORKER, 60) == []


@pytest.mark.django_db
@pytest.mark.parametrize("n", [1, 5])
def test_claiming_pick_is_three_statements_for_any_batch(django_assert_num_queries, queue_name, n):
    gd.insert_all([gd.Spec(Plain, queue=queue_name) for _ in range(n)])
    with django_assert_num_queries(3) as captured:
        jobs = claims.pick(queue_name, 10, WORKER, 60)
    assert len(jobs) == n
    texts = [q["sql"] for q in captured.captured_queries]
    assert "gen_durable_signals" in texts[1] and "parent_id" in texts[2]  # claim, inboxes, children


class TakesNoCtxButHandles(gd.Job):
    """perform(args) sees no ctx, but its own handle() does: the inbox is loaded."""

    name = "tests.stmt.TakesNoCtxButHandles"

    def perform(self, args):
        return None

    def handle(self, error, ctx):
        return gd.Done({"all": len(ctx.all)})


@pytest.mark.django_db
@pytest.mark.parametrize("machine, loads", [
    (noop, []),  # fn(args): no ctx, so neither inbox nor children — the claim alone
    (Flaky, ["gen_durable_signals"]),  # perform(args, ctx): ctx.all — no children (a Job has none)
    (TakesNoCtxButHandles, ["gen_durable_signals"]),
    (machine_for(task_functions.add), []),  # a Django task reads ctx.state, id, attempt only
    (Plain, ["gen_durable_signals", "parent_id"]),  # a Machine step sees both
])
def test_a_pick_loads_only_the_inputs_its_rows_code_can_see(django_assert_num_queries, queue_name, machine, loads):
    gd.insert_all([gd.Spec(machine, queue=queue_name) for _ in range(3)])
    with django_assert_num_queries(1 + len(loads)) as captured:
        jobs = claims.pick(queue_name, 10, WORKER, 60)
    assert len(jobs) == 3 and all(j.inbox == [] and j.children == [] for j in jobs)
    texts = [q["sql"] for q in captured.captured_queries]
    assert all(want in text for want, text in zip(loads, texts[1:])), texts


@pytest.mark.django_db
def test_a_mixed_batch_loads_each_input_only_for_the_rows_that_see_it(django_assert_num_queries, queue_name):
    ctx_job, plain = gd.insert(Flaky, queue=queue_name), gd.insert(Plain, queue=queue_name)
    blind = gd.insert(noop, queue=queue_name)
    for target in (ctx_job, plain, blind):
        gd.signal(target, "hello", {"to": target})
    with django_assert_num_queries(3) as captured:
        jobs = {j.id: j for j in claims.pick(queue_name, 10, WORKER, 60)}
    inboxes, children = (ids_of(q["sql"]) for q in captured.captured_queries[1:])
    assert (inboxes, children) == ({ctx_job, plain}, {plain})
    # What each row's code can see is what it was given; the blind job's signal stays in
    # the table (purged when the row settles, as every settled row's inbox).
    assert [s.payload for s in jobs[ctx_job].inbox] == [{"to": ctx_job}]
    assert [s.payload for s in jobs[plain].inbox] == [{"to": plain}]
    assert jobs[blind].inbox == []


def ids_of(statement):
    """The ids of the one bigint[] literal in a logged statement ('{1,2}'::bigint[])."""
    (literal,) = re.findall(r"'\{([0-9,]*)\}'::bigint\[\]", statement)
    return {int(i) for i in literal.split(",") if i}


@pytest.mark.django_db
def test_insert_is_one_statement(django_assert_num_queries, queue_name):
    with django_assert_num_queries(1):
        gd.insert(Plain, queue=queue_name)


def _flush_count(django_assert_num_queries, queue, n):
    jobs = claimed(queue, n)
    entries = [outcome(Next("start", state={"n": 1}), Counter, j) for j in jobs]
    with django_assert_num_queries(7) as captured:
        result = flush(entries)
    assert len(result.committed) == n and result.stale == []
    sqls = [q["sql"] for q in captured.captured_queries]
    assert sqls[2] == "COMMIT" and heads(sqls[3:]) == TIMELINE, sqls
    return statements(captured)


# The timeline write after a commit: its own transaction, history_begin.sql's settings first.
TIMELINE = ["BEGIN", sql.HISTORY_BEGIN.splitlines()[0], sql.HISTORY_INSERT.splitlines()[0], "COMMIT"]


def heads(sqls):
    return [s.splitlines()[0] for s in sqls]


def statements(captured):
    """The captured statements other than the transaction's BEGIN and COMMIT."""
    return [q["sql"] for q in captured.captured_queries if q["sql"] not in ("BEGIN", "COMMIT")]


def test_flush_of_plain_next_outcomes_is_one_statement_whatever_the_batch(
        committed, django_assert_num_queries, queue_name):
    big = _flush_count(django_assert_num_queries, queue_name + "a", 100)
    small = _flush_count(django_assert_num_queries, queue_name + "b", 2)
    assert len(big) == len(small) == 3  # flush.sql, then the batch's timeline entries (settings, insert)
    assert big[0].startswith("-- flush:")
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM gen_durable_history")
        assert cur.fetchone() == (102,)


def test_without_history_a_flush_is_flush_sql_alone(committed, django_assert_num_queries, queue_name, settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": {"ENABLED": False}}
    entries = [outcome(Next("start"), Counter, j) for j in claimed(queue_name + "a", 50)]
    with django_assert_num_queries(3):  # BEGIN, flush, COMMIT
        flush(entries)
    entries = [outcome(Next("start"), Counter, j) for j in claimed(queue_name + "b", 50)]
    with django_assert_num_queries(1):
        flush(entries, alone=True)
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM gen_durable_history")
        assert cur.fetchone() == (0,)


def test_executed_next_outcomes_flush_in_one_statement(committed, django_assert_num_queries, queue_name):
    """The same bound for entries the executor builds from running steps."""
    jobs = claimed(queue_name, 20, Flow)
    entries = [executor.execute(j) for j in jobs]
    assert {e.kind for e in entries} == {"next"}
    with django_assert_num_queries(7) as captured:
        result = flush(entries)
    assert len(statements(captured)) == 3  # flush.sql, history_begin.sql, history_insert.sql
    assert set(result.committed.values()) == {"runnable"}



def test_a_plain_flush_alone_is_two_round_trips_and_commits(committed, django_assert_num_queries, queue_name):
    """On a connection the flusher just used (`alone`), a batch that needs only flush.sql
    runs it without BEGIN and COMMIT: it commits as it ends; its timeline entries follow
    in their own transaction."""
    jobs = claimed(queue_name, 30, Plain)
    entries = [outcome(Done({"n": 1}) if j.id % 2 else Next("start"), Plain, j) for j in jobs]
    with django_assert_num_queries(5) as captured:
        result = flush(entries, alone=True)
    sqls = [q["sql"] for q in captured.captured_queries]
    assert sqls[0].startswith("-- flush:") and heads(sqls[1:]) == TIMELINE
    assert len(result.committed) == 30 and not connection.in_atomic_block
    with connection.cursor() as cur:  # committed: not inside a transaction of ours
        cur.execute("SELECT txid_current_if_assigned() IS NULL, count(*) FROM gen_durable "
                    "WHERE queue = %s AND status IN ('done', 'runnable')", [queue_name])
        assert cur.fetchone() == (True, 30)


@pytest.mark.parametrize("case", ["await", "child_done", "child_stop"])
def test_a_flush_that_needs_more_than_flush_sql_takes_a_transaction_even_alone(
        committed, django_assert_num_queries, queue_name, case):
    """An Await's re-check and a child's join with its parent commit with the outcome."""
    jobs = claimed(queue_name, 2, Plain)
    if case == "await":
        entries = [outcome(Await(["go"], "start"), Plain, jobs[0])]
        expect = 8  # BEGIN, flush, park_recheck, COMMIT, then the timeline's 4
    else:
        parent, child = jobs
        with connection.cursor() as cur:
            cur.execute("UPDATE gen_durable SET parent_id = %s WHERE id = %s", [parent.id, child.id])
        child.parent_id = parent.id
        result = Done(None) if case == "child_done" else gd.Stop("no")
        entries = [outcome(result, Plain, child)]
        expect = 8  # BEGIN, flush, join_parents, COMMIT, then the timeline's 4
    with django_assert_num_queries(expect) as captured:
        flush(entries, alone=True)
    sqls = [q["sql"] for q in captured.captured_queries]
    assert sqls[0] == "BEGIN" and sqls[3] == "COMMIT" and heads(sqls[4:]) == TIMELINE, sqls


def test_an_entry_that_does_not_name_its_parent_still_joins_it_alone(committed, queue_name, caplog):
    """`needs_transaction` reads a child's parent from its entry (every entry the worker
    builds carries it). One built without it still gets its parent joined, right after
    the lone statement, with an error in the log saying so."""
    from gen_durable.worker.executor import Entry

    parent, child = claimed(queue_name, 2, Plain)
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET parent_id = %s WHERE id = %s", [parent.id, child.id])
        cur.execute("UPDATE gen_durable SET status = 'awaiting_children', children_pending = 1, locked_by = NULL "
                    "WHERE id = %s", [parent.id])
    entry = Entry(id=child.id, worker=WORKER, claim=child.claim, kind="done", result="{}", fsm=Plain.name,
                  from_step="start")
    result = flush([entry], alone=True)
    assert result.committed == {child.id: "done"} and result.woken == {queue_name}
    with connection.cursor() as cur:
        cur.execute("SELECT status::text, children_pending FROM gen_durable WHERE id = %s", [parent.id])
        assert cur.fetchone() == ("runnable", 0)
    assert "without their parent's join" in caplog.text
