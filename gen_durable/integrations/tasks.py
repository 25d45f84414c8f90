"""Django's Tasks framework on gen_durable: `GenDurableBackend` runs `@task` functions.

One import path on both framework versions: `django.tasks` (Django >= 6.0) and the
`django-tasks` backport (module `django_tasks`, Django 5.2; `pip install
"gen-durable[tasks]"`).

    TASKS = {"default": {"BACKEND": "gen_durable.tasks.GenDurableBackend",
                         "QUEUES": ["default", "email"],          # each in GEN_DURABLE["QUEUES"] or EXTRA_QUEUES
                         "OPTIONS": {"MAX_ATTEMPTS": 5}}}        # BACKOFF: f(attempt) -> seconds

A task is a gen_durable instance: its machine (`fsm`) is the task function's path, its
one step `run`, its state `{"args": [...], "kwargs": {...}}`, its result the return
value. `queue_name` is the gen_durable queue, `run_after` its `eligible_at`, and
Django's priority (-100..100, larger runs sooner) is stored negated (gen_durable's
smaller runs sooner), which keeps the order. Each finished attempt appends a record
(worker, claim time, error) to the row's `attempt_log`; `get_result` builds the
`TaskResult` from the row alone, so any process can read it. See docs/tasks.md.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import os
import threading
from importlib.util import find_spec
from typing import Any, ClassVar

from django.conf import settings as django_settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils.dateparse import parse_datetime
from django.utils.module_loading import import_string

from .. import db, registry, sql
from ..calls import warn_outside_atomic
from ..codec import clean_text, encode
from ..conf import get_settings
from ..exceptions import UnknownMachine
from ..machine import MAX_BACKOFF, Machine, jittered, step
from ..outcomes import Done, Retry, Stop, format_traceback, seconds

if find_spec("django.tasks") is not None:  # Django >= 6.0
    from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task, task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist, TaskResultMismatch
    from django.tasks.signals import task_enqueued
    from django.utils.json import normalize_json
else:  # Django 5.2 with the django-tasks backport
    try:
        from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, task, task_backends
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
        from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
        from django_tasks.signals import task_enqueued
        from django_tasks.utils import normalize_json
    except ImportError as exc:  # pragma: no cover - depends on the installed packages
        from ..conf import install_hint

        raise ImproperlyConfigured(
            "gen_durable.tasks needs Django's Tasks framework: Django >= 6.0, or on Django 5.2 the "
            f"django-tasks backport ({install_hint('tasks')})"
        ) from exc

# The framework's own names are re-exported (task, TaskContext, TaskResultStatus, …) so
# code written against them runs on either framework version unchanged.
__all__ = ["GenDurableBackend", "InvalidTask", "InvalidTaskBackend", "Task", "TaskContext", "TaskError",
           "AsyncTaskMachine", "TaskMachine", "TaskResult", "TaskResultDoesNotExist", "TaskResultMismatch", "TaskResultStatus", "enqueue_all",
           "from_django_priority", "machine_for", "task", "to_django_priority"]

# OPTIONS of a GenDurableBackend and their defaults (docs/tasks.md).
OPTION_DEFAULTS = {
    "MAX_ATTEMPTS": 1,  # Django's semantics: a task that raises is FAILED; raise it to retry
    "BACKOFF": None,    # f(attempt) -> seconds; None = min(2 ** (attempt - 1), 300), jittered
    "DATABASE": None,   # the database alias its tasks live on; None = GEN_DURABLE["DATABASE"]
}
PARAM_KEYS = {"BACKEND", "QUEUES", "OPTIONS"}
STEP = "run"
MAX_TRACEBACK = 16_000  # characters of a traceback kept per error (the end: it names the exception)

STATUS = {
    "runnable": TaskResultStatus.READY,
    "executing": TaskResultStatus.RUNNING,
    # A task never parks; a signal sent to one by id could park it only through a
    # machine's outcome, which a task never returns. Mapped for completeness.
    "awaiting_signal": TaskResultStatus.RUNNING,
    "awaiting_children": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
}


def from_django_priority(priority: int) -> int:
    """Django's priority (-100..100, larger runs sooner) → gen_durable's (smaller runs sooner)."""
    return -int(priority)


def to_django_priority(priority: int) -> int:
    """gen_durable's priority of a task row → Django's (the inverse of `from_django_priority`)."""
    return -int(priority)


# The Tasks framework's own code (Task.enqueue) sits between a caller and the backend: a
# warning names the caller's line, not the framework's.
_TASKS_DIRS = (os.path.dirname(inspect.getfile(Task)) + os.sep,)


class TaskMachine(Machine):
    """The machine of one `@task` function (registered under the function's path).

    Its one step calls the function. A return value is normalised to JSON the way
    Django specifies and stored as the result; an exception fails the attempt and is
    recorded (class path and traceback) in the row's attempt_log, then retried after
    the backend's backoff while attempts remain (OPTIONS["MAX_ATTEMPTS"]), else the
    row fails.
    """

    abstract: ClassVar[bool] = True
    initial: ClassVar[str] = STEP
    task: ClassVar[Any] = None  # the Task object the decorator made
    _gd_inputs: ClassVar[tuple] = ()  # run and handle read ctx.state, id and attempt only: no inbox, no children

    def _inputs(self, ctx):
        state = ctx.state if isinstance(ctx.state, dict) else {}
        self._gd_backend = backend_of(state.get("backend", DEFAULT_TASK_BACKEND_ALIAS))
        return state.get("args", []), state.get("kwargs", {})

    def _done(self, value):
        value = normalize_json(value)  # TypeError for a non-JSON return value: the attempt fails
        self._gd_attempt_record = {}
        return Done(value)

    @step
    def run(self, ctx):
        args, kwargs = self._inputs(ctx)
        task = self.task
        if task.takes_context:
            # One read of the row, for a TaskResult as true as get_result's (attempt,
            # workers, errors so far); tasks without context skip it.
            result = self._gd_backend.get_result(str(ctx.id))
            return self._done(task.call(TaskContext(task_result=result), *args, **kwargs))
        return self._done(task.call(*args, **kwargs))

    def handle(self, error, ctx):
        path = f"{type(error).__module__}.{type(error).__qualname__}"
        trace = format_traceback(error)
        if len(trace) > MAX_TRACEBACK:
            trace = "…(earlier lines cut)\n" + trace[-MAX_TRACEBACK:]
        self._gd_attempt_record = {"error": {"exception_class_path": path, "traceback": clean_text(trace)}}
        backend = getattr(self, "_gd_backend", None)
        if backend is None:  # the step never started (a step timeout's fresh machine, a bad alias)
            state = ctx.state if isinstance(ctx.state, dict) else {}
            try:
                backend = backend_of(state.get("backend", DEFAULT_TASK_BACKEND_ALIAS))
            except Exception:
                backend = None
        attempt = ctx.attempt + 1  # the attempt that just failed, counted from 1
        if backend is not None and attempt < backend.max_attempts:
            return Retry(delay=backend.retry_delay(attempt))
        return Stop(f"{path}: {error}")


class AsyncTaskMachine(TaskMachine):
    """The machine of an `async def` task: its step runs on the worker's event loop.

    Not for `takes_context` tasks: their context is read from the row on the step's
    own connection (inside drain()'s transaction in tests), which an event-loop step
    cannot use; those run as a sync step through asgiref's async_to_sync instead.
    """

    abstract: ClassVar[bool] = True

    @step
    async def run(self, ctx):
        args, kwargs = self._inputs(ctx)
        return self._done(await self.task.func(*args, **kwargs))


_register_lock = threading.Lock()


def machine_for(task, max_attempts: int | None = None) -> type[TaskMachine]:
    """The TaskMachine registered for `task`'s function (made and registered on first use).

    max_attempts: the backend's MAX_ATTEMPTS, made the machine's limit, so an attempt
    that ends with no outcome (its worker died) counts too and a task that kills its
    worker every time ends FAILED instead of running forever.
    """
    name = task.module_path
    try:
        cls = registry.get(name, 1)
    except UnknownMachine:
        cls = None
    if cls is not None and issubclass(cls, TaskMachine) and cls.task.func is task.func:
        return cls
    with _register_lock:
        if cls is not None and not issubclass(cls, TaskMachine):
            raise InvalidTask(f"{name} is already the name of a gen_durable machine ({cls.__qualname__}); "
                              "rename the task function or the machine")
        attrs = {"name": name, "version": 1, "queue": task.queue_name, "task": task, "max_attempts": max_attempts,
                 "__module__": task.func.__module__, "__qualname__": task.func.__qualname__,
                 "__doc__": task.func.__doc__}
        is_async = inspect.iscoroutinefunction(task.func) and not task.takes_context
        base = AsyncTaskMachine if is_async else TaskMachine
        return type(task.func.__name__, (base,), attrs)


def backend_of(alias: str) -> "GenDurableBackend":
    backend = task_backends[alias]
    if not isinstance(backend, GenDurableBackend):
        raise InvalidTaskBackend(f"TASKS[{alias!r}] is {type(backend).__name__}, not a GenDurableBackend")
    backend._require_valid()  # a worker runs no task of an alias whose settings are invalid
    return backend


def _copy_task(task, **changes):
    # Task.using() re-validates (the queue against today's settings); a stored row must
    # read back even after the configuration changed, so copy the frozen dataclass as is.
    new = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(new, f.name, changes.get(f.name, getattr(task, f.name)))
    return new


class GenDurableBackend(BaseTaskBackend):
    """Django Tasks backend on gen_durable (see the module docstring and docs/tasks.md).

    Params: QUEUES (the queue names tasks may use; each must also be a key of
    GEN_DURABLE["QUEUES"], which is what `rundurable` runs, or match
    GEN_DURABLE["EXTRA_QUEUES"]: `served_queue`), OPTIONS: MAX_ATTEMPTS
    (int >= 1, default 1) and BACKOFF (a callable or its dotted path, `f(attempt) ->
    seconds` after failed attempt `attempt` counted from 1; default min(2 ** (attempt -
    1), 300) with jitter) and DATABASE (the alias of Django's DATABASES its tasks are
    inserted in and read from; default GEN_DURABLE["DATABASE"]; GEN_DURABLE["DATABASES"]
    routes do not apply to tasks, one backend alias per database does). Any other key, or an invalid value, is reported by system
    check gen_durable.E060 and makes every use of the backend (enqueue, get_result, a
    worker running one of its tasks) raise InvalidTaskBackend; building it does not
    raise, so the apps' tasks.py modules still import and the check can report it.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True
    # apps.ready imports every installed app's `tasks` module when TASKS names a backend
    # with this flag, so `rundurable` knows the task functions without more settings.
    gd_autodiscover_tasks = True

    def __init__(self, alias, params):
        super().__init__(alias, params)
        # Invalid settings are recorded, not raised: the framework builds the backend when
        # an app's tasks.py is imported (@task) and in its own system check, so raising
        # here would end django.setup() and `manage.py check` in a traceback. Instead
        # gen_durable.E060 reports it and every use raises it (`_require_valid`).
        self.config_error: str | None = None
        self.max_attempts, self.backoff = OPTION_DEFAULTS["MAX_ATTEMPTS"], OPTION_DEFAULTS["BACKOFF"]
        self._database = None
        try:
            self.max_attempts, self.backoff, self._database = self._options(alias, params)
        except InvalidTaskBackend as exc:
            self.config_error = str(exc)

    @property
    def database(self) -> str:
        """The database alias this backend's tasks live on (OPTIONS["DATABASE"])."""
        return self._database or get_settings().DATABASE

    def _options(self, alias, params) -> tuple:
        """(MAX_ATTEMPTS, BACKOFF callable or None, DATABASE alias or None) from `params`;
        raises InvalidTaskBackend."""
        unknown = sorted(set(params) - PARAM_KEYS)
        if unknown:
            raise InvalidTaskBackend(f"TASKS[{alias!r}] has unknown keys {unknown}; "
                                     f"a GenDurableBackend takes {sorted(PARAM_KEYS)}")
        if not isinstance(self.options, dict):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS'] must be a dict, got {self.options!r}")
        unknown = sorted(set(self.options) - set(OPTION_DEFAULTS))
        if unknown:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {unknown}; "
                                     f"valid: {sorted(OPTION_DEFAULTS)}")
        options = {**OPTION_DEFAULTS, **self.options}
        max_attempts = options["MAX_ATTEMPTS"]
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be an int >= 1, "
                                     f"got {max_attempts!r}")
        backoff = options["BACKOFF"]
        if isinstance(backoff, str):
            try:
                backoff = import_string(backoff)
            except ImportError as exc:
                raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['BACKOFF']: {exc}") from exc
        if backoff is not None and not callable(backoff):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['BACKOFF'] must be a callable "
                                     f"f(attempt) -> seconds or its dotted path, got {backoff!r}")
        database = options["DATABASE"]
        if database is not None:
            from django.db import connections

            if not isinstance(database, str) or database not in connections.settings:
                raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] must be an alias of DATABASES "
                                         f"({sorted(connections.settings)}), got {database!r}")
        return max_attempts, backoff, database

    def _require_valid(self) -> None:
        """Raise InvalidTaskBackend when this alias's settings are invalid (gen_durable.E060)."""
        if self.config_error is not None:
            raise InvalidTaskBackend(self.config_error)

    # -- validation -------------------------------------------------------------------

    def validate_task(self, task) -> None:
        """The framework's checks, then: the queue must be one gen_durable runs.

        Raises InvalidTask. Registers the task's machine on success.
        """
        if self.queues and task.queue_name not in self.queues:  # the framework's message names no choice
            import difflib

            close = difflib.get_close_matches(task.queue_name, sorted(self.queues), n=1)
            raise InvalidTask(f"Task {task.module_path}: queue {task.queue_name!r} is not one of this backend's "
                              f"QUEUES ({sorted(self.queues)})" + (f"; did you mean {close[0]!r}?" if close else "."))
        super().validate_task(task)
        if not served_queue(task.queue_name):
            raise InvalidTask(f"Task {task.module_path}: queue {task.queue_name!r} is not in GEN_DURABLE['QUEUES'] "
                              f"({sorted(get_settings().QUEUES)}) nor GEN_DURABLE['EXTRA_QUEUES']: no gen_durable "
                              "worker would run it")
        machine_for(task, self.max_attempts)

    def retry_delay(self, attempt: int) -> float:
        """Seconds before the next attempt after attempt `attempt` (from 1) failed."""
        if self.backoff is None:
            return jittered(min(2.0 ** min(attempt - 1, 9), MAX_BACKOFF))
        return seconds(self.backoff(attempt), f"TASKS[{self.alias!r}] BACKOFF({attempt})")

    # -- enqueue ----------------------------------------------------------------------

    def _row(self, task, args, kwargs) -> tuple:
        self._require_valid()
        self.validate_task(task)
        data = {"args": normalize_json(args), "kwargs": normalize_json(kwargs)}  # TypeError/ValueError
        if self.alias != DEFAULT_TASK_BACKEND_ALIAS:
            data["backend"] = self.alias
        if task.run_after is not None:
            data["run_after"] = task.run_after
        state = encode(data, f"arguments of task {task.module_path}", get_settings().MAX_PAYLOAD_BYTES)
        return task.module_path, state, task.queue_name, from_django_priority(task.priority), task.run_after

    def _ready(self, task, id_, enqueued_at, args, kwargs):
        return TaskResult(task=task, id=str(id_), status=TaskResultStatus.READY, enqueued_at=enqueued_at,
                          started_at=None, finished_at=None, last_attempted_at=None, args=args,
                          kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[])

    def _warn_outside_atomic(self, call, task):
        """RoutedOutsideTransactionWarning when OPTIONS["DATABASE"] puts this backend's
        rows on a database with no transaction open while the caller holds one on another:
        the task would commit now, not with the caller's transaction."""
        setting = "OPTIONS['DATABASE']" if self._database else "GEN_DURABLE['DATABASE'] (its OPTIONS name none)"
        warn_outside_atomic(call, getattr(task, "module_path", ""), self.database,
                            why=f"TASKS[{self.alias!r}] puts its tasks on database {self.database!r} "
                                f"({setting})", skip=_TASKS_DIRS)

    def enqueue(self, task, args, kwargs):
        """Insert one task; return its READY TaskResult. Statements: 1.

        Joins the caller's transaction.atomic() (the task exists, and wakes a worker,
        on commit). Raises InvalidTask, TypeError/ValueError for arguments that are
        not JSON (gen_durable's SerializationError, a TypeError, when too large),
        InvalidTaskBackend when the alias's settings are invalid (gen_durable.E060).
        """
        row = self._row(task, args, kwargs)
        self._warn_outside_atomic("enqueue", task)
        [(id_, enqueued_at)] = _insert([row], self.database)
        result = self._ready(task, id_, enqueued_at, args, kwargs)
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results ----------------------------------------------------------------------

    def get_result(self, result_id):
        """The task's TaskResult read from its row (one query).

        Raises TaskResultDoesNotExist; InvalidTaskBackend when the alias's settings are invalid.
        """
        from ..models import Instance

        self._require_valid()
        try:
            id_ = int(result_id)
        except (TypeError, ValueError):
            raise TaskResultDoesNotExist(result_id) from None
        if not -(2**63) <= id_ < 2**63:
            raise TaskResultDoesNotExist(result_id)
        row = (Instance.objects.using(self.database).filter(id=id_)
               .values_list("fsm", "status", "state", "result", "attempt_log", "locked_by", "queue",
                            "priority", "inserted_at", "updated_at", "last_error").first())
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(id_, *row)

    def _result(self, id_, fsm, status, state, value, log, locked_by, queue, priority, inserted_at,
                updated_at, last_error):
        if log is None:
            raise TaskResultDoesNotExist(f"{id_} is a gen_durable instance of {fsm}, not a task")
        try:
            machine = registry.get(fsm, 1)
        except UnknownMachine:
            machine = None
        if machine is None or not issubclass(machine, TaskMachine):
            raise TaskResultDoesNotExist(f"task {id_}: its function {fsm} is not a task imported in this "
                                         "process (define it in a module that is imported, e.g. an app's tasks.py)")
        state = state if isinstance(state, dict) else {}
        run_after = state.get("run_after")
        task = _copy_task(machine.task, priority=to_django_priority(priority), queue_name=queue,
                          run_after=parse_datetime(run_after) if run_after else None,
                          backend=state.get("backend", DEFAULT_TASK_BACKEND_ALIAS))
        executing = status == "executing"
        workers = [h.get("worker_id") for h in log] + ([locked_by] if executing and locked_by else [])
        errors = [TaskError(**h["error"]) for h in log if h.get("error")]
        if status == "failed" and not errors:
            # Failed without a failed attempt: cancelled (gd.cancel) or its function was
            # unknown to the worker; the engine's reason is the error.
            errors = [TaskError(exception_class_path="gen_durable.exceptions.GenDurableError",
                                traceback=last_error or "failed")]
        started = parse_datetime(log[0]["started_at"]) if log else (updated_at if executing else None)
        attempted = updated_at if executing else (parse_datetime(log[-1]["started_at"]) if log else None)
        result = TaskResult(
            task=task, id=str(id_), status=STATUS[status], enqueued_at=inserted_at, started_at=started,
            finished_at=updated_at if status in ("done", "failed") else None, last_attempted_at=attempted,
            args=state.get("args", []), kwargs=state.get("kwargs", {}),
            backend=state.get("backend", DEFAULT_TASK_BACKEND_ALIAS), errors=errors, worker_ids=workers,
        )
        if status == "done":
            object.__setattr__(result, "_return_value", value)
        return result


