"""The four tables (docs/design.md#schema), as Django models for the admin, factories and queries.

The DDL itself lives in migrations/0001_initial.py as reversible RunSQL: the status
enum, the stored generated columns (`correlation_guard`, `concurrency_name`), the
partial indexes — each named for the one hot statement it serves — the CHECKs and the
database-level ON DELETE rules are things Django's field API cannot say exactly.
The generated columns are left out of the models on purpose: the database computes
them and the ORM must never write them.

Indexes on `gen_durable` (see sql/*.sql for the statements):
  gen_durable_pick         (queue, priority, eligible_at) WHERE status = 'runnable'   pick.sql
  gen_durable_lease        (lease_expires_at) WHERE status = 'executing'              reap.sql
  gen_durable_await_deadline (await_deadline) WHERE status = 'awaiting_signal'
                           AND await_deadline IS NOT NULL                             expire_awaits.sql
  gen_durable_concurrency_active UNIQUE (concurrency_key) WHERE status = 'executing'
                           AND concurrency_key IS NOT NULL AND concurrency_shard IS NULL   K=1 arbiter
  gen_durable_correlation  UNIQUE (correlation_guard) WHERE correlation_guard IS NOT NULL  insert dedup, signal by key
  gen_durable_parent       (parent_id) WHERE parent_id IS NOT NULL                    load_children.sql
  gen_durable_gc           (updated_at) WHERE status IN ('done', 'failed')            gc_select.sql
  gen_durable_unknown      (queue, fsm, fsm_version) WHERE unknown_since IS NOT NULL
                           AND status = 'runnable'                                   adopt_known.sql (migration 0008)
"""

from django.db import models
from django.db.models.functions import Now


class TextArrayField(models.Field):
    """A Postgres array column read as a list of str (text[] or gen_durable_status[]).

    psycopg returns arrays of an unregistered enum as their text form ('{a,b}'); both
    shapes load as a list. The ORM never writes these columns (db_default → DEFAULT).
    """

    def db_type(self, connection):
        return "text[]"

    def from_db_value(self, value, expression, connection):
        if value is None or isinstance(value, list):
            return value
        inner = value.strip("{}")
        return [v.strip('"') for v in inner.split(",")] if inner else []

    def to_python(self, value):
        return value


from .statuses import LIVE_STATUSES, TERMINAL_STATUSES, Status  # noqa: E402,F401


class Instance(models.Model):
    """One machine or job instance (table `gen_durable`)."""

    id = models.BigAutoField(primary_key=True)
    fsm = models.TextField()
    fsm_version = models.IntegerField(default=1)
    step = models.TextField()
    status = models.CharField(max_length=32, choices=Status.choices, default=Status.RUNNABLE)
    state = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    awaits = TextArrayField(null=True, blank=True)
    queue = models.TextField(default="default")
    priority = models.SmallIntegerField(default=0)
    eligible_at = models.DateTimeField(db_default=Now())
    concurrency_key = models.TextField(null=True, blank=True)
    concurrency_shard = models.SmallIntegerField(null=True, blank=True)
    rate_limit = models.TextField(null=True, blank=True)
    weight = models.FloatField(default=1)
    locked_by = models.TextField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempt = models.IntegerField(default=0)
    # The claim counter: every pick increments it, and an outcome commits only under the
    # claim it ran for (flush.sql's guard; docs/design.md#outcomes; migration 0011).
    claim = models.BigIntegerField(db_default=0, editable=False)
    last_error = models.TextField(null=True, blank=True)
    # The formatted traceback of the last failed attempt (at most MAX_TRACEBACK_LENGTH
    # characters), written with last_error; NULL when last_error came from no exception.
    last_traceback = models.TextField(null=True, blank=True, editable=False)
    await_deadline = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False,
        related_name="children",  # ON DELETE SET NULL is enforced by the database
    )
    children_pending = models.IntegerField(default=0)
    correlation_key = models.TextField(null=True, blank=True)
    correlation_scope = TextArrayField(db_default=models.Value("{}"), editable=False)
    inserted_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())
    # One record per finished attempt ({"worker_id", "started_at", "error"}) for rows
    # that keep one (Django tasks, gen_durable/integrations/tasks.py); NULL otherwise.
    attempt_log = models.JSONField(null=True, blank=True, editable=False)
    # Set when a worker that did not know this row's machine, version or step handed it
    # back (a rolling deploy): it waits for a worker that knows it (migration 0008).
    unknown_since = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "gen_durable"
        managed = False  # DDL is owned by migrations/0001_initial.py (RunSQL)
        verbose_name = "instance"
        ordering = ["-id"]

    def __str__(self):
        return f"{self.fsm}#{self.id} ({self.status} at {self.step})"


