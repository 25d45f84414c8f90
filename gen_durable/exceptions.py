"""Exceptions raised by the public API (docs/guide.md, docs/design.md#reliability-bars)."""

from django.db import ProgrammingError


class GenDurableError(Exception):
    """Base class of every error gen_durable raises on purpose."""


class DuplicateInstance(GenDurableError):
    """`insert` found its correlation key occupied (docs/design.md#identity).

    Attributes: `correlation_key` (str); `existing_id` (int | None), the instance that
    holds the key, when `insert` could read it (None if it finished meanwhile).
    """

    def __init__(self, correlation_key, existing_id=None):
        self.correlation_key = correlation_key
        self.existing_id = existing_id
        held = f" (instance {existing_id})" if existing_id is not None else ""
        super().__init__(f"an instance with correlation_key {correlation_key!r} is already live{held}")


class NoTarget(GenDurableError, LookupError):
    """A signal or cancel addressed a missing or terminal instance (docs/design.md#signals)."""

    def __init__(self, target):
        self.target = target
        hint = ""
        if isinstance(target, str) and target.strip().isdigit():
            # The rule: an int is an id, a str is always a correlation key — "337" read
            # from a URL never silently becomes id 337 (docs/guide.md, "Addressing").
            hint = (f"; a str target is always a correlation key — to address instance {target.strip()} "
                    f"by id pass an int: int({target!r})")
        super().__init__(f"no live gen_durable instance {target!r}{hint}")


class UnknownMachine(GenDurableError, LookupError):
    """No machine is registered under that name and version."""

    def __init__(self, name, version=None, close=None):
        self.name, self.version = name, version
        where = f"{name!r}" if version is None else f"{name!r} version {version}"
        if close:  # the registered name it is nearest to (a typo)
            where += f" (did you mean {close!r}?)"
        # Both places apps.ready() imports from: a machine's durable.py, and a Django
        # task's tasks.py (a task row's machine is its function's path).
        old = "" if version is None else f", or is version {version} no longer defined"
        super().__init__(
            f"no gen_durable machine registered as {where}; is its module imported? gen_durable "
            "imports the durable.py of every app in INSTALLED_APPS, and its tasks.py when settings.TASKS "
            f"uses gen_durable.tasks.GenDurableBackend: is the app in INSTALLED_APPS{old}?"
        )


class NotMigrated(GenDurableError, ProgrammingError):
    """gen_durable's tables (or types) are missing in the database: its migrations are not
    applied. Attributes: `alias` (the database alias). A Django ProgrammingError (so code
    catching DatabaseError still does); the original one is the `__cause__`."""

    def __init__(self, alias, detail):
        self.alias = alias
        super().__init__(f"gen_durable's tables are missing in database {alias!r} ({detail}): run "
                         f"`python manage.py migrate gen_durable --database {alias}`")


class InvalidInput(GenDurableError, ValueError):
    """An argument is out of its documented range (negative delay, naive datetime…)."""


class UncommittedInstance(GenDurableError, RuntimeError):
    """`await_result` was called inside the transaction that inserted (or changed) the
    instance: no worker can see the row before that transaction commits, so the wait
    could only time out. Await after the commit (e.g. outside `transaction.atomic()`, or
    with ATOMIC_REQUESTS, in a view marked `transaction.non_atomic_requests`).

    Attributes: `target` (the instance id).
    """

    def __init__(self, target):
        self.target = target
        super().__init__(
            f"await_result({target}) inside the transaction that inserted or changed instance {target}: "
            "no worker sees it before that transaction commits, so the wait could only time out; "
            "await it after the commit (in a view under ATOMIC_REQUESTS, mark the view "
            "@transaction.non_atomic_requests; docs/guide.md, \"Calls\")")


class SerializationError(GenDurableError, TypeError):
    """A state, result or payload cannot be encoded as JSON, or is too large."""


class InvalidOutcome(GenDurableError, TypeError):
    """A step or `handle` returned something that is not an outcome (docs/guide.md)."""


class NotRetryable(GenDurableError):
    """`retry` found the instance in a status it does not retry (done, executing or
    awaiting its children).

    Attributes: `target`, `status` (str).
    """

    def __init__(self, target, status):
        self.target, self.status = target, status
        why = {
            "done": "it finished successfully",
            "executing": "a worker is running its step",
            "awaiting_children": "it waits for its children (retry or cancel those instead)",
        }.get(status, f"its status is {status}")
        super().__init__(f"cannot retry gen_durable instance {target!r}: {why}")


class StepTimeout(GenDurableError, TimeoutError):
    """A step ran past its timeout; `handle()` receives this.

    Attributes: `step` (str), `timeout` (seconds allowed), `elapsed` (seconds it had run),
    `cancelled` (bool): True for an async step that ended on its cancellation. Otherwise
    the step was abandoned: a thread cannot be killed (nor an async step that ignores its
    cancellation), and whatever it returns later is dropped.
    """

    def __init__(self, step, timeout, elapsed, cancelled=False):
        self.step, self.timeout, self.elapsed, self.cancelled = step, timeout, elapsed, cancelled
        how = "cancelled" if cancelled else "abandoned"
        super().__init__(f"step {step!r} ran past its timeout of {timeout:g}s ({how} after {elapsed:.1f}s)")


class LeaseExpired(GenDurableError):
    """An attempt's lease expired before it recorded an outcome (its worker died or stalled;
    returned by the reaper, or by a restarted worker's start-up reclaim on the same host).

    Never raised: it names that cause in a Django task's `TaskResult.errors`.
    """


class WorkerShutdown(GenDurableError):
    """An attempt still ran when its worker shut down after DRAIN_TIMEOUT; the row was
    handed back (runnable at once) and the attempt counts.

    Never raised: it names that cause in a Django task's `TaskResult.errors`.
    """


class TransactionLeftOpen(GenDurableError, RuntimeError):
    """A step (or `handle`) returned with a database transaction still open.

    The engine rolled it back and discarded the connection, so the step's writes since
    the transaction began are lost; the step is treated as failed (`handle()` sees this
    error). Close every `transaction.atomic()` and raw `BEGIN` before returning.
    """


class RoutedOutsideTransactionWarning(RuntimeWarning):
    """An `insert` or `insert_all` without `using=` was routed by
    `GEN_DURABLE['DATABASES']` to a database with no transaction open, while the caller
    held `transaction.atomic()` on another alias.

    Django's transactions are per database: the row commits at once and survives a
    rollback of that block. Open `transaction.atomic(using=ALIAS)` on the routed alias
    too, or pass `using=` (docs/scaling.md, "Past one primary"). A warning, not an error:
    writing to another database from inside a transaction can be what the caller wants;
    silence it with Python's `warnings` filters.
    """


class IdAsKeyWarning(UserWarning):
    """`gd.get("27")` or `gd.await_result("27")` found nothing: a str target is always a
    correlation key, and no instance has the key "27". An id read from a URL or a form is
    a str: pass `int(...)` to address the instance by id (docs/guide.md, "Calls")."""


class UnawaitedSignalWarning(UserWarning):
    """`gd.signal(target, name)` to an instance whose machine can never await `name`, as
    read from its source: every Await in its steps names other signals by literals, or its
    code takes no ctx. Usually a typo of the name: the signal is stored, and the instance
    stays parked until its Await times out. Not warned when the machine builds names at
    run time, reads `ctx.all`, or is not registered in the sending process
    (docs/guide.md, "Calls")."""