def _insert(rows, using=None) -> list[tuple]:
    arr = db.pg_array
    params = {"fsm": arr([r[0] for r in rows]), "state": arr([r[1] for r in rows]),
              "queue": arr([r[2] for r in rows]), "priority": arr([r[3] for r in rows]),
              "at": arr([r[4] for r in rows])}
    return db.fetchall(sql.TASK_ENQUEUE, params, using)


def enqueue_all(calls) -> list:
    """Enqueue many tasks in ONE statement (the framework has no bulk enqueue).

    Args:
        calls: an iterable of `(task, args, kwargs)` — task a Task whose backend is a
            GenDurableBackend (`.using(...)` variants welcome), args a list/tuple,
            kwargs a dict.
    Returns: the READY TaskResults, in input order. Tasks of backends on different
        databases (OPTIONS["DATABASE"]) take one statement per database.
    Raises: what `enqueue` raises, before anything is written. Joins the caller's
        transaction.atomic() like `enqueue`. Sends `task_enqueued` per task.
    """
    prepared = []
    for i, item in enumerate(calls):
        try:
            task, args, kwargs = item
        except (TypeError, ValueError):
            raise InvalidTask(f"enqueue_all takes (task, args, kwargs) triples; item {i} is {item!r}") from None
        if not isinstance(task, Task):
            raise InvalidTask(f"enqueue_all item {i}: {task!r} is not a Task (decorate the function with @task)")
        backend = task.get_backend()
        if not isinstance(backend, GenDurableBackend):
            raise InvalidTask(f"enqueue_all item {i}: {task.module_path} runs on {type(backend).__name__}, "
                              "not a GenDurableBackend")
        args, kwargs = list(args), dict(kwargs)
        prepared.append((backend, task, args, kwargs, backend._row(task, args, kwargs)))
    if not prepared:
        return []
    by_database: dict = {}
    for i, p in enumerate(prepared):
        by_database.setdefault(p[0].database, []).append(i)
    returned: list = [None] * len(prepared)
    for alias, positions in by_database.items():
        prepared[positions[0]][0]._warn_outside_atomic("enqueue_all", prepared[positions[0]][1])
        for i, got in zip(positions, _insert([prepared[i][4] for i in positions], alias)):
            returned[i] = got
    results = []
    for (backend, task, args, kwargs, _), (id_, enqueued_at) in zip(prepared, returned):
        result = backend._ready(task, id_, enqueued_at, args, kwargs)
        task_enqueued.send(type(backend), task_result=result)
        results.append(result)
    return results


