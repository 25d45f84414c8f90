"""What a step returns (docs/design.md#outcomes).

Each outcome is a frozen value; the executor validates it and turns it into a row of
the group-commit flush (worker/flusher.py). `state=KEEP` (the default) carries the
current state over; `concurrency_key=KEEP` in `Next` keeps the current key.
"""

from __future__ import annotations

import difflib
import math
import os
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .exceptions import InvalidInput


class _Keep:
    __slots__ = ()

    def __repr__(self):
        return "KEEP"

    def __bool__(self):
        return False


KEEP: Any = _Keep()

MAX_NAME_LENGTH = 255
"""Characters in a name or key: queue, signal and await names, correlation, concurrency,
rate-limit and dedup keys. They are indexed, and a btree entry must fit a third of a
page; 255 characters (at most 1020 bytes of UTF-8) always does."""
MAX_REASON_LENGTH = 4000
"""Characters in a reason given to Stop, Error, Cancel or cancel() (stored in last_error)."""
MAX_TRACEBACK_LENGTH = 8192
"""Characters of a failed attempt's traceback kept in last_traceback (a longer one keeps
its first line and its innermost frames); the worker's log has it whole."""
MAX_DELAY = 10 * 365 * 86400.0
"""Seconds: a delay, timeout or backoff beyond this (ten years) is clamped to it."""


def seconds(value, what: str) -> float:
    """Return `value` (seconds as int/float, or a timedelta) as float seconds ≥ 0.

    A finite value above MAX_DELAY (ten years) is clamped to it. Raises InvalidInput
    for a negative, NaN, infinite or non-numeric value, or an int too large for a float.
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be seconds (int, float or timedelta), got {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise InvalidInput(f"{what} is too large a number of seconds: {value!r}") from None
    if math.isnan(value) or value < 0 or math.isinf(value):
        raise InvalidInput(f"{what} must be a finite number of seconds >= 0, got {value!r}")
    return min(value, MAX_DELAY)


def text(value, what: str, limit: int = MAX_NAME_LENGTH) -> str:
    """Check a name or key is a non-empty str of at most `limit` characters that
    Postgres can store (no NUL, valid UTF-8); raise InvalidInput naming `what`."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > limit:
        raise InvalidInput(f"{what} is {len(value)} characters long; the limit is {limit} "
                           f"(it starts {value[:40]!r})")
    if "\x00" in value:
        raise InvalidInput(f"{what} contains a NUL character (\\x00), which Postgres text cannot store: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} is not valid Unicode (a lone surrogate?): {value!r}") from None
    return value


