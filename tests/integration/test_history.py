"""The timeline of an instance: one gen_durable_history entry per attempt that committed
(docs/design.md#history), trimmed by the GC, shown with the admin log on the detail page."""

from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import gen_durable as gd
from gen_durable import sql
from gen_durable.checks import check_history
from gen_durable.models import HistoryEntry, Instance
from gen_durable.outcomes import Await, Done, Next
from gen_durable.testing import drain
from gen_durable.worker import claims, executor, maintenance
from gen_durable.worker.flusher import flush
from tests.conftest import wait_until
from tests.durable_app.durable import Flow, Plain
from tests.durable_app.history_machines import HistoryFails, HistoryFlow
from tests.factories import HistoryEntryFactory, InstanceFactory

WORKER = "history-worker"


def entries_of(id_):
    return list(HistoryEntry.objects.filter(instance_id=id_).order_by("id"))


def shape(id_):
    return [(e.step, e.attempt, e.outcome, e.error) for e in entries_of(id_)]


def status(id_):
    return Instance.objects.get(id=id_).status


def stamped(result, machine, job):
    """An outcome as the worker's executor leaves it (the attempt that ran, its times)."""
    entry = executor.to_entry(result, machine, job, consumed=(), presented=())
    entry.attempt, entry.began, entry.ended = job.attempt, 0.0, 0.0
    return entry


# --- what the worker writes ---------------------------------------------------------------

def test_a_machine_in_a_worker_leaves_one_entry_per_attempt(engine, queue_name):
    """Several steps, an inline continuation, a handled error that retries, an Await woken
    by a signal, and the step after it — each attempt's step, attempt, outcome, error and
    worker, in order, with its start and end on the database's clock."""
    before = timezone.now()
    flow = gd.insert(HistoryFlow, queue=queue_name)
    fails = gd.insert(HistoryFails, queue=queue_name)
    sup = engine({queue_name: 2})
    wait_until(lambda: status(flow) == "awaiting_signal" and status(fails) == "failed", what="parked and failed")
    gd.signal(flow, "go", {"n": 1})
    wait_until(lambda: status(flow) == "done", what="done")
    wait_until(lambda: len(entries_of(flow)) == 4, what="the last entry (written after its commit)")
    assert shape(flow) == [("a", 0, "inline", None), ("b", 0, "retry", "ValueError: flaky"),
                           ("b", 1, "await", None), ("c", 0, "done", None)]
    assert shape(fails) == [("start", 0, "failed", "RuntimeError: boom")]
    workers = {e.worker for e in entries_of(flow) + entries_of(fails)}
    assert workers == {sup.schedulers[queue_name].worker_id}  # the claimant (locked_by)
    previous = before - timedelta(seconds=1)
    for e in entries_of(flow):
        assert previous <= e.started_at <= e.finished_at <= timezone.now()
        previous = e.started_at
    assert Instance.objects.get(id=fails).last_error == entries_of(fails)[0].error  # the same text


def test_drain_writes_the_same_entries(committed, queue_name):
    flow_id = gd.insert(Flow, queue=queue_name)
    failing = gd.insert(HistoryFails, queue=queue_name)
    drain(queue_name)
    assert [(s, a, o) for s, a, o, _ in shape(flow_id)] == [("start", 0, "next"), ("second", 0, "next"),
                                                             ("third", 0, "done")]
    assert shape(failing) == [("start", 0, "failed", "RuntimeError: boom")]
    assert {e.worker for e in entries_of(flow_id)} == {e.worker for e in entries_of(failing)}
    assert entries_of(flow_id)[0].worker.startswith("drain:")


