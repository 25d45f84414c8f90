"""The public calls: insert, insert_all (+ async twins) and friends (docs/guide.md).

Each blocking call runs on Django's connection for `using` (default: where
GEN_DURABLE['DATABASES'] routes it, else GEN_DURABLE['DATABASE']) and so takes part in
the caller's `transaction.atomic()` on that alias.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import warnings
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.db import connections

from . import db, registry, sql
from .codec import encode_state
from .conf import database_alias, get_settings, routed_alias
from .codec import encode
from .exceptions import DuplicateInstance, InvalidInput, NoTarget, RoutedOutsideTransactionWarning, SerializationError
from .limiter.config import get_limits
from .statuses import LIVE_STATUSES, Status
from .outcomes import Spec, key_string, reason_text, seconds, text, weight_value

SMALLINT = (-32768, 32767)
_PACKAGE_DIR = os.path.dirname(__file__) + os.sep
STATUSES = frozenset(Status.values)


def input_word(cls) -> str:
    """What an error calls a row's input: a Job's "args" (what insert(args=) names), a
    Machine's "state"."""
    from .machine import Job

    return "args" if isinstance(cls, type) and issubclass(cls, Job) else "state"


def resolve_machine(machine) -> type:
    """Accept a Machine subclass (or a @job) or a registered name; raise UnknownMachine."""
    if isinstance(machine, type) and getattr(machine, "_gd_machine", False) and not machine.__dict__.get("abstract"):
        return machine
    if isinstance(machine, str):
        return registry.latest(machine)
    raise InvalidInput(f"expected a gen_durable Machine or Job class (or its registered name), got {machine!r}")


_known_cache: list = [None, None]  # [(settings, registry size), (names, patterns)]


def declared_queues() -> tuple[frozenset, tuple]:
    """(names, fnmatch patterns) of the queues a call may name: the keys of
    GEN_DURABLE['QUEUES'], every registered machine's queue, and GEN_DURABLE['EXTRA_QUEUES']
    (queues other deployments serve; an entry with * ? [ is a pattern)."""
    s = get_settings()
    n = len(registry._machines)
    cached = _known_cache[0]
    if cached is None or cached[0] is not s or cached[1] != n:  # the settings object itself: reset by setting_changed
        key = (s, n)
        extra = s.EXTRA_QUEUES if isinstance(s.EXTRA_QUEUES, (list, tuple, set, frozenset)) else ()
        extra = [e for e in extra if isinstance(e, str) and e]
        names = set(s.QUEUES) if isinstance(s.QUEUES, dict) else set()
        names.update(cls.queue for cls in registry.all_machines().values())
        names.update(e for e in extra if not any(c in e for c in "*?["))
        patterns = tuple(e for e in extra if any(c in e for c in "*?["))
        _known_cache[:] = [key, (frozenset(names), patterns)]
    return _known_cache[1]


def check_queue(name: str) -> None:
    """Raise InvalidInput naming the closest declared queue when no one declares `name`
    (a typo would otherwise be a backlog no worker ever runs; docs/guide.md, "Queues")."""
    import fnmatch

    names, patterns = declared_queues()
    if name in names or any(fnmatch.fnmatchcase(name, p) for p in patterns):
        return
    import difflib

    close = difflib.get_close_matches(name, sorted(names), n=1)
    raise InvalidInput(
        f"queue {name!r} is not declared" + (f"; did you mean {close[0]!r}?" if close else ".")
        + f" Declared queues: {', '.join(sorted(names))} (the keys of GEN_DURABLE['QUEUES'] and the registered "
        "machines' queues); a queue another deployment's workers serve goes in GEN_DURABLE['EXTRA_QUEUES'].")


def check_rate_limit(rate_limit: str | None) -> None:
    """Raise InvalidInput, naming the closest configured one, when `rate_limit`'s name
    (before the first ':') is not in GEN_DURABLE['RATE_LIMITS']: the row would never be
    admitted."""
    if rate_limit is None or get_limits().rate_for(rate_limit) is not None:
        return
    import difflib

    from .limiter.config import name_of

    rates = get_settings().RATE_LIMITS
    configured = sorted(rates) if isinstance(rates, dict) else []
    name = name_of(rate_limit)
    close = difflib.get_close_matches(name, configured, n=1)
    raise InvalidInput(
        f"rate_limit {name!r} is not configured" + (f"; did you mean {close[0]!r}?" if close else ".")
        + f" GEN_DURABLE['RATE_LIMITS'] has {', '.join(configured) or 'none'}: a row naming an unconfigured "
        "rate limit would never be admitted.")