# (module, message) of each tasks.py whose import raised InvalidTask (apps.ready): a
# @task the settings no longer accept (its queue removed) is check gen_durable.E100, not
# a traceback out of every manage.py command.
IMPORT_ERRORS: list = []


@checks.register
def check_task_imports(app_configs=None, **kwargs):
    """E100: a tasks.py stopped at a @task its backend refuses (the rest of it is not loaded)."""
    return [checks.Error(f"{module} could not be imported: {message}.",
                         hint="Add the queue to GEN_DURABLE['QUEUES'] and the backend's QUEUES, or change the "
                              "task's queue_name; tasks defined after it in that module are not loaded.",
                         id="gen_durable.E100") for module, message in IMPORT_ERRORS]


def served_queue(name: str) -> bool:
    """Whether a task may go to queue `name`: a key of GEN_DURABLE['QUEUES'] (what this
    deployment's `rundurable` runs) or an entry of GEN_DURABLE['EXTRA_QUEUES'] (a name or
    fnmatch pattern: queues other deployments' workers run) — the queues `gd.insert`
    accepts, less the registered machines' own (a task's machine is made for it)."""
    s = get_settings()
    if isinstance(s.QUEUES, dict) and name in s.QUEUES:
        return True
    extra = s.EXTRA_QUEUES if isinstance(s.EXTRA_QUEUES, (list, tuple, set, frozenset)) else ()
    return any(isinstance(e, str) and e and fnmatch.fnmatchcase(name, e) for e in extra)