def test_history_off_writes_nothing(committed, queue_name, settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": {"ENABLED": False}}
    id_ = gd.insert(Flow, queue=queue_name)
    drain(queue_name)
    assert status(id_) == "done" and HistoryEntry.objects.count() == 0


def test_a_requeue_writes_no_entry(committed, queue_name):
    """An outcome no step produced (a row handed back to the pick) is not an attempt."""
    (job,) = claims.pick(*_claim(queue_name, Plain, 1))
    flush([executor.requeue_entry(job)])
    assert status(job.id) == "runnable" and entries_of(job.id) == []


def _claim(queue, machine, n):
    gd.insert_all([gd.Spec(machine, queue=queue) for _ in range(n)])
    return queue, n, WORKER, 60


# --- never an entry for an outcome that did not commit --------------------------------------

def test_a_stale_outcome_leaves_no_entry(committed, queue_name):
    """The row was reaped and claimed by another worker meanwhile: the guarded flush
    commits nothing for it, and writes no entry; its batch-mate's entry is written."""
    stale, fresh = claims.pick(*_claim(queue_name, Plain, 2))
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET locked_by = 'someone-else' WHERE id = %s", [stale.id])
    result = flush([stamped(Done(None), Plain, stale), stamped(Done(None), Plain, fresh)], alone=True)
    assert [e.id for e in result.stale] == [stale.id]
    assert entries_of(stale.id) == [] and [e.outcome for e in entries_of(fresh.id)] == ["done"]


def test_a_flush_that_fails_leaves_no_entry(committed, queue_name, monkeypatch):
    """A statement of the flush's transaction fails (here the Await's re-check): the
    outcomes roll back, the flush raises, and no entry describes them."""
    jobs = claims.pick(*_claim(queue_name, Plain, 2))
    monkeypatch.setattr(sql, "PARK_RECHECK", "SELECT * FROM no_such_table_here")
    with pytest.raises(DatabaseError):
        flush([stamped(Await(["go"], "start"), Plain, jobs[0]), stamped(Done(None), Plain, jobs[1])])
    assert {status(j.id) for j in jobs} == {"executing"}
    assert HistoryEntry.objects.count() == 0


def test_a_connection_lost_during_the_flush_leaves_no_entry(committed, queue_name):
    """The flush's connection dies before its outcome commits (the server ended the
    session): nothing commits, nothing is written; the lease recovers the row."""
    (job,) = claims.pick(*_claim(queue_name, Plain, 1))
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    with _other_session(autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(DatabaseError):
        flush([stamped(Done(None), Plain, job)])
    connection.close()
    assert status(job.id) == "executing" and entries_of(job.id) == []


def test_a_history_write_that_fails_fails_no_outcome(committed, queue_name, monkeypatch, caplog, events):
    """The outcomes committed first: a failing timeline write loses only its entries
    (logged), and the next flush on the same connection goes through."""
    a, b = claims.pick(*_claim(queue_name, Plain, 2))
    good = sql.HISTORY_INSERT
    monkeypatch.setattr(sql, "HISTORY_INSERT", "SELECT * FROM no_such_table_here")
    result = flush([stamped(Done(None), Plain, a)], alone=True)
    assert result.committed == {a.id: "done"} and "were not written" in caplog.text
    ((measured, meta),) = [(m, md) for e, m, md in events if e == "history.error"]
    assert measured == {"count": 1} and "no_such_table_here" in meta["error"]
    monkeypatch.setattr(sql, "HISTORY_INSERT", good)
    assert flush([stamped(Done(None), Plain, b)], alone=True).committed == {b.id: "done"}
    assert entries_of(a.id) == [] and [e.outcome for e in entries_of(b.id)] == ["done"]


def test_one_statement_for_a_batch_of_any_size(committed, queue_name):
    jobs = claims.pick(*_claim(queue_name, Plain, 40))
    entries = [stamped(Next("start") if j.id % 2 else Done(None), Plain, j) for j in jobs]
    with CaptureQueriesContext(connection) as captured:
        flush(entries, alone=True)
    inserts = [q for q in captured.captured_queries if q["sql"].startswith("-- history_insert:")]
    assert len(inserts) == 1
    assert HistoryEntry.objects.filter(instance_id__in=[j.id for j in jobs]).count() == 40


# --- the GC ---------------------------------------------------------------------------------

def _aged(n, instance_id, seconds_ago):
    at = timezone.now() - timedelta(seconds=seconds_ago)
    return HistoryEntryFactory.create_batch(n, instance_id=instance_id, started_at=at, finished_at=at)


def test_gc_deletes_entries_past_retention_in_bounded_batches(committed, django_assert_num_queries):
    old = _aged(7, 1, 3600)
    young = _aged(3, 1, 10)
    # Age: 7 old entries by 3 — 3, 3, then 1 (a short batch ends it); cap: the 3 left
    # (a full window), then an empty one.
    with django_assert_num_queries(3 + 2):
        deleted, _ = maintenance.gc_history(retention=600, cap=100, batch=3, after=0)
    assert deleted == 7
    assert sorted(e.id for e in HistoryEntry.objects.all()) == [e.id for e in young]
    assert not HistoryEntry.objects.filter(id__in=[e.id for e in old]).exists()


def test_gc_keeps_the_newest_entries_of_each_instance(committed):
    many = HistoryEntryFactory.create_batch(8, instance_id=1)
    few = HistoryEntryFactory.create_batch(2, instance_id=2)
    more = HistoryEntryFactory.create_batch(5, instance_id=3)
    deleted, after = maintenance.gc_history(retention=86400, cap=3, batch=4, after=0)
    assert deleted == 5 + 2
    kept = lambda i: [e.id for e in HistoryEntry.objects.filter(instance_id=i).order_by("id")]  # noqa: E731
    assert kept(1) == [e.id for e in many[-3:]] and kept(2) == [e.id for e in few]
    assert kept(3) == [e.id for e in more[-3:]]
    assert after == more[-1].id  # the next pass starts after what this one read
    # Later passes look only at what was written since: an instance gaining entries.
    newer = HistoryEntryFactory.create_batch(2, instance_id=2)
    deleted, after = maintenance.gc_history(retention=86400, cap=3, batch=4, after=after)
    assert deleted == 1 and kept(2) == [few[1].id] + [e.id for e in newer] and after == newer[-1].id


def test_the_gc_sweep_trims_the_timeline_with_the_terminal_rows(committed, events):
    _aged(4, 1, 3600)
    keep = _aged(5, 2, 10)
    sweep = maintenance.make_gc_sweep(86400, 100, None, history={"RETENTION": 600, "MAX_PER_INSTANCE": 2})
    sweep()
    assert sorted(e.id for e in HistoryEntry.objects.all()) == [e.id for e in keep[-2:]]
    assert [m for e, m, _ in events if e == "gc.history"] == [{"count": 4 + 3}]


# --- settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, text", [
    ("yes", "must be a dict"),
    ({"ENABLED": 1}, "['ENABLED'] must be True or False"),
    ({"RETENTION": -1}, "['RETENTION'] must be a number of seconds"),
    ({"RETENTION": float("inf")}, "['RETENTION'] must be a number of seconds"),
    ({"MAX_PER_INSTANCE": 0}, "['MAX_PER_INSTANCE'] must be an int >= 1"),
    ({"MAX_PER_INSTANCE": 2.5}, "['MAX_PER_INSTANCE'] must be an int >= 1"),
    ({"MAX_PER_INSTANCE": 2**31}, "['MAX_PER_INSTANCE'] must be an int >= 1 and <= 2147483647"),
    ({"MAX_PER_INSTANCE": 2**63}, "<= 2147483647"),
    ({"MAX_PER_INSTNACE": 5}, "Did you mean 'MAX_PER_INSTANCE'?"),
])
def test_a_bad_history_setting_is_check_e110(settings, value, text):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": value}
    errors = check_history()
    assert [e.id for e in errors] == ["gen_durable.E110"]
    assert text in errors[0].msg + " " + (errors[0].hint or "")