class Signal(models.Model):
    """One inbox row (table `gen_durable_signals`)."""

    id = models.BigAutoField(primary_key=True)
    target = models.ForeignKey(
        Instance, on_delete=models.DO_NOTHING, db_constraint=False, related_name="signals",
        # ON DELETE CASCADE is enforced by the database
    )
    name = models.TextField()
    payload = models.JSONField(null=True)
    dedup_key = models.TextField(null=True, blank=True)
    inserted_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "gen_durable_signals"
        managed = False
        ordering = ["id"]


class BucketConfig(models.Model):
    """Limiter policy per (kind, name) (table `gen_durable_bucket_configs`)."""

    id = models.BigAutoField(primary_key=True)
    kind = models.TextField()  # 'rate' or 'conc'
    name = models.TextField()
    rate = models.FloatField(null=True)
    capacity = models.FloatField()
    shards = models.SmallIntegerField(default=1)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "gen_durable_bucket_configs"
        managed = False


class Bucket(models.Model):
    """Limiter counter shard (table `gen_durable_buckets`)."""

    id = models.BigAutoField(primary_key=True)
    kind = models.TextField()
    key = models.TextField()
    shard = models.SmallIntegerField()
    capacity = models.FloatField()
    available = models.FloatField()
    last_refill = models.DateTimeField(null=True)

    class Meta:
        db_table = "gen_durable_buckets"
        managed = False


class QueuePause(models.Model):
    """A paused queue (table `gen_durable_queue_pauses`); see `gd.pause_queue`."""

    queue = models.TextField(primary_key=True)
    paused_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "gen_durable_queue_pauses"
        managed = False

    def __str__(self):
        return self.queue


class Worker(models.Model):
    """A running worker process (table `gen_durable_workers`), refreshed by its heartbeat.

    `id` is the supervisor's token (the suffix of the `locked_by` of its claims);
    `queues` the queues it serves; a row whose `last_seen` is older than LEASE_TTL
    belongs to a process that is gone.
    """

    id = models.TextField(primary_key=True)
    host = models.TextField()
    pid = models.IntegerField()
    queues = TextArrayField()
    started_at = models.DateTimeField(db_default=Now())
    last_seen = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "gen_durable_workers"
        managed = False

    def __str__(self):
        return f"{self.host}:{self.pid} ({self.id})"


class ScheduleState(models.Model):
    """Where one cron schedule stands (table `gen_durable_schedules`; see schedules.py).

    `next_run_at` is the next tick to fire; the worker that fires it locks the row and
    advances it in the transaction that inserts the instance, so a tick fires once.
    `last_tick_at` is the nominal time of the tick last fired, `last_run_at` when it was
    fired, `last_instance_id` the instance it inserted (no foreign key: GC may delete it).
    """

    name = models.TextField(primary_key=True)
    cron = models.TextField()
    timezone = models.TextField()
    next_run_at = models.DateTimeField()
    last_tick_at = models.DateTimeField(null=True)
    last_run_at = models.DateTimeField(null=True)
    last_instance_id = models.BigIntegerField(null=True)
    last_error = models.TextField(null=True)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "gen_durable_schedules"
        managed = False

    def __str__(self):
        return self.name


class HistoryEntry(models.Model):
    """One attempt of an instance as it committed (table `gen_durable_history`): its step,
    attempt number, outcome, error, the worker that ran it (the claimant, `locked_by`),
    and when it started and finished (the database's clock). Written by the worker after
    the outcomes commit (one statement for many flushes), trimmed by the GC (HISTORY,
    docs/guide.md); the admin's timeline.

    outcome: next, inline (a Next continued by the same worker), retry, await, schedule
    (children spawned), done, failed (a Stop, or the last attempt's error), lost (the
    reaper found its lease lapsed: the worker died or stalled before an outcome) or
    abandoned (the worker shut down while the step still ran after DRAIN_TIMEOUT)."""

    id = models.BigAutoField(primary_key=True)
    instance_id = models.BigIntegerField()
    attempt = models.IntegerField()
    step = models.TextField()
    outcome = models.TextField()
    error = models.TextField(null=True, blank=True)
    worker = models.TextField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField()

    class Meta:
        db_table = "gen_durable_history"
        managed = False  # DDL is owned by migrations/0010_history.py (RunSQL)
        verbose_name_plural = "history entries"

    def __str__(self):
        return f"#{self.instance_id} {self.step} attempt {self.attempt}: {self.outcome}"


class QueueOverview(Instance):
    """No table of its own: gives the admin index its "Queue overview" entry."""

    class Meta:
        proxy = True
        verbose_name = "queue overview"
        verbose_name_plural = "queue overview"