@checks.register
def check_task_backends(app_configs=None, **kwargs):
    """System checks of every TASKS alias that uses a GenDurableBackend (on both framework versions).

    gen_durable.E060: its OPTIONS or keys are invalid (InvalidTaskBackend's message).
    gen_durable.E061: one of its QUEUES is neither in GEN_DURABLE["QUEUES"] nor matched by
    GEN_DURABLE["EXTRA_QUEUES"] (no worker would run it).
    """
    errors = []
    tasks_setting = getattr(django_settings, "TASKS", None)
    for alias, params in (tasks_setting.items() if isinstance(tasks_setting, dict) else ()):
        path = params.get("BACKEND") if isinstance(params, dict) else None
        try:
            cls = import_string(path) if isinstance(path, str) else None
        except ImportError:
            continue  # the framework reports an unknown backend itself
        if not (isinstance(cls, type) and issubclass(cls, GenDurableBackend)):
            continue
        try:
            backend = task_backends[alias]
            backend._require_valid()
        except InvalidTaskBackend as exc:
            errors.append(checks.Error(str(exc), hint="See docs/tasks.md for the backend's keys and OPTIONS.",
                                       id="gen_durable.E060"))
            continue
        missing = sorted(q for q in backend.queues if not served_queue(q))
        if missing:
            errors.append(checks.Error(
                f"TASKS[{alias!r}]['QUEUES'] names {missing}, which neither GEN_DURABLE['QUEUES'] nor "
                "GEN_DURABLE['EXTRA_QUEUES'] has: tasks there would be rejected, and no worker would run them.",
                hint="Add them to GEN_DURABLE['QUEUES'] (queue -> concurrency), or to EXTRA_QUEUES when another "
                     "deployment's workers run them, or remove them from TASKS.",
                id="gen_durable.E061"))
    return errors