def test_the_largest_max_per_instance_e110_passes_is_one_the_gc_runs_with(committed):
    HistoryEntryFactory.create_batch(2, instance_id=1)
    assert maintenance.gc_history(retention=86400, cap=2**31 - 1, batch=10)[0] == 0


def test_a_good_history_setting_passes(settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": {"ENABLED": False, "RETENTION": 0,
                                                                "MAX_PER_INSTANCE": 1}}
    assert check_history() == []


def test_a_bad_history_setting_writes_nothing(committed, queue_name, settings):
    """Not accepted and ignored: check E110 reports it, and nothing is written meanwhile."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": {"ENABLED": "yes"}}
    gd.insert(Flow, queue=queue_name)
    drain(queue_name)
    assert HistoryEntry.objects.count() == 0


# --- the admin's detail page ------------------------------------------------------------------

DETAIL = "/admin/gen_durable/instance/{}/change/"


def _page_queries(admin_client, id_):
    with CaptureQueriesContext(connection) as captured:
        page = admin_client.get(DETAIL.format(id_))
    assert page.status_code == 200
    return page.content.decode(), len(captured.captured_queries)


@pytest.mark.django_db
def test_the_detail_page_shows_attempts_and_admin_actions_newest_first(admin_client, queue_name):
    row = InstanceFactory(queue=queue_name, status="runnable", step="b")
    HistoryEntryFactory(instance_id=row.id, step="a", outcome="inline", worker="w-1",
                        finished_at=timezone.now() - timedelta(seconds=30))
    HistoryEntryFactory(instance_id=row.id, step="b", outcome="retry", error="ValueError: flaky", worker="w-1",
                        finished_at=timezone.now() - timedelta(seconds=20))
    page = admin_client.post(f"/admin/gen_durable/instance/act/signal/?ids={row.id}",
                             {"ids": str(row.id), "name": "go", "payload": "{}", "reason": "unblock it", "confirm": "1"})
    assert page.status_code in (200, 302)
    body, _ = _page_queries(admin_client, row.id)
    table = body.split('id="gd-timeline"')[1].split("</table>")[0]
    assert table.index("unblock it") < table.index("ValueError: flaky") < table.index("<code>a</code>")
    assert "w-1" in table and "admin</strong> admin" in table


@pytest.mark.django_db
def test_the_timeline_says_bulk_runs_and_calls_outside_the_admin_are_not_listed(admin_client, queue_name):
    row = InstanceFactory(queue=queue_name, status="runnable")
    assert gd.cancel_where(reason="bad deploy", queue=queue_name).done == 1  # no admin log entry
    body, _ = _page_queries(admin_client, row.id)
    note = body.split('id="gd-timeline-not-listed">')[1].split("</p>")[0]
    assert note.startswith("Bulk (all matching) admin runs and calls made outside the admin (gd.cancel")
    assert "Recent actions" in note
    assert "no entries (none written yet, or HISTORY is off)" in body  # the cancel is not a line of it
    HistoryEntryFactory(instance_id=row.id)
    body, _ = _page_queries(admin_client, row.id)
    assert body.index('id="gd-timeline"') < body.index('id="gd-timeline-not-listed"')


@pytest.mark.django_db
def test_the_timeline_costs_the_same_queries_for_3_or_300_entries(admin_client, queue_name):
    small = InstanceFactory(queue=queue_name)
    big = InstanceFactory(queue=queue_name)
    HistoryEntryFactory.create_batch(3, instance_id=small.id)
    HistoryEntryFactory.create_batch(300, instance_id=big.id)
    _page_queries(admin_client, small.id)  # warm Django's content-type cache
    body_small, n_small = _page_queries(admin_client, small.id)
    body_big, n_big = _page_queries(admin_client, big.id)
    assert n_small == n_big
    rows = body_big.split('id="gd-timeline"')[1].split("</table>")[0].count('<tr class="gd-attempt">')
    assert rows == 50 and "the newest 50 shown" in body_big
    with CaptureQueriesContext(connection) as captured:
        from gen_durable.admin.timeline import timeline

        assert len(timeline(big.id)) == 50
    assert len(captured.captured_queries) == 2  # the history's newest 50, the admin log's


# --- an attempt with no outcome ---------------------------------------------------------------

@pytest.mark.parametrize("enabled", [True, False])
def test_a_lost_lease_is_a_lost_attempt_in_the_reap(committed, queue_name, settings, enabled):
    """The worker died in the step: the reaper's transition and the attempt's entry
    (outcome `lost`, the claimant, from its claim to the reap) are one statement."""
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": {"ENABLED": enabled}}
    (job,) = claims.pick(*_claim(queue_name, Plain, 1))
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET lease_expires_at = now() - interval '1 second' WHERE id = %s", [job.id])
    assert maintenance.reap() == [job.id]
    row = Instance.objects.get(id=job.id)
    assert (row.status, row.attempt) == ("runnable", 1)
    if not enabled:
        assert entries_of(job.id) == []
        return
    (entry,) = entries_of(job.id)
    assert (entry.step, entry.attempt, entry.outcome, entry.worker) == ("start", 0, "lost", WORKER)
    assert entry.error == row.last_error and entry.started_at <= entry.finished_at


# --- the worker's Flusher: entries of many flushes in one statement -----------------------------

@pytest.fixture
def history_writes(monkeypatch):
    """The sizes of the Flusher's history_insert.sql statements, in order."""
    from gen_durable.worker import flusher as flusher_module

    sizes, real = [], flusher_module.write_history_rows

    def counted(rows, using=None):
        sizes.append(len(rows))
        return real(rows, using)

    monkeypatch.setattr(flusher_module, "write_history_rows", counted)
    return sizes