def weight_value(value, what: str = "weight") -> float:
    """A limiter weight: a finite number > 0; raise InvalidInput naming `what`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"{what} must be a number > 0, got {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (number > 0 and math.isfinite(number)):
        raise InvalidInput(f"{what} must be a finite number > 0, got {value!r}")
    return number


def reason_text(value, what: str) -> str:
    """A reason stored in last_error: a str of at most MAX_REASON_LENGTH characters
    (another value is described by its repr, shortened); NUL and lone surrogates are
    escaped. Raises InvalidInput naming `what` for a longer str."""
    from .codec import clean_text

    if not isinstance(value, str):
        value = describe(value)  # a description, not the caller's text: shortened
    if len(value) > MAX_REASON_LENGTH:
        raise InvalidInput(f"{what} is {len(value)} characters long; the limit is {MAX_REASON_LENGTH} "
                           "(store long diagnostics elsewhere and keep a reference)")
    return clean_text(value)


def describe(value) -> str:
    """A description of `value` for last_error, at most MAX_REASON_LENGTH characters:
    an exception as `Type: message` (error_text, the one format of a step's error),
    anything else as repr(value). Never raises."""
    from .codec import safe_repr

    if isinstance(value, BaseException):
        return error_text(value)
    text = safe_repr(value)
    return text if len(text) <= MAX_REASON_LENGTH else text[:MAX_REASON_LENGTH - 1] + "…"


def error_text(error: BaseException) -> str:
    """`Type: message` of an exception (`RuntimeError: smtp down`; the type alone when
    the message is empty), at most MAX_REASON_LENGTH characters, NUL and lone surrogates
    escaped. Never raises (an exception whose __str__ raises is described by its type)."""
    from .codec import clean_text, safe_repr

    name = safe_repr(type(error), lambda t: t.__name__)
    message = safe_repr(error, str)
    text = clean_text(f"{name}: {message}" if message else name)
    return text if len(text) <= MAX_REASON_LENGTH else text[:MAX_REASON_LENGTH - 1] + "…"


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def format_traceback(error: BaseException) -> str:
    """`traceback.format_exception(error)` without the engine's own outermost frames.

    A step's traceback begins in the worker (the executor calling the step); those
    frames say nothing about the failure, so each traceback of the chain (causes,
    contexts, exception groups) starts at its first frame outside the gen_durable
    package. One raised inside the engine itself, with no frame of user code, is kept
    whole. May raise what `format_exception` raises (an exception whose __str__ raises)."""
    top = traceback.TracebackException.from_exception(error)
    todo, seen = [top], set()
    while todo:
        te = todo.pop()
        if te is None or id(te) in seen:
            continue
        seen.add(id(te))
        first = next((i for i, frame in enumerate(te.stack)
                      if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR)), 0)
        if first:
            te.stack = traceback.StackSummary.from_list(te.stack[first:])
        todo += [te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ())]
    return "".join(top.format())


def user_traceback(tb):
    """`tb` (a traceback object) from its first frame outside the gen_durable package, for
    a log record's exc_info (the rule of `format_traceback`, for the outermost traceback
    only); `tb` itself when it has no such frame."""
    first = tb
    while first is not None and os.path.abspath(first.tb_frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        first = first.tb_next
    return first if first is not None else tb


def key_string(value, what: str):
    """Normalise a concurrency or rate key: None, "name" or (name, partition) → "name:partition".

    At most MAX_NAME_LENGTH characters in all; raise InvalidInput naming `what`.
    """
    if value is None or value is KEEP:
        return value
    if isinstance(value, tuple):
        if len(value) != 2:
            raise InvalidInput(f"{what} must be a name or a (name, partition) pair, got {value!r}")
        value = f"{value[0]}:{value[1]}"
    return text(value, what)


def _names(names) -> tuple[str, ...]:
    if isinstance(names, str):
        names = (names,)
    names = tuple(names)
    if not names:
        raise InvalidInput(f"Await needs one or more non-empty signal names, got {names!r}")
    return tuple(text(n, "Await signal name") for n in names)


@dataclass(frozen=True)
class Next:
    """Go to `step`; status runnable, attempt 0 (docs/guide.md).

    rate_limit: None, "name" or (name, partition) for the next step (docs/design.md#rate-limits).
    weight: tokens the next step takes, > 0; other than 1 only with a rate_limit
        (InvalidInput otherwise: it would do nothing).
    concurrency_key: KEEP (default), None (release) or a new key (docs/design.md#concurrency-keys).
    inline: None (the machine's `inline_execution`), True or False: run the next step
        at once in the same worker, after this transition commits (docs/guide.md).
    """

    step: str
    state: Any = KEEP
    rate_limit: Any = None
    weight: float = 1.0
    concurrency_key: Any = KEEP
    inline: bool | None = None

    def __post_init__(self):
        if not isinstance(self.step, str) or not self.step:
            raise InvalidInput(f"Next needs a step name, got {self.step!r}")
        # The defaults (no rate limit, the key kept, weight 1.0) need no normalising: most
        # Nexts skip the three calls (a Next is built on every step of a chain).
        if self.rate_limit is not None:
            object.__setattr__(self, "rate_limit", key_string(self.rate_limit, "rate_limit"))
        if self.concurrency_key is not KEEP and self.concurrency_key is not None:
            object.__setattr__(self, "concurrency_key", key_string(self.concurrency_key, "concurrency_key"))
        weight = self.weight
        if type(weight) is not float or not 0.0 < weight < math.inf:  # NaN fails the comparison too
            object.__setattr__(self, "weight", weight_value(weight, "Next weight"))
        if self.rate_limit is None and self.weight != 1.0:
            raise InvalidInput(f"Next weight={self.weight:g} without a rate_limit: a weight is what the next "
                               "step costs its rate limit's bucket and does nothing without one")

        if self.inline is not None and not isinstance(self.inline, bool):
            raise InvalidInput(f"Next inline must be None (the machine's inline_execution), True or False, "
                               f"got {self.inline!r}")


@dataclass(frozen=True)
class Retry:
    """Re-run the same step after `delay` seconds, attempt + 1; keeps awaited signals."""

    state: Any = KEEP
    delay: Any = 0

    def __post_init__(self):
        object.__setattr__(self, "delay", seconds(self.delay, "Retry delay"))


@dataclass(frozen=True)
class Await:
    """Park until a signal named in `names` arrives, then run `next` (docs/design.md#signals).

    timeout: seconds > 0 or None; on expiry the step runs with ctx.awaited == [].
    consume: what happens to the signals this step was handed (ctx.awaited) — False (the
        default): they stay in the inbox, so the step after the next wake is handed them
        again with the new arrival (its ctx.awaited holds both: handle each once, by
        signal id); True: deleted with this outcome, as a Next would, so the next wake
        hands over only what arrived since. Raises InvalidInput for a non-bool.
    """

    names: Any
    next: str
    state: Any = KEEP
    timeout: Any = None
    consume: bool = False

    def __post_init__(self):
        if not isinstance(self.consume, bool):
            raise InvalidInput(f"Await consume must be True or False, got {self.consume!r}")
        object.__setattr__(self, "names", _names(self.names))
        if not isinstance(self.next, str) or not self.next:
            raise InvalidInput(f"Await needs next=<step name>, got {self.next!r}")
        if self.timeout is not None:
            t = seconds(self.timeout, "Await timeout")
            if t <= 0:
                raise InvalidInput("Await timeout must be > 0 seconds")
            object.__setattr__(self, "timeout", t)


# gd.insert's keywords besides machine and using (calls.build_row's parameters; a test
# keeps the two in step).
INSERT_KEYWORDS = frozenset({"state", "args", "step", "queue", "priority", "schedule_in", "schedule_at",
                             "eligible_at", "correlation_key", "correlation_scope", "concurrency_key",
                             "rate_limit", "weight"})


@dataclass(frozen=True)
class Spec:
    """One instance to insert: `Spec(Machine, **insert_kwargs)` (docs/guide.md).

    Raises TypeError for a keyword `gd.insert` does not take, where the Spec is written
    (`using` is refused by insert_all, which takes it for the whole batch).
    """

    machine: Any
    kwargs: dict = field(default_factory=dict)

    def __init__(self, machine, **kwargs):
        if not kwargs.keys() <= INSERT_KEYWORDS:
            _check_keywords(kwargs)
        object.__setattr__(self, "machine", machine)
        object.__setattr__(self, "kwargs", kwargs)


def _check_keywords(kwargs):
    unknown = sorted(k for k in kwargs if k not in INSERT_KEYWORDS and k != "using")
    if unknown:
        close = difflib.get_close_matches(unknown[0], INSERT_KEYWORDS, n=1)
        raise TypeError(f"gd.Spec() got an unexpected keyword argument {unknown[0]!r}; "
                        + (f"did you mean {close[0]!r}?" if close
                           else f"insert keywords: {', '.join(sorted(INSERT_KEYWORDS))}"))


class Child(Spec):
    """One child to insert with ScheduleChildren: `Child(Machine, **insert_kwargs)`.

    Raises TypeError where it is written for a keyword `gd.insert` does not take, and for
    `using`: children are inserted in their parent's database, in the flush that parks it.
    """

    __slots__ = ()

    def __init__(self, machine, **kwargs):
        if "using" in kwargs:
            raise TypeError("gd.Child() takes no using=: a child is inserted in its parent's database, in the "
                            "same transaction as the parent's park")
        super().__init__(machine, **kwargs)


@dataclass(frozen=True)
class ScheduleChildren:
    """Insert `children` and park until every one is terminal, then run `next` (docs/design.md#children)."""

    next: str
    children: Any = ()
    state: Any = KEEP

    def __post_init__(self):
        kids = tuple(self.children)
        if not all(isinstance(c, Spec) for c in kids):
            raise InvalidInput("ScheduleChildren children must be gd.Child(Machine, **kwargs) values")
        object.__setattr__(self, "children", kids)
        if not isinstance(self.next, str) or not self.next:
            raise InvalidInput(f"ScheduleChildren needs next=<step name>, got {self.next!r}")


@dataclass(frozen=True)
class Done:
    """Terminal `done`; `result` (JSON) is stored."""

    result: Any = None


@dataclass(frozen=True)
class Stop:
    """Terminal `failed`; `reason` is stored in last_error."""

    reason: Any = "stopped"

    def __post_init__(self):
        object.__setattr__(self, "reason", reason_text(self.reason, "Stop reason"))


@dataclass(frozen=True)
class Error:
    """Job outcome: retry with the job's backoff until max_attempts, then failed."""

    reason: Any = "error"

    def __post_init__(self):
        object.__setattr__(self, "reason", reason_text(self.reason, "Error reason"))


@dataclass(frozen=True)
class Cancel:
    """Job outcome: failed at once, no retry."""

    reason: Any = "cancelled"

    def __post_init__(self):
        object.__setattr__(self, "reason", reason_text(self.reason, "Cancel reason"))


OUTCOMES = (Next, Retry, Await, ScheduleChildren, Done, Stop)
