"""Machines, jobs and the step context (docs/guide.md).

A `Machine` subclass registers itself under a stable `name` (default
"<module>.<QualName>") and `version`. Its steps are methods decorated with `@step`;
each takes `ctx` and returns an outcome (outcomes.py). A `Job` is a one-step machine
whose `perform(args, ctx)` returns a result; `@job` makes one from a function.
"""

from __future__ import annotations

import inspect
import random
from datetime import datetime, timedelta, timezone
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from . import registry
from .exceptions import InvalidInput
from .outcomes import MAX_DELAY, Await, Cancel, Done, Error, Next, Retry, ScheduleChildren, Stop, describe, seconds, text

MAX_BACKOFF = 300.0  # seconds: the default backoff's cap (docs/guide.md)


MAX_VERSION = 2 ** 31 - 1


def check_timeout(value, what):
    """`value` as seconds > 0, or None; raise InvalidInput otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise InvalidInput(f"{what} must be a number of seconds > 0 (or None), got {value!r}")
    return float(value)


def step(fn=None, *, timeout=None):
    """Mark a method `fn(self, ctx) -> outcome` as a step named after the method.

    `@gd.step` or `@gd.step(timeout=30)`: timeout is seconds (> 0) the step may run before
    it is abandoned and the instance goes to `handle()` with `gd.StepTimeout`; None (the
    default) applies GEN_DURABLE["MAX_STEP_SECONDS"] (docs/guide.md "Time"). Raises
    InvalidInput for a timeout that is not a positive number.
    """
    seconds = check_timeout(timeout, "@gd.step(timeout=)")

    def mark(fn):
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature to read (a builtin): the call will tell
            signature = None
        if signature is not None:
            try:
                signature.bind(None, None)
            except TypeError:
                raise InvalidInput(f"step {getattr(fn, '__qualname__', fn)!r} must take (self, ctx); "
                                   f"it is {getattr(fn, '__name__', 'step')}{signature}") from None
        fn._gd_step = True
        fn._gd_timeout = seconds
        return fn

    return mark(fn) if fn is not None else mark


def step_suggestion(cls, name) -> str:
    """What to say after "`cls` has no step `name`": "; X.name is a method but not a step:
    decorate it with @gd.step" when the method is there without its decorator, else
    "; did you mean 'closest'?", else ""."""
    import difflib

    if isinstance(name, str) and callable(inspect.getattr_static(cls, name, None)):
        return f"; {cls.name}.{name} is a method but not a step: decorate it with @gd.step"
    close = difflib.get_close_matches(str(name), sorted(cls.steps), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


# Class attributes gen_durable reads (or defines) on a Machine / Job. A class attribute
# close to one of them but not one (max_attempt, timout) is a typo that would be ignored.
MACHINE_OPTIONS = frozenset({"abstract", "name", "version", "queue", "initial", "inline_execution",
                             "max_attempts", "State", "timeout", "step_aliases", "schedule", "steps",
                             "timeouts", "handle", "insert", "ainsert"})
JOB_OPTIONS = MACHINE_OPTIONS | {"perform", "backoff", "func"}


def _check_option_names(cls) -> None:
    """Raise InvalidInput for a class attribute that looks like a misspelt option
    (as Django does for an unknown Meta option), naming the option."""
    import difflib

    job_base = globals().get("Job")  # None while Job itself is being defined
    options = JOB_OPTIONS if job_base is None or issubclass(cls, job_base) else MACHINE_OPTIONS
    for attr, value in vars(cls).items():
        if attr.startswith("_") or attr in options or getattr(value, "_gd_step", False):
            continue
        close = difflib.get_close_matches(attr, options, n=1, cutoff=0.85)
        if close:
            raise InvalidInput(f"{cls.__qualname__}.{attr} is not a gen_durable option; did you mean "
                               f"{close[0]!r}? (an unknown name would be silently ignored; rename the "
                               "attribute if it is your own)")


def _check_aliases(cls) -> dict:
    aliases = cls.step_aliases
    if not isinstance(aliases, dict):
        raise InvalidInput(f"{cls.__qualname__}.step_aliases must be a dict of old step name -> step, "
                           f"got {aliases!r}")
    for old, new in aliases.items():
        if not isinstance(old, str) or not old:
            raise InvalidInput(f"{cls.__qualname__}.step_aliases has an invalid old step name {old!r}")
        if old in cls.steps:
            raise InvalidInput(f"{cls.__qualname__}.step_aliases renames {old!r}, which is still a step")
        if new not in cls.steps:
            raise InvalidInput(f"{cls.__qualname__}.step_aliases maps {old!r} to {new!r}, which is not a step; "
                               f"steps are {sorted(cls.steps)}")
    return dict(aliases)


class Signal(NamedTuple):
    """One inbox row as a step sees it (ctx.awaited / ctx.all)."""

    id: int
    name: str
    payload: Any
    inserted_at: Any


class ChildRow(NamedTuple):
    """One child as its parent sees it (ctx.children)."""

    id: int
    fsm: str
    status: str
    state: Any
    result: Any
    last_error: str | None


@dataclass
class Context:
    """What a step is given: the row and its inputs as of the pick (docs/guide.md).

    attempt: 0-based; awaited: the signals this step was woken with (names it awaited);
    all: the whole inbox; children: every child row still in the table, by id.
    database: the alias of the database the instance lives on (its worker's); pass it as
    `using=` to signal, cancel or read instances of the same group from a step
    (docs/scaling.md). None outside a worker.
    """

    id: int
    step: str
    state: Any
    attempt: int = 0
    awaited: list = field(default_factory=list)
    all: list = field(default_factory=list)
    children: list = field(default_factory=list)
    queue: str = "default"
    correlation_key: str | None = None
    machine: Any = None
    database: str | None = None

    @property
    def args(self):
        """Alias of `state` for jobs."""
        return self.state


class Machine:
    """Base class of durable state machines. See the module docstring and docs/guide.md."""

    abstract: ClassVar[bool] = True
    # Marks the classes `calls.resolve_machine` accepts (calls.py does not import this
    # module, which imports it for Machine.insert: one direction only).
    _gd_machine: ClassVar[bool] = True
    name: ClassVar[str] = ""
    version: ClassVar[int] = 1
    queue: ClassVar[str] = "default"
    initial: ClassVar[str] = "start"
    inline_execution: ClassVar[bool] = False
    # Runs of one step at most (Retry outcomes and re-runs after the worker died in it
    # count alike); None: no limit. Jobs default to 20.
    max_attempts: ClassVar[int | None] = None
    State: ClassVar[Any] = None
    # Seconds each step may run when its @gd.step sets no timeout (None: MAX_STEP_SECONDS).
    timeout: ClassVar[float | None] = None
    # Old step name -> the step that now runs rows parked under it (a renamed step:
    # docs/guide.md, "Deploying").
    step_aliases: ClassVar[dict] = {}
    steps: ClassVar[dict] = {}
    timeouts: ClassVar[dict] = {}  # step name -> seconds or None (see @step)
    # The inputs of a claimed row its code can see: the inbox (ctx.all, ctx.awaited) and
    # the children (ctx.children). A claim loads only these (claims.enrich): a Job whose
    # perform and handle take no ctx sees neither, so its claim is one statement.
    _gd_inputs: ClassVar[tuple] = ("inbox", "children")

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _check_option_names(cls)
        if cls.__dict__.get("abstract", False):
            return
        if "name" not in cls.__dict__ or not cls.__dict__["name"]:
            cls.name = f"{cls.__module__}.{cls.__qualname__}"
        text(cls.name, f"{cls.__qualname__}.name")  # it is the rows' fsm column and the registry's key
        if not isinstance(cls.version, int) or isinstance(cls.version, bool) or cls.version < 1:
            raise InvalidInput(f"{cls.__qualname__}.version must be an int >= 1")
        if cls.version > MAX_VERSION:  # the rows' fsm_version is a Postgres integer
            raise InvalidInput(f"{cls.__qualname__}.version is {cls.version}; the largest is {MAX_VERSION} "
                               "(2**31 - 1, a Postgres integer): count versions 1, 2, 3…, not dates")
        if not isinstance(cls.inline_execution, bool):
            raise InvalidInput(f"{cls.__qualname__}.inline_execution must be True or False, "
                               f"got {cls.inline_execution!r}")
        if cls.max_attempts is not None and (not isinstance(cls.max_attempts, int)
                                             or isinstance(cls.max_attempts, bool) or cls.max_attempts < 1):
            raise InvalidInput(f"{cls.__qualname__}.max_attempts must be an int >= 1 or None")
        if not isinstance(cls.queue, str) or not cls.queue:
            raise InvalidInput(f"{cls.__qualname__}.queue must be a non-empty string")
        if cls.__dict__.get("schedule") is not None:
            cls._check_schedule()
        if not issubclass(cls, globals()["Job"]):
            cls.timeout = check_timeout(cls.timeout, f"{cls.__qualname__}.timeout")
        cls.steps = cls._collect_steps()
        cls.timeouts = cls._collect_timeouts()
        cls.step_aliases = _check_aliases(cls)
        for old, new in cls.step_aliases.items():
            cls.steps[old] = cls.steps[new]
            cls.timeouts[old] = cls.timeouts.get(new)
        if cls.initial not in cls.steps:
            raise InvalidInput(
                f"{cls.__qualname__}.initial is {cls.initial!r} but its steps are {sorted(cls.steps)}; "
                "decorate the first step with @gd.step or set `initial`"
            )
        registry.register(cls)

    @classmethod
    def _check_schedule(cls):
        """What a `schedule = {...}` declaration can be told at class creation (the rest —
        machine, state — is system check E021): a dict, a name that fits, a cron
        expression that parses. Raises InvalidInput."""
        from .outcomes import MAX_NAME_LENGTH

        where = f"{cls.__qualname__}.schedule"
        if not isinstance(cls.schedule, dict):
            raise InvalidInput(f"{where} must be a dict such as {{'cron': '0 3 * * *'}}, got {cls.schedule!r}")
        if len(cls.name) > MAX_NAME_LENGTH:
            raise InvalidInput(f"{where}: the schedule is named after the machine, whose name is "
                               f"{len(cls.name)} characters long; the limit is {MAX_NAME_LENGTH} "
                               f"(set a shorter `name`; it starts {cls.name[:40]!r})")
        from cronsim import CronSim, CronSimError

        cron = cls.schedule.get("cron")
        if not isinstance(cron, str):
            raise InvalidInput(f"{where} needs 'cron', a cron expression string such as '0 3 * * *'")
        try:
            CronSim(cron, datetime.now(timezone.utc))
        except (CronSimError, ValueError, IndexError) as exc:
            raise InvalidInput(f"{where}: bad cron expression {cron!r} ({exc})") from None

    @classmethod
    def _collect_steps(cls) -> dict:
        found = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if getattr(value, "_gd_step", False) is True:  # set by @gd.step (a mock answers anything)
                    found[attr] = attr
        return found

    @classmethod
    def _collect_timeouts(cls) -> dict:
        # A step's own @gd.step(timeout=) wins; else the machine's `timeout`.
        own = {name: getattr(getattr(cls, attr), "_gd_timeout", None) for name, attr in cls.steps.items()}
        return {name: cls.timeout if t is None else t for name, t in own.items()}

    def handle(self, error: BaseException, ctx: Context):
        """Turn an exception raised by a step into an outcome. Default: Stop with
        `Type: message` of the error (shortened to MAX_REASON_LENGTH characters; a
        __str__ that raises is replaced by a description of the type).

        A step that ran past its timeout arrives here as `gd.StepTimeout`."""
        return Stop(describe(error))

    # Convenience: Checkout.insert(state=...) == gd.insert(Checkout, state=...)
    @classmethod
    def insert(cls, **kwargs) -> int:
        from .calls import insert

        return insert(cls, **kwargs)

    @classmethod
    async def ainsert(cls, **kwargs) -> int:
        from .calls import ainsert

        return await ainsert(cls, **kwargs)


class Job(Machine):
    """A one-step machine: `perform(args, ctx)` returns a result (docs/guide.md).

    Returning None or a value → done (value stored); raising or returning
    gd.Error(reason) → retried after `backoff(attempt)` seconds until `max_attempts`,
    then failed; returning gd.Cancel(reason) → failed at once. `timeout` (seconds)
    bounds one attempt: past it the attempt is abandoned as a `gd.StepTimeout` and
    retried like any other error.
    """

    abstract: ClassVar[bool] = True
    initial: ClassVar[str] = "perform"
    max_attempts: ClassVar[int] = 20
    timeout: ClassVar[float | None] = None  # seconds perform may run (None: MAX_STEP_SECONDS)

    def __init_subclass__(cls, **kwargs):
        if not cls.__dict__.get("abstract", False):
            perform = getattr(cls, "perform", None)
            if perform is None or perform is Job.perform:
                raise InvalidInput(f"Job {cls.__qualname__} must define perform(self, args, ctx)")
            if (not isinstance(cls.max_attempts, int) or isinstance(cls.max_attempts, bool)
                    or cls.max_attempts < 1):
                raise InvalidInput(f"{cls.__qualname__}.max_attempts must be an int >= 1")
            cls.timeout = check_timeout(cls.timeout, f"{cls.__qualname__}.timeout")
            if not callable(cls.backoff):
                raise InvalidInput(f"{cls.__qualname__}.backoff must be a method backoff(self, attempt) returning "
                                   f"seconds, got {cls.backoff!r}")
            extra = sorted(a for k in cls.__mro__ if k not in (Job, Machine, object)
                           for a, v in vars(k).items() if getattr(v, "_gd_step", False) is True)
            if extra:  # never both perform and steps: they would never run
                raise InvalidInput(f"Job {cls.__qualname__} defines perform and @gd.step methods {extra}; "
                                   "a Job has one step, perform — make it a Machine for several")
            n = len(inspect.signature(perform).parameters)
            cls._perform_arity = n
            # A Job has no children (ScheduleChildren is refused); its inbox is visible
            # only through the ctx that a 3-argument perform or an own handle() receives.
            # A @gd.job wrapper always takes (self, args, ctx): it says whether the
            # function it wraps receives the ctx (`_gd_takes_ctx`).
            takes_ctx = getattr(perform, "_gd_takes_ctx", n >= 3)
            cls._gd_inputs = ("inbox",) if takes_ctx or cls.handle is not Job.handle else ()
        super().__init_subclass__(**kwargs)

    def perform(self, args, ctx):  # pragma: no cover - replaced by subclasses
        raise NotImplementedError

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before attempt `attempt + 1`: min(2**attempt, 300)."""
        if attempt >= 9:  # 2**9 > 300: never build huge numbers
            return MAX_BACKOFF
        return float(min(2 ** max(attempt, 0), MAX_BACKOFF))

    @step
    def run_perform(self, ctx):
        value = self.perform(ctx.state, ctx) if self._perform_arity >= 3 else self.perform(ctx.state)
        return self._outcome(value, ctx)

    @step
    async def arun_perform(self, ctx):
        value = await (self.perform(ctx.state, ctx) if self._perform_arity >= 3 else self.perform(ctx.state))
        return self._outcome(value, ctx)

    def _outcome(self, value, ctx):
        if isinstance(value, (Next, Await, ScheduleChildren)):
            # A programming error no retry fixes: fail with what to do instead.
            return Stop(f"{type(self).name}: perform returned gd.{type(value).__name__}, a Machine step's outcome; "
                        "a Job's perform returns its result (stored, done), gd.Error(reason) to retry or "
                        "gd.Cancel(reason) to fail — make it a gd.Machine to go through steps")
        if isinstance(value, Error):
            return self._retry_or_stop(value.reason, ctx)
        if isinstance(value, Cancel):
            return Stop(value.reason)
        if isinstance(value, (Done, Stop)):
            return value
        return Done(value)

    def handle(self, error, ctx):
        """Retry by `backoff` until `max_attempts`, then fail. A value `perform` returned
        that cannot be stored (not JSON-serialisable, over MAX_PAYLOAD_BYTES)
        fails at once: running it again would return it again."""
        if getattr(error, "returned", False):
            return Stop(describe(error))
        return self._retry_or_stop(error, ctx)

    def _retry_or_stop(self, reason, ctx):
        if ctx.attempt + 1 < self.max_attempts:
            return Retry(delay=jittered(self.backoff(ctx.attempt)))
        return Stop(reason if isinstance(reason, str) else describe(reason))

    @classmethod
    def _collect_steps(cls) -> dict:
        # The one step is stored as "perform" and runs run_perform (arun_perform for an
        # `async def perform`, on the worker's event loop).
        return {"perform": "arun_perform" if inspect.iscoroutinefunction(cls.perform) else "run_perform"}

    @classmethod
    def _collect_timeouts(cls) -> dict:
        return {"perform": cls.timeout}


def jittered(delay) -> float:
    """Spread retries: a uniform draw from [0.75 × delay, delay].

    `delay` is what a (user) backoff returned: seconds as int, float or timedelta,
    clamped to [0, MAX_DELAY] — a huge one (2 ** attempt at attempt 1024 and up, or
    infinity) never overflows. Raises InvalidInput for NaN or a non-numeric delay.
    """
    if isinstance(delay, int) and not isinstance(delay, bool):
        delay = min(delay, int(MAX_DELAY))  # before float(): 2 ** 1024 overflows it
    elif isinstance(delay, float) and delay == float("inf"):
        delay = MAX_DELAY
    elif isinstance(delay, timedelta):
        delay = delay.total_seconds()
    if isinstance(delay, (int, float)) and not isinstance(delay, bool) and delay < 0:
        delay = 0.0
    return seconds(delay, "backoff delay") * (0.75 + 0.25 * random.random())


_CTX_NAMES = ("ctx", "context")


def _names_the_ctx(param) -> bool:
    """Whether a job function's second parameter is meant for the ctx: named ctx or
    context (or `_`-prefixed: unused), or annotated with gd.Context."""
    annotation = param.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", repr(annotation))
    return param.name in _CTX_NAMES or param.name.startswith("_") or "Context" in str(text)


def _job_arity(fn) -> int:
    """2 when @gd.job's `fn` takes (args, ctx), 1 when it takes (args); raises
    InvalidInput for a signature the job cannot be called with: none of one argument
    (a Celery-style `def send(to, subject)`), a second argument that is not the ctx, or
    a required keyword-only one. A `*args` function (a decorator's wrapper without
    functools.wraps) is given the ctx when it has two parameters or more, as before."""
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    short = getattr(fn, "__name__", None) or "fn"
    shape = (f"a job function is called with one dict, the `args` given at insert (args={{...}}), and "
             f"optionally the step's `ctx`: def {short}(args) or def {short}(args, ctx), reading "
             f"args['...'] inside")
    where = f"@gd.job {name}({', '.join(map(str, params))})"
    required_kw = [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is p.empty]
    if required_kw:
        raise InvalidInput(f"{where}: keyword-only {', '.join(required_kw)} would get no value; {shape}")
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return 2 if len(params) >= 2 else 1
    positional = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if not positional:
        raise InvalidInput(f"{where} cannot take the job's args: {shape}")
    extra = [p.name for p in positional[2:] if p.default is p.empty]
    if extra:
        raise InvalidInput(f"{where}: {', '.join(extra)} would get no value; {shape}")
    if len(positional) >= 2:
        second = positional[1]
        if _names_the_ctx(second):
            return 2
        if second.default is second.empty:
            raise InvalidInput(f"{where}: {shape} (name the second parameter ctx if it is for the ctx)")
    return 1


def job(fn=None, *, queue: str = "default", max_attempts: int = 20, name: str | None = None, version: int = 1,
        backoff=None, timeout=None):
    """Make a Job from a function `fn(args)` or `fn(args, ctx)`; returns the Job class.

    backoff: optional `f(attempt) -> seconds` replacing the default min(2**attempt, 300).
    timeout: seconds one attempt may run (see `Job.timeout`); None: MAX_STEP_SECONDS.

    Usage: `@gd.job(queue="email")` above `def send(args): ...`, then
    `gd.insert(send, args={...})` or `send.insert(args={...})`.
    """

    if backoff is not None and not callable(backoff):
        raise InvalidInput(f"@gd.job(backoff=) takes a function of the attempt number returning seconds "
                           f"(lambda attempt: 10 * 2 ** attempt), got {backoff!r}")

    def wrap(fn):
        arity = _job_arity(fn)

        if inspect.iscoroutinefunction(fn):
            async def perform(self, args, ctx):
                return await (fn(args, ctx) if arity >= 2 else fn(args))
        else:
            def perform(self, args, ctx):
                return fn(args, ctx) if arity >= 2 else fn(args)
        perform._gd_takes_ctx = arity >= 2  # fn(args) never sees the ctx: its claim loads no inbox
        perform._gd_function = fn  # where an error names the code (not __wrapped__: the arity is perform's)

        attrs = {
            "queue": queue,
            "max_attempts": max_attempts,
            "version": version,
            "name": name or f"{fn.__module__}.{fn.__qualname__}",
            "perform": perform,
            "__module__": fn.__module__,
            "__qualname__": fn.__qualname__,
            "__doc__": fn.__doc__,
            "func": staticmethod(fn),
            "timeout": timeout,
        }
        if backoff is not None:
            attrs["backoff"] = lambda self, attempt: backoff(attempt)

        def __init__(self, *given, **named):
            if given or named:  # `send(args)` as if @gd.job left the function callable
                raise TypeError(f"{fn.__name__} is a gen_durable job (a class made by @gd.job), not the "
                                f"function: insert it with {fn.__name__}.insert(args={{...}}); call the function "
                                f"itself as {fn.__name__}.func(args)")

        attrs["__init__"] = __init__
        return type(fn.__name__, (Job,), attrs)

    return wrap(fn) if fn is not None else wrap