def _commit_each(flusher, queue, n):
    jobs = claims.pick(*_claim(queue, Plain, n))
    for job in jobs:  # one flush each: the flusher is idle between them
        flusher.step_started()
        assert flusher.commit(stamped(Done(None), Plain, job)) == "committed"
    return jobs


def test_the_flusher_writes_the_entries_of_many_flushes_in_one_statement(committed, queue_name, monkeypatch,
                                                                         history_writes):
    from gen_durable.worker import flusher as flusher_module
    from gen_durable.worker.flusher import Flusher

    monkeypatch.setattr(flusher_module, "HISTORY_DELAY", 3600.0)  # only the batch bound or the stop writes
    monkeypatch.setattr(flusher_module, "HISTORY_BATCH", 4)
    flusher = Flusher().start()
    try:
        jobs = _commit_each(flusher, queue_name, 6)
        wait_until(lambda: history_writes == [4], what="the first full batch of entries")
        assert HistoryEntry.objects.count() == 4  # the other 2 wait for more, or the stop
    finally:
        flusher.stop(timeout=10)
    assert history_writes == [4, 2]
    assert sorted(e.instance_id for e in HistoryEntry.objects.all()) == sorted(j.id for j in jobs)


def test_an_idle_flusher_writes_what_it_keeps_after_the_delay(committed, queue_name, monkeypatch, history_writes):
    from gen_durable.worker import flusher as flusher_module
    from gen_durable.worker.flusher import Flusher

    monkeypatch.setattr(flusher_module, "HISTORY_DELAY", 0.05)
    flusher = Flusher().start()
    try:
        jobs = _commit_each(flusher, queue_name, 3)
        wait_until(lambda: HistoryEntry.objects.count() == 3, what="the entries, without a stop or a new outcome")
        assert sum(history_writes) == 3 and len(history_writes) <= 3
    finally:
        flusher.stop(timeout=10)
    assert sorted(e.instance_id for e in HistoryEntry.objects.all()) == sorted(j.id for j in jobs)