def _aware(value, what):
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise InvalidInput(f"{what} must be an aware datetime, got {value!r}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(f"{what} must be timezone-aware (naive datetimes are ambiguous); got {value!r}")
    try:
        # Postgres stores the UTC instant; one outside Python's years 1..9999 (year 1
        # with a positive offset is year 0 in UTC) would be stored but never read back.
        value.astimezone(dt.timezone.utc)
    except (OverflowError, ValueError):
        raise InvalidInput(f"{what} {value!r} is outside the years 1..9999 in UTC, which "
                           "Postgres can store but Python cannot read back") from None
    return value


@dataclass(slots=True)
class Row:
    """One validated insert: the values of insert.sql / insert_all.sql."""

    fsm: str
    fsm_version: int
    step: str
    state: str
    queue: str
    priority: int
    at: dt.datetime | None
    delay: float
    concurrency_key: str | None
    rate_limit: str | None
    weight: float
    correlation_key: str | None
    scope: tuple


def build_row(machine, *, state=None, args=None, step=None, queue=None, priority=0,
              schedule_in=None, schedule_at=None, eligible_at=None, correlation_key=None,
              correlation_scope=None, concurrency_key=None, rate_limit=None, weight=1) -> Row:
    """Validate one insert's arguments (see `insert`); raise InvalidInput/SerializationError."""
    cls = resolve_machine(machine)
    if args is not None:
        if state is not None:
            raise InvalidInput("pass state= or args= (its alias for jobs), not both")
        state = args
    step = step or cls.initial
    if step not in cls.steps:
        from .machine import step_suggestion

        raise InvalidInput(f"{cls.name} has no step {step!r}{step_suggestion(cls, step)}; "
                           f"its steps are {sorted(cls.steps)}")
    queue = cls.queue if queue is None else queue
    if not isinstance(queue, str) or not queue.strip():
        raise InvalidInput(f"queue must be a non-empty string, got {queue!r}")
    text(queue, "queue")
    check_queue(queue)
    if isinstance(priority, bool) or not isinstance(priority, int) or not SMALLINT[0] <= priority <= SMALLINT[1]:
        raise InvalidInput(f"priority must be an int in [{SMALLINT[0]}, {SMALLINT[1]}] (lower runs first), got {priority!r}")
    priority = int(priority)  # an IntEnum renders as its name otherwise
    at = _aware(eligible_at, "eligible_at") or _aware(schedule_at, "schedule_at")
    delay = 0.0 if schedule_in is None else seconds(schedule_in, "schedule_in")
    if correlation_key is not None:
        text(correlation_key, "correlation_key")
    if correlation_scope is None:
        scope = LIVE_STATUSES
    else:
        if isinstance(correlation_scope, str):
            raise InvalidInput("correlation_scope is a list of statuses, not a string")
        scope = tuple(str(s) for s in correlation_scope)
        bad = [s for s in scope if s not in STATUSES]
        if bad:
            raise InvalidInput(f"correlation_scope has unknown statuses {bad}; valid: {sorted(STATUSES)}")
    weight = weight_value(weight)
    rate_limit = key_string(rate_limit, "rate_limit")
    if rate_limit is None and weight != 1:
        raise InvalidInput(f"weight={weight:g} without a rate_limit: a weight is what a row costs its rate "
                           "limit's bucket and does nothing without one")
    check_rate_limit(rate_limit)
    limit = get_limits().rate_for(rate_limit)
    if limit is not None and weight > limit.burst:
        raise InvalidInput(f"weight {weight:g} is above the burst {limit.burst:g} of rate limit "
                           f"{limit.name!r}: the row could never be admitted")
    limit = get_settings().MAX_PAYLOAD_BYTES
    return Row(
        fsm=cls.name, fsm_version=cls.version, step=step,
        state=encode_state(state, f"{input_word(cls)} of {cls.name}", limit, cls.State),
        queue=queue, priority=priority, at=at, delay=delay,
        concurrency_key=key_string(concurrency_key, "concurrency_key"),
        rate_limit=rate_limit, weight=float(weight),
        correlation_key=correlation_key, scope=scope,
    )


def insert(machine, *, state=None, args=None, step=None, queue=None, priority=0,
           schedule_in=None, schedule_at=None, eligible_at=None, correlation_key=None,
           correlation_scope=None, concurrency_key=None, rate_limit=None, weight=1,
           using=None) -> int:
    """Insert one instance of `machine` and return its id. Statements: 1 (docs/guide.md, docs/design.md#performance-contract).

    Args:
        machine: a Machine/Job class or its registered name.
        state: JSON-serialisable value (dict, or the machine's State); `args` is its alias.
        step: first step (default `machine.initial`).
        queue: default `machine.queue`; priority: smallint, lower runs first.
        eligible_at > schedule_at > schedule_in: when it may first run — aware datetimes,
            or seconds ≥ 0 (float or timedelta) from the database's clock (docs/design.md#one-clock).
        correlation_key / correlation_scope: identity and its reserved statuses (docs/design.md#identity);
            scope default = live statuses; [] = no uniqueness and not addressable.
        concurrency_key, rate_limit: None, "name" or (name, partition); weight > 0, other
            than 1 only with a rate_limit.
        using: database alias; default: the alias GEN_DURABLE['DATABASES'] routes the
            machine or its queue to, else GEN_DURABLE['DATABASE'] (docs/scaling.md).
    Raises:
        DuplicateInstance: the correlation key is occupied.
        InvalidInput: bad queue, priority, step, delay, naive datetime, scope or weight; a
            queue no one declares (GEN_DURABLE['QUEUES'], a registered machine's queue,
            GEN_DURABLE['EXTRA_QUEUES']) or a rate_limit RATE_LIMITS lacks, naming the
            closest declared name. A refused call writes nothing.
        SerializationError: state is not JSON or exceeds MAX_PAYLOAD_BYTES.
        UnknownMachine: an unregistered machine name.
    Inside `transaction.atomic()` on the alias the row goes to, the row and its wake-up
    become visible on commit. A row routed by GEN_DURABLE['DATABASES'] to another alias
    than the open transaction's commits at once (RoutedOutsideTransactionWarning).
    """
    row = build_row(machine, state=state, args=args, step=step, queue=queue, priority=priority,
                    schedule_in=schedule_in, schedule_at=schedule_at, eligible_at=eligible_at,
                    correlation_key=correlation_key, correlation_scope=correlation_scope,
                    concurrency_key=concurrency_key, rate_limit=rate_limit, weight=weight)
    params = {
        "fsm": row.fsm, "fsm_version": row.fsm_version, "step": row.step, "state": row.state,
        "queue": row.queue, "priority": row.priority, "at": row.at, "delay": row.delay,
        "concurrency_key": row.concurrency_key, "rate_limit": row.rate_limit, "weight": row.weight,
        "correlation_key": row.correlation_key, "scope": list(row.scope),
    }
    if using is None:
        using = routed_alias(row.fsm, row.queue)
        if using is not None:
            warn_outside_atomic("insert", row.fsm, using)
    found = db.fetchone(sql.INSERT, params, using)
    if found is None:
        # Who holds the key, for the message: one more statement, on this path only.
        holder = db.fetchone("SELECT id FROM gen_durable WHERE correlation_guard = %(key)s",
                             {"key": row.correlation_key}, using)
        raise DuplicateInstance(row.correlation_key, holder[0] if holder else None)
    return found[0]


# Insert keywords that usually differ from spec to spec in a batch; spec_batch validates
# them per spec and everything else once per distinct shape.
_PER_ROW = frozenset({"state", "args", "correlation_key"})
# Types whose equal values validate and store alike, so a validated shape can be
# reused for them: not a tuple (it could hold 1 and 1.0, which render differently as a
# key partition), not a datetime (two readings of a repeated wall-clock hour, fold 0
# and 1, compare equal and hash alike but are an hour apart).
_SHAPE_TYPES = frozenset({str, int, float, type(None), dt.timedelta})


@dataclass(slots=True)
class Batch:
    """Validated inserts as columns: what insert_all.sql reads.

    A row's state and correlation key are its own; every other value is that of its
    shape, a validated Row (whose own state and key the batch ignores).
    shape: per row, the index of its shape in `shapes`; None when every row has
    shapes[0] — so a batch of one machine holds two lists of strings and no object per
    row (100,000 Rows cost insert_all a fifth of its time in allocation and GC).
    """

    shapes: list[Row]
    shape: list[int] | None
    state: list[str]
    correlation_key: list[str | None]

    @classmethod
    def of(cls, rows: list[Row]) -> Batch:
        """Rows validated one by one (children, buffered inserts): a shape each."""
        return cls(list(rows), list(range(len(rows))), [r.state for r in rows],
                   [r.correlation_key for r in rows])

    def take(self, order: list[int]) -> Batch:
        """The rows at positions `order`, in that order."""
        return Batch(self.shapes, None if self.shape is None else [self.shape[p] for p in order],
                     [self.state[p] for p in order], [self.correlation_key[p] for p in order])

    def guarded(self, p: int) -> bool:
        """Whether row `p`'s key is reserved at insert (runnable ∈ scope)."""
        shape = self.shapes[0 if self.shape is None else self.shape[p]]
        return self.correlation_key[p] is not None and "runnable" in shape.scope


def spec_batch(specs) -> Batch:
    """Validate `gd.Spec` values into a Batch (the checks of `build_row`).

    A batch usually repeats a few shapes — one machine, queue, priority… with a state
    and maybe a correlation key per row — so each distinct shape is validated once
    and only the per-row keywords are checked per spec.
    """
    shapes: list[Row] = []
    shape: list[int] | None = None  # built once a second shape turns up
    states: list[str] = []
    keys: list[str | None] = []
    seen: dict = {}  # key -> (its index in shapes, the state's name in errors)
    payload_limit = get_settings().MAX_PAYLOAD_BYTES
    i = 0
    try:
        for i, spec in enumerate(specs):
            if not isinstance(spec, Spec):
                raise InvalidInput(f"insert_all takes gd.Spec(Machine, **kwargs) values; item {i} is {spec!r}")
            kwargs = spec.kwargs
            if kwargs.keys() <= _PER_ROW:  # the common batch: a machine and per-row values
                key = (spec.machine,)
            else:
                if "using" in kwargs:
                    raise InvalidInput("pass using= to insert_all itself, not inside a Spec")
                shared = [(k, type(v), v) for k, v in kwargs.items() if k not in _PER_ROW]
                key = (spec.machine, *shared) if all(t in _SHAPE_TYPES for _, t, _v in shared) else None
            found = None
            if key is not None:
                try:
                    found = seen.get(key)
                except TypeError:  # an unhashable machine argument: validate it whole
                    key = None
            if found is None:
                # A new shape (or one that cannot be reused) gets every check, in build_row's
                # order (the same error as insert() for a spec with several faults).
                row = build_row(spec.machine, **kwargs)
                index = len(shapes)
                shapes.append(row)
                if key is not None:
                    cls = resolve_machine(spec.machine)
                    seen[key] = (index, f"{input_word(cls)} of {row.fsm}", cls.State)
                if index and shape is None:
                    shape = [0] * i
                state, correlation_key = row.state, row.correlation_key
            else:
                index, what, state_type = found
                state, correlation_key = kwargs.get("state"), kwargs.get("correlation_key")
                if "args" in kwargs:
                    if state is not None and kwargs["args"] is not None:
                        raise InvalidInput("pass state= or args= (its alias for jobs), not both")
                    state = kwargs["args"] if state is None else state
                if correlation_key is not None:
                    text(correlation_key, "correlation_key")
                state = encode_state(state, what, payload_limit, state_type)
            if shape is not None:
                shape.append(index)
            states.append(state)
            keys.append(correlation_key)
    except (InvalidInput, SerializationError) as exc:
        if str(exc).startswith("insert_all takes"):
            raise
        # Which spec of a long list: the message names its values, not its place.
        raise type(exc)(f"item {i} of insert_all: {exc}") from None
    return Batch(shapes, shape, states, keys)


# The columns of insert_all.sql that a row takes from its shape.
_SHAPE_COLUMNS = ("fsm", "fsm_version", "step", "queue", "priority", "at", "delay",
                  "concurrency_key", "rate_limit", "weight", "scope")


def batch_alias(batch: Batch) -> str | None:
    """The one database GEN_DURABLE['DATABASES'] routes every shape of `batch` to (None:
    unrouted). Raises InvalidInput for a batch whose rows live on different databases:
    one insert_all is one statement on one database."""
    aliases = {database_alias(routed_alias(s.fsm, s.queue)) for s in batch.shapes}
    if len(aliases) > 1:
        raise InvalidInput(f"insert_all: these rows are routed to different databases ({', '.join(sorted(aliases))}) "
                           "by GEN_DURABLE['DATABASES']; insert each database's rows in a call of its own "
                           "(or pass using=)")
    return routed_alias(batch.shapes[0].fsm, batch.shapes[0].queue) if batch.shapes else None


def caller_stacklevel(skip: tuple = ()) -> int:
    """The `stacklevel` for a `warnings.warn` in the caller of this function that names
    the first frame outside gen_durable (and the directories in `skip`: asgiref's
    sync_to_async, the Tasks framework) — the user's line."""
    frame, stacklevel = sys._getframe(2), 2
    while frame is not None and frame.f_code.co_filename.startswith((_PACKAGE_DIR, *skip)):
        frame, stacklevel = frame.f_back, stacklevel + 1
    return stacklevel


def warn_outside_atomic(call: str, fsm: str, routed: str, why: str | None = None, skip: tuple = ()) -> None:
    """Warn (RoutedOutsideTransactionWarning) when a call that the routes sent to alias
    `routed` runs inside `transaction.atomic()` on another alias but none on `routed`:
    Django's transactions are per database, so the row commits at once. The warning
    names the first caller outside gen_durable (`Checkout.insert()` too). why: the
    setting that chose `routed` (default: GEN_DURABLE["DATABASES"] for `fsm`); skip:
    directories of other libraries' frames between the caller and gen_durable."""
    if connections[routed].in_atomic_block:
        return
    held = sorted(c.alias for c in connections.all(initialized_only=True) if c.in_atomic_block)
    if held:
        stacklevel = caller_stacklevel(skip)
        hint = ", or pass using=" if why is None else ""  # a route: the caller may choose the alias
        why = why or f"GEN_DURABLE['DATABASES'] routes {fsm!r} to database {routed!r}"
        warnings.warn(RoutedOutsideTransactionWarning(
            f"{call}: {why}, which has no "
            f"transaction open, while transaction.atomic() is open on {', '.join(map(repr, held))}: the row "
            f"commits now and survives a rollback of that block; wrap the call in "
            f"transaction.atomic(using={routed!r}) too{hint} (docs/scaling.md)"),
            stacklevel=stacklevel)


def insert_rows(batch: Batch, parent_ids=None, using=None) -> list[int | None]:
    """Run insert_all.sql for a validated batch; return ids in input order (None = duplicate)."""
    n = len(batch.state)
    if not n:
        return []
    keys = batch.correlation_key
    order = None
    if keys.count(None) != n:
        # Key order, stable (insert_all.sql: one lock order for racing batches).
        order = sorted(range(n), key=lambda p: (keys[p] is None, keys[p] or ""))
        batch = batch.take(order)
        if parent_ids is not None:
            parent_ids = list(parent_ids)
            parent_ids = [parent_ids[p] for p in order]
    per_shape = {name: [getattr(s, name) for s in batch.shapes] for name in _SHAPE_COLUMNS}
    # As UTC instants: aware datetimes that compare equal need not be one instant
    # (fold), and batch_column sends equal values once.
    per_shape["at"] = [None if a is None else a.astimezone(dt.timezone.utc) for a in per_shape["at"]]
    per_shape["scope"] = [None if s == LIVE_STATUSES else ",".join(s) for s in per_shape["scope"]]
    params = {"state": db.pg_array(batch.state)}
    for name, values in per_shape.items():
        if batch.shape is None:  # one shape: one value, whatever the batch's size
            params[name], params[name + "_1"] = None, values[0]
        else:
            params[name], params[name + "_1"] = db.batch_column([values[s] for s in batch.shape])
    params["correlation_key"], params["correlation_key_1"] = db.batch_column(batch.correlation_key)
    params["parent_id"], params["parent_id_1"] = db.batch_column([None] if parent_ids is None else list(parent_ids))
    if using is None:
        using = batch_alias(batch)
    ids = map_returned(batch, db.fetchall(sql.INSERT_ALL, params, using))
    if order is None:
        return ids
    out: list[int | None] = [None] * len(ids)
    for p, id_ in zip(order, ids):
        out[p] = id_
    return out


def map_returned(batch: Batch, returned: list[tuple[int, str | None]]) -> list[int | None]:
    """Map RETURNING (id, key) back to input positions.

    Rows are inserted in (key, position) order, so within one key ids ascend with
    position. Per key, rows whose scope lacks 'runnable' always land; of the guarded
    ones only the first can land (later ones conflict in-batch), and none when the key
    was already held.
    """
    keys = batch.correlation_key
    if len(returned) == len(keys) and all(key is None for _id, key in returned):
        return sorted(r[0] for r in returned)  # no keys: every row landed, in input order
    out: list[int | None] = [None] * len(keys)
    by_key: dict = {}
    for pos, key in enumerate(keys):
        by_key.setdefault(key, []).append(pos)
    ids_by_key: dict = {}
    for id_, key in returned:
        ids_by_key.setdefault(key, []).append(id_)
    for key, positions in by_key.items():
        ids = sorted(ids_by_key.get(key, ()))
        if not ids:
            continue
        if key is None:
            candidates = positions
        else:
            unguarded = [p for p in positions if not batch.guarded(p)]
            guarded = [p for p in positions if batch.guarded(p)][:1]
            candidates = sorted(unguarded + guarded) if len(ids) > len(unguarded) else unguarded
        for pos, id_ in zip(candidates, ids):
            out[pos] = id_
    return out


def insert_all(specs, *, using=None) -> list[int | None]:
    """Insert a batch of `gd.Spec(machine, **insert_kwargs)`; one statement for any size.

    Returns ids in input order, None where the correlation key was a duplicate (within
    the batch or against live rows). Statements: 1 (0 for an empty list). Raises what
    `insert` raises for a bad spec, before anything is written, and InvalidInput for a
    batch GEN_DURABLE['DATABASES'] routes to different databases. Without `using=` the
    batch goes where its rows are routed; like `insert`, it joins a `transaction.atomic()`
    on that alias only (RoutedOutsideTransactionWarning when one is open elsewhere).
    """
    batch = spec_batch(specs)
    if using is None and batch.shapes:
        using = batch_alias(batch)
        if using is not None:
            warn_outside_atomic("insert_all", batch.shapes[0].fsm, using)
    return insert_rows(batch, using=using)


ainsert = sync_to_async(insert)
ainsert.__doc__ = "Async twin of `insert`."
ainsert_all = sync_to_async(insert_all)
ainsert_all.__doc__ = "Async twin of `insert_all`."


def signal(target, name: str, payload=None, *, dedup_key: str | None = None, using=None) -> int | None:
    """Deliver signal `name` to `target` (an id or a live correlation key). Statements: 1.

    The signal lands in the target's inbox; a target parked awaiting `name` becomes
    runnable and its queue is notified on commit (docs/design.md#signals). Signals to instances not
    parked on `name` wait in the inbox for a later Await.
    Args: payload: JSON-serialisable; dedup_key (at most 255 characters): once a key
        has been delivered to an instance — under any signal name — it stays delivered
        for the instance's whole life, consumed or not; a redelivery stores nothing
        and wakes nothing (docs/design.md#signals).
    Returns: the signal id, or None when `dedup_key` was already delivered.
    Raises: NoTarget (missing or terminal target; nothing is stored), InvalidInput,
        SerializationError.
    Warns: `UnawaitedSignalWarning` (at the caller's line) when the target's machine can
        never await `name`, as read from its source — a typo that would leave the instance
        parked until its Await timeout. The signal is stored all the same.
    """
    signal_id, fsm, version = deliver_signal(target, name, payload, dedup_key, using)
    _warn_if_unawaited(name, fsm, version, "signal")
    return signal_id


def deliver_signal(target, name, payload, dedup_key, using):
    """Deliver one signal (signal.sql): (signal id | None, the target's fsm, fsm_version)."""
    from .results import target_params

    text(name, "signal name")
    if dedup_key is not None:
        text(dedup_key, "dedup_key")
    params = target_params(target)
    params.update(name=name, dedup_key=dedup_key,
                  payload=encode(payload, f"payload of signal {name!r}", get_settings().MAX_PAYLOAD_BYTES))
    row = db.fetchone(sql.SIGNAL, params, using)
    if row is None:
        raise NoTarget(target)
    return row[0], row[4], row[5]


def unawaited_reason(name: str, fsm: str, version: int) -> str | None:
    """Why machine (fsm, version) can never await signal `name`, in words; None when it
    may (or this process cannot tell: the machine is not registered here, or its Awaits
    name signals built at run time — source_steps.awaited_signal_names)."""
    import difflib

    from .source_steps import awaited_signal_names

    try:
        cls = registry.get(fsm, version)
    except Exception:
        return None
    if "inbox" not in getattr(cls, "_gd_inputs", ("inbox",)):
        return f"{fsm} never sees signals (its code takes no ctx)"
    names = awaited_signal_names(cls)
    if names is None or name in names:
        return None
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return (f"{fsm}'s steps await only {', '.join(map(repr, sorted(names)))}"
            + (f" — did you mean {close[0]!r}?" if close else ""))


def _warn_if_unawaited(name, fsm, version, call):
    why = unawaited_reason(name, fsm, version)
    if why is not None:
        from .exceptions import UnawaitedSignalWarning

        warnings.warn(UnawaitedSignalWarning(
            f"gd.{call}(..., {name!r}): {why}; the signal is stored in the inbox but no step of this "
            "machine will be woken by it (docs/guide.md, \"Calls\")"), stacklevel=caller_stacklevel())


def cancel(target, reason: str = "cancelled", *, using=None) -> int:
    """Fail the live instance `target` now with `reason`; return its id. Statements: 1.

    A step still running for it finishes, but its outcome is dropped by the ownership
    guard. A cancelled child counts off its parent's join like any terminal child.
    Cancelling a running step frees its concurrency key at once: another instance of
    the key may start while the cancelled step is still finishing (K=1 then holds for
    committed outcomes only).
    Raises NoTarget for a missing or already terminal target.
    """
    from .results import target_params

    params = target_params(target)
    params["reason"] = reason_text("cancelled" if reason is None else reason, "cancel reason")
    from contextlib import nullcontext

    from django.db import transaction

    from .conf import database_alias
    from .limiter import get_limiter

    limiter = get_limiter(using)
    # A running step's gate slot is given back with the cancel (in its transaction on
    # Postgres): the step's own late outcome is dropped and credits nothing.
    with transaction.atomic(using=database_alias(using)) if limiter.transactional else nullcontext():
        row = db.fetchone(sql.CANCEL, params, using)
        if row is None:
            raise NoTarget(target)
        slot = limiter.slot_for(row[0], row[3], row[4], row[5])
        if slot is not None and limiter.transactional:
            limiter.credit([slot])
    if slot is not None and not limiter.transactional:
        limiter.credit([slot])
    return row[0]


_asignal = sync_to_async(deliver_signal)


async def asignal(target, name: str, payload=None, *, dedup_key: str | None = None, using=None) -> int | None:
    """Async twin of `signal`."""
    signal_id, fsm, version = await _asignal(target, name, payload, dedup_key, using)
    _warn_if_unawaited(name, fsm, version, "asignal")  # here, not in the thread: at the caller's line
    return signal_id


acancel = sync_to_async(cancel)
acancel.__doc__ = "Async twin of `cancel`."


def retry(target, *, step: str | None = None, using=None) -> int:
    """Make instance `target` (id or live correlation key) runnable at its current step now
    (or at `step`: resume a failed instance at a chosen step with its committed state —
    a step renamed or removed since it failed, a step to redo; docs/guide.md, "Deploying").

    Retries a `failed` instance, wakes one parked `awaiting_signal` (as its Await timeout
    would: `ctx.awaited` holds the matching inbox signals, possibly none), and makes a
    `runnable` one waiting for its retry back-off or schedule eligible now.
    A failed instance that failed on an Await — cancelled while parked, or failed in the
    step the Await woke (its timeout fired, or it stopped after the wake) — is parked
    again on the same signal names (`awaiting_signal`, no deadline) rather than re-run
    with no signal: the next matching signal resumes it.
    Attempt rule: a failed instance starts a fresh count (`attempt` = 0, so a job gets its
    whole `max_attempts` again); any other keeps its `attempt`. `last_error` is kept.
    A failed child whose parent still waits on its children is counted on the join again.
    Failed instances are addressed by id: their correlation key was released when they
    failed. Statements: 1 (in a savepoint when called inside a transaction, so a racing
    insert of the same key raises DuplicateInstance without aborting it). Returns the id.
    Raises:
        NoTarget: no such instance.
        NotRetryable: it is done, executing, or awaiting its children.
        DuplicateInstance: it failed and another live instance now holds its correlation key.
        InvalidInput: `target` is neither an int nor a str; `step` is not a step of the
            row's machine (naming the close match; nothing is written).
        UnknownMachine: with `step`, this process does not know the row's machine/version.
    With `step`: 2 statements (the row's machine is read first, to check the step).
    """
    from django.db import IntegrityError, transaction

    from .exceptions import NotRetryable
    from .results import target_params

    params = target_params(target)
    params["step"] = None
    if step is not None:
        text(step, "step")
        found = db.fetchone(sql.GET, params, using)
        if found is None:
            raise NoTarget(target)
        cls = registry.get(found[1], found[2])
        if step not in cls.steps:
            from .machine import step_suggestion

            raise InvalidInput(f"{cls.name} v{cls.version} has no step {step!r}{step_suggestion(cls, step)}"
                               f" Its steps: {', '.join(sorted(cls.steps))}")
        params["step"] = step
    try:
        with transaction.atomic(using=db.connection(using).alias):
            row = db.fetchone(sql.RETRY, params, using)
    except IntegrityError as exc:  # a racing insert took the key between check and update
        if "gen_durable_correlation" not in str(exc):
            raise
        raise DuplicateInstance(target) from None
    if row is None:
        raise NoTarget(target)
    id_, was, retried, _queue, _parents, _notified, blocked = row
    if blocked:
        raise DuplicateInstance(target)
    if not retried:
        raise NotRetryable(target, was)
    return id_


def pause_queue(name: str, *, using=None) -> bool:
    """Stop every worker claiming from queue `name` until `resume_queue(name)`.

    Each scheduler reads the paused set at most once a second, so every worker on every
    host stops claiming within about a second; steps already claimed finish and commit.
    The pause is a row in `gen_durable_queue_pauses`: it survives restarts. Inserting,
    signalling and cancelling keep working. Statements: 1.
    Returns True when the queue was not paused before. Raises InvalidInput for a name
    that is not a non-empty string, or that no one declares (see `insert`'s queue;
    nothing is written).
    """
    _queue_name(name)
    check_queue(name)
    return db.fetchone(sql.PAUSE_QUEUE, {"queue": name}, using) is not None


def resume_queue(name: str, *, using=None) -> bool:
    """Let workers claim from queue `name` again (within about a second; a NOTIFY on
    commit wakes them at once when they listen). Statements: 1.
    Returns True when the queue was paused. Raises InvalidInput for a bad name.
    """
    _queue_name(name)
    return db.fetchone(sql.RESUME_QUEUE, {"queue": name}, using) is not None


def paused_queues(*, using=None) -> list[str]:
    """The names of the paused queues, sorted. Statements: 1."""
    return [r[0] for r in db.fetchall(sql.PAUSED_QUEUES, None, using)]


def _queue_name(name):
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(f"queue must be a non-empty string, got {name!r}")
    text(name, "queue")


aretry = sync_to_async(retry)
aretry.__doc__ = "Async twin of `retry`."
apause_queue = sync_to_async(pause_queue)
apause_queue.__doc__ = "Async twin of `pause_queue`."
aresume_queue = sync_to_async(resume_queue)
aresume_queue.__doc__ = "Async twin of `resume_queue`."
apaused_queues = sync_to_async(paused_queues)
apaused_queues.__doc__ = "Async twin of `paused_queues`."