# Live task rows per backend alias (the alias is in the state only when it is not "default").
_ROWS_BY_ALIAS = (
    "SELECT COALESCE(state->>'backend', %(default)s), count(*), min(id) FROM gen_durable "
    "WHERE status NOT IN ('done', 'failed') AND step = %(step)s AND state ? 'args' AND state ? 'kwargs' "
    "GROUP BY 1 ORDER BY 1")


@checks.register(checks.Tags.database)
def check_task_row_aliases(app_configs=None, databases=None, **kwargs):
    """W063 (with `check --database`): live task rows enqueued through a TASKS alias this
    release does not have as a GenDurableBackend (renamed or removed while rows were
    queued). A worker of this release fails such a row when it claims it, its body unrun.
    Reads every live row (as W060 does)."""
    if not databases:
        return []
    tasks_setting = getattr(django_settings, "TASKS", None)
    known, stores = set(), {get_settings().DATABASE}
    for alias, params in (tasks_setting.items() if isinstance(tasks_setting, dict) else ()):
        try:
            backend = task_backends[alias]
        except Exception:  # an invalid alias: E060 and the framework report it
            continue
        if isinstance(backend, GenDurableBackend):
            known.add(alias)
            stores.add(backend.database)
    from django.db import DatabaseError

    out = []
    for using in sorted(a for a in stores if a in databases):
        try:
            rows = db.fetchall(_ROWS_BY_ALIAS, {"default": DEFAULT_TASK_BACKEND_ALIAS, "step": STEP}, using)
        except DatabaseError:  # not migrated, or no server: other checks say so
            continue
        for alias, count, example in rows:
            if alias in known:
                continue
            out.append(checks.Warning(
                f"{count:,} live task row{'s' if count != 1 else ''} in database {using!r} "
                f"{'were' if count != 1 else 'was'} enqueued through TASKS[{alias!r}] (e.g. id {example}), which "
                "this release has no gen_durable backend for: a worker of this release fails them unrun.",
                hint=f"Keep TASKS[{alias!r}] until they have run (a renamed alias: keep the old name beside the "
                     "new one), or keep a worker of the release that has it (docs/tasks.md, \"Deploying\").",
                id="gen_durable.W063"))
    return out