def test_a_step_cut_off_at_shutdown_is_an_abandoned_attempt(committed, queue_name):
    (job,) = claims.pick(*_claim(queue_name, Plain, 1))
    assert claims.abandon([job.id], WORKER, 5.0) == [job.id]
    row = Instance.objects.get(id=job.id)
    (entry,) = entries_of(job.id)
    assert (entry.step, entry.attempt, entry.outcome, entry.worker) == ("start", 0, "abandoned", WORKER)
    assert entry.error == row.last_error and "DRAIN_TIMEOUT (5 s)" in entry.error


@pytest.mark.django_db(databases=["default", "other"])
def test_the_timeline_is_read_from_the_instances_own_database(admin_client, queue_name):
    """`?database=other`: the entries live with the instance (a worker of that database
    wrote them); the admin log is on the default database, as Django keeps it."""
    id_ = gd.insert(Flow, queue=queue_name, using="other")
    drain(queue_name, using="other")
    assert [e.outcome for e in HistoryEntry.objects.using("other").filter(instance_id=id_)] == ["next", "next", "done"]
    body = admin_client.get(DETAIL.format(id_) + "?database=other").content.decode()
    table = body.split('id="gd-timeline"')[1].split("</table>")[0]
    assert table.count('<tr class="gd-attempt">') == 3 and "<code>third</code>" in table


# --- a locked history table costs entries, never outcomes ---------------------------------------

def _other_session(**kwargs):
    """A second session on the test database, reached as Django reaches it (an embedded
    server's socket directory comes in OPTIONS, not HOST)."""
    import psycopg

    params = connection.get_connection_params()
    return psycopg.connect(**{k: params[k] for k in ("dbname", "user", "password", "host", "port")
                              if params.get(k) not in (None, "")}, **kwargs)


def test_a_locked_history_table_drops_entries_and_keeps_outcomes_flowing(committed, queue_name, settings,
                                                                         monkeypatch, events):
    """REINDEX, VACUUM FULL, an ALTER or LOCK TABLE on gen_durable_history holds a lock the
    timeline's INSERT waits for: the write gives up on history_begin.sql's short
    lock_timeout, not LOCK_TIMEOUT (60 s here, longer than each commit may wait), so every
    outcome behind it commits while the lock is held."""
    from gen_durable.worker import flusher as flusher_module
    from gen_durable.worker.flusher import Flusher

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "LOCK_TIMEOUT": 60, "STATEMENT_TIMEOUT": 120}
    monkeypatch.setattr(flusher_module, "HISTORY_DELAY", 0.0)  # a timeline write after every flush
    jobs = claims.pick(*_claim(queue_name, Plain, 20))
    other = _other_session()
    other.execute("LOCK TABLE gen_durable_history IN SHARE MODE")
    flusher = Flusher().start()
    try:
        for job in jobs:
            flusher.step_started()
            assert flusher.commit(stamped(Done(None), Plain, job), timeout=20) == "committed"
        assert Instance.objects.filter(id__in=[j.id for j in jobs], status="done").count() == 20  # lock still held
    finally:
        other.rollback()
        other.close()
        flusher.stop(timeout=10)
    errors = [meta["error"] for e, _, meta in events if e == "history.error"]
    assert errors and all("lock timeout" in err for err in errors), errors
    assert HistoryEntry.objects.filter(instance_id__in=[j.id for j in jobs]).count() < 20  # entries were dropped


@pytest.mark.django_db(transaction=True)
def test_a_timeline_write_in_a_callers_transaction_leaves_its_settings_alone(queue_name):
    """drain() writes inside the caller's transaction.atomic(): the asynchronous commit and
    the short lock_timeout are for the write's own transaction only."""
    from django.db import transaction

    from gen_durable.worker.flusher import write_history_rows

    with transaction.atomic():
        assert write_history_rows([(10**12, 0, "s", "done", None, "w", None, None)]) == 1
        with connection.cursor() as cur:
            cur.execute("SELECT current_setting('synchronous_commit'), current_setting('lock_timeout')")
            inside = cur.fetchone()
        HistoryEntry.objects.filter(instance_id=10**12).delete()
    assert inside[0] == "on" and inside[1] != "50ms", inside


# --- every hand-back of an attempt leaves its entry ----------------------------------------------

def _executing(id_, worker, lease_s=30, claimed_ago_s=0):
    """Make `id_` a claim of `worker` (a dead process's, as far as the test goes)."""
    with connection.cursor() as cur:
        cur.execute("UPDATE gen_durable SET status = 'executing', locked_by = %s, step = 'start', "
                    "lease_expires_at = now() + make_interval(secs => %s), "
                    "updated_at = now() - make_interval(secs => %s) WHERE id = %s",
                    [worker, lease_s, claimed_ago_s, id_])


@pytest.mark.parametrize("crowd", [1, 2])
def test_a_reclaimed_attempt_is_a_lost_attempt(committed, queue_name, crowd):
    """A restarted worker handing back its dead predecessor's claims (reclaim.sql) writes
    the attempt's `lost` entry in the same statement — counted (the only row the dead
    worker held) or not (a bystander of a crash), as last_error says."""
    ids = [gd.insert(Plain, queue=queue_name) for _ in range(crowd)]
    for id_ in ids:
        _executing(id_, "host-a:123:w0")
    assert sorted(claims.reclaim(queue_name, "host-a:123:", margin=3600)) == ids
    for id_ in ids:
        row = Instance.objects.get(id=id_)
        (entry,) = entries_of(id_)
        assert (entry.step, entry.attempt, entry.outcome, entry.worker) == ("start", 0, "lost", "host-a:123:w0")
        assert entry.error == row.last_error and entry.started_at <= entry.finished_at
        assert row.attempt == (1 if crowd == 1 else 0) and ("not counted" in row.last_error) == (crowd > 1)


def test_a_reclaim_without_history_writes_no_entry(committed, queue_name, settings):
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "HISTORY": {"ENABLED": False}}
    id_ = gd.insert(Plain, queue=queue_name)
    _executing(id_, "host-a:123:w0")
    assert claims.reclaim(queue_name, "host-a:123:", margin=3600) == [id_]
    assert entries_of(id_) == []


@pytest.mark.parametrize("how", ["reap", "abandon", "reclaim"])
def test_a_lost_inline_link_starts_after_the_link_before_it(committed, queue_name, how):
    """An inline chain keeps updated_at at the chain's claim: the handed-back link starts
    when the chain's newest entry ended, not before the links that ran ahead of it."""
    id_ = gd.insert(Plain, queue=queue_name)
    _executing(id_, "host-a:123:w0", lease_s=-1 if how == "reap" else 30, claimed_ago_s=20)
    HistoryEntryFactory(instance_id=id_, attempt=0, step="start", outcome="inline", worker="host-a:123:w0",
                        started_at=timezone.now() - timedelta(seconds=20),
                        finished_at=timezone.now() - timedelta(seconds=1))
    if how == "reap":
        assert maintenance.reap() == [id_]
    elif how == "abandon":
        assert claims.abandon([id_], "host-a:123:w0", 5.0) == [id_]
    else:
        assert claims.reclaim(queue_name, "host-a:123:", margin=3600) == [id_]
    inline, cut = entries_of(id_)
    assert cut.outcome in ("lost", "abandoned") and cut.started_at == inline.finished_at


def test_a_new_gc_process_trims_instances_over_the_cap_before_it_started(committed):
    """A GC process's first pass starts from the oldest entry: an instance that went over
    MAX_PER_INSTANCE while no GC ran (or before a restart, or before the cap was lowered)
    is trimmed, however many entries were written after it."""
    flood = HistoryEntryFactory.create_batch(30, instance_id=1)
    HistoryEntryFactory.create_batch(20, instance_id=2)  # newer than the whole flood
    sweep = maintenance.make_gc_sweep(86400, 5, None, history={"RETENTION": 86400, "MAX_PER_INSTANCE": 3})
    sweep()
    kept = list(HistoryEntry.objects.filter(instance_id=1).order_by("id").values_list("id", flat=True))
    assert kept == [e.id for e in flood[-3:]]
    assert HistoryEntry.objects.filter(instance_id=2).count() == 3


@pytest.mark.django_db(databases=["default", "other"])
def test_the_timeline_merges_only_the_admin_log_of_the_instances_own_database(admin_client, queue_name):
    """The admin log keys an entry by the bare id: instance #x on `other` and #x on the
    default database are two instances, and each timeline shows only its own actions."""
    from tests.integration.test_admin_audit import _act

    x = gd.insert(Plain, queue=queue_name, using="other")
    Instance.objects.using("default").filter(id=x).delete()
    Instance.objects.using("default").bulk_create([InstanceFactory.build(id=x, queue=queue_name)])
    admin_client.post(_act("cancel", x), {"ids": str(x), "reason": "cancelled-on-default"})
    admin_client.post(_act("cancel", x) + "&database=other",
                      {"ids": str(x), "reason": "cancelled-on-other", "database": "other"})
    assert {Instance.objects.using(a).get(id=x).status for a in ("default", "other")} == {"failed"}

    def table(query=""):
        body = admin_client.get(DETAIL.format(x) + query).content.decode()
        return body.split('id="gd-timeline"')[1].split("</table>")[0]

    other, default = table("?database=other"), table()
    assert "cancelled-on-other" in other and "cancelled-on-default" not in other
    assert "cancelled-on-default" in default and "cancelled-on-other" not in default
    assert "[database other]" in other  # the History page and recent actions name it too
