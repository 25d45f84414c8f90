"""Cron schedules: insert an instance of a machine at every tick of a cron expression.

Declared in settings (`GEN_DURABLE["SCHEDULES"] = {name: {...}}`) or on a machine class
(`schedule = {...}`, named after the machine). Keys:

    cron      a 5-field cron expression ("0 3 * * *"; a 6th leading field is seconds),
              parsed and iterated by cronsim (see docs/guide.md "Time" for why)
    machine   registered machine name (settings entries only; a class schedules itself)
    state     the new instance's state (JSON; default {})
    timezone  IANA name the expression is read in (default: Django's TIME_ZONE, else UTC)
    catch_up  "skip" (default) or "latest": what a tick missed while no worker ran does

Exactly one instance per tick across every process and host: the table
`gen_durable_schedules` holds each schedule's next tick; the worker that fires it locks
the row (`FOR UPDATE SKIP LOCKED`, only once `next_run_at <= now()`) and advances it in
the transaction that inserts the instance. The instance's correlation key
`schedule:<name>:<tick ISO>` (`tick_key`: a long name is cut and hashed so the key fits)
is reserved in every status (through done and failed), a
second, database-enforced guard per tick.

Missed ticks (no worker was running) never fire as a burst: "skip" fires the latest
missed tick only if it is at most MISFIRE_GRACE seconds old (so a timer that woke a
little late still fires), "latest" always fires the latest missed tick once. Either way
the schedule then moves to its first tick after now.

Daylight-saving time follows cronsim, which follows Debian's cron: a job at a fixed
time inside the hour skipped by spring-forward runs at the first valid time after it
(02:30 → 03:00); a fixed-time job inside the repeated fall-back hour runs once, at the
first occurrence; expressions with a wildcard/range hour run on every real hour.
"""

from __future__ import annotations

import datetime as dt
import difflib
import hashlib
import logging
import zoneinfo
from dataclasses import dataclass, field
from typing import Any

from cronsim import CronSim, CronSimError
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from . import db, registry, sql, telemetry
from .conf import database_alias, get_settings
from .exceptions import DuplicateInstance, GenDurableError, InvalidInput, UnknownMachine
from .outcomes import MAX_NAME_LENGTH, text

logger = logging.getLogger("gen_durable.schedules")

CATCH_UP = ("skip", "latest")
KEYS = ("cron", "machine", "state", "timezone", "catch_up")
MISFIRE_GRACE = 60.0  # seconds: with catch_up "skip", a tick older than this is skipped
MAX_WALK = 10_000     # forward steps over missed ticks before jumping back from now
# A long name's key keeps this much of it (+ "~" + 16 hex digits); the longest tick
# stamp (UTC ISO with microseconds, 32 characters) then still fits MAX_NAME_LENGTH.
KEPT_NAME = MAX_NAME_LENGTH - len("schedule:") - 1 - 16 - 1 - 32
ALL_STATUSES = ("runnable", "executing", "awaiting_signal", "awaiting_children", "done", "failed")


@dataclass(frozen=True)
class Schedule:
    """One validated schedule (see the module docstring for the keys)."""

    name: str
    cron: str
    machine: str
    timezone: str
    catch_up: str = "skip"
    state: Any = field(default_factory=dict)

    @property
    def tz(self) -> zoneinfo.ZoneInfo:
        return zoneinfo.ZoneInfo(self.timezone)

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        """The first tick strictly after `instant` (aware), in the schedule's timezone."""
        ticks = CronSim(self.cron, instant.astimezone(self.tz))
        tick = next(ticks)
        # In a fall-back's repeated hour cronsim starts from the wall time, not the instant
        # (the fold is lost): from the second 02:10 it yields the first pass's 02:30, which
        # is already past. Walk on to the first tick after the instant itself, compared in
        # UTC: Python compares two datetimes of one tzinfo by wall time, ignoring the fold.
        after = instant.astimezone(dt.timezone.utc)
        while tick.astimezone(dt.timezone.utc) <= after:
            tick = next(ticks)
        return tick

    def latest_at_or_before(self, first: dt.datetime, now: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
        """(latest tick <= now, first tick > now), given `first`, a tick <= now."""
        latest, nxt = first, self.next_after(first)
        utc_now = now.astimezone(dt.timezone.utc)  # instants: one tzinfo would compare wall times
        for _ in range(MAX_WALK):
            if nxt.astimezone(dt.timezone.utc) > utc_now:
                return latest, nxt
            latest, nxt = nxt, self.next_after(nxt)
        # Down for very long: jump to the tick before now rather than walk every one.
        latest = max(next(CronSim(self.cron, now.astimezone(self.tz), reverse=True)), latest,
                     key=lambda t: t.astimezone(dt.timezone.utc))  # instants, not wall times (the fold)
        return latest, self.next_after(now)

    def correlation_key(self, tick: dt.datetime) -> str:
        return tick_key(self.name, tick)


def tick_key(name: str, tick: dt.datetime) -> str:
    """The per-tick correlation key: `schedule:<name>:<tick, UTC ISO>`, or, when that
    would exceed MAX_NAME_LENGTH (a name of more than ~210 characters), the name's
    first KEPT_NAME characters + "~" + 16 hex digits of its SHA-256 in place of the
    name, so every valid name (at most MAX_NAME_LENGTH) gets a key that fits and
    stays distinct per schedule and tick."""
    stamp = tick.astimezone(dt.timezone.utc).isoformat()
    key = f"schedule:{name}:{stamp}"
    if len(key) <= MAX_NAME_LENGTH:
        return key
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"schedule:{name[:KEPT_NAME]}~{digest}:{stamp}"


def default_timezone() -> str:
    return getattr(django_settings, "TIME_ZONE", None) or "UTC"


def declared() -> list[tuple[str, Any, str]]:
    """Every declared schedule as (name, raw config, where) — settings first, then classes."""
    raw = get_settings().SCHEDULES
    out = [(name, cfg, f"GEN_DURABLE['SCHEDULES'][{name!r}]") for name, cfg in raw.items()] \
        if isinstance(raw, dict) else []
    seen = set()
    for (name, _version), cls in sorted(registry.all_machines().items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        if name in seen or getattr(cls, "schedule", None) is None:
            continue
        seen.add(name)
        cfg = cls.schedule
        if isinstance(cfg, dict):
            cfg = {**cfg, "machine": name}
        out.append((name, cfg, f"{cls.__qualname__}.schedule"))
    return out


def _known_timezone(name) -> bool:
    if not isinstance(name, str) or not name:
        return False
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return False
    return True


def validate(name, cfg, where: str) -> list[str]:
    """Problems with one declared schedule (empty: valid). Each names the entry."""
    if not isinstance(name, str) or not name:
        return [f"{where}: the schedule name must be a non-empty string"]
    try:
        text(name, "the schedule name")  # it is a row's key and part of each tick's correlation key
    except InvalidInput as exc:
        return [f"{where}: {exc}"]
    if not isinstance(cfg, dict):
        return [f"{where} must be a dict with 'cron' and 'machine', got {cfg!r}"]
    problems = [f"{where} has an unknown key {k!r} (keys: {', '.join(KEYS)})" for k in cfg if k not in KEYS]
    cron = cfg.get("cron")
    if not isinstance(cron, str):
        problems.append(f"{where} needs 'cron', a cron expression string such as '0 3 * * *'")
    else:
        try:
            CronSim(cron, dt.datetime.now(dt.timezone.utc))
        except (CronSimError, ValueError, IndexError) as exc:
            problems.append(f"{where}: bad cron expression {cron!r} ({exc})")
    machine = cfg.get("machine")
    if not isinstance(machine, str):
        problems.append(f"{where} needs 'machine', a registered machine name such as 'reports.durable.Nightly'")
    else:
        try:
            registry.latest(machine)
        except UnknownMachine:
            known = sorted({name for name, _version in registry.all_machines()})
            close = difflib.get_close_matches(machine, known, n=1)
            problems.append(f"{where}: unknown machine {machine!r} — a machine's name is "
                            "'<module>.<QualName>' (e.g. 'shop.durable.Checkout') unless its class sets `name`"
                            + (f"; did you mean {close[0]!r}?" if close else
                               "; is its durable.py in an installed app?"))
    tz = cfg.get("timezone", default_timezone())
    if not _known_timezone(tz):
        problems.append(f"{where}: unknown timezone {tz!r} (an IANA name such as 'Europe/Paris')")
    if cfg.get("catch_up", "skip") not in CATCH_UP:
        problems.append(f"{where}: catch_up must be one of {CATCH_UP}, got {cfg.get('catch_up')!r}")
    if not problems:
        try:
            from .calls import build_row

            build_row(machine, state=cfg.get("state", {}))
        except GenDurableError as exc:
            problems.append(f"{where}: its state cannot be stored: {exc}")
        except ImproperlyConfigured:
            pass  # malformed RATE_LIMITS / CONCURRENCY_LIMITS: check E007 names the entry
    return problems


def configured() -> dict[str, Schedule]:
    """The valid declared schedules by name (invalid ones are reported by system checks
    gen_durable.E021 and left out)."""
    out = {}
    for name, cfg, where in declared():
        problems = validate(name, cfg, where)
        if problems:
            for p in problems:
                logger.error("schedule ignored: %s", p)
            continue
        if name in out:
            logger.error("schedule %r is declared twice; the first (%s) is used", name, where)
            continue
        out[name] = Schedule(name=name, cron=cfg["cron"], machine=cfg["machine"],
                             timezone=cfg.get("timezone", default_timezone()),
                             catch_up=cfg.get("catch_up", "skip"), state=cfg.get("state", {}))
    return out


def database_of(schedule: Schedule) -> str:
    """The alias a schedule fires in: where GEN_DURABLE['DATABASES'] routes its machine (or
    the machine's queue), else GEN_DURABLE['DATABASE'] — so a worker serving several
    databases fires each schedule once, in its own database."""
    from . import registry
    from .conf import database_alias, routed_alias
    from .exceptions import UnknownMachine

    try:
        queue = registry.latest(schedule.machine).queue
    except UnknownMachine:
        queue = None
    return database_alias(routed_alias(schedule.machine, queue))


def for_database(schedules: dict, using=None) -> dict:
    """The schedules of `schedules` that fire in database `using` (see `database_of`)."""
    from .conf import database_alias

    alias = database_alias(using)
    return {name: s for name, s in schedules.items() if database_of(s) == alias}


def _now(using) -> dt.datetime:
    return db.fetchone("SELECT now()", None, using)[0]


def sync(schedules: dict, using=None) -> None:
    """Create the rows of new schedules at their next tick; re-plan changed ones. 1 statement."""
    if not schedules:
        return
    now = _now(using)
    items = sorted(schedules.values(), key=lambda s: s.name)
    db.execute(sql.SCHEDULES_SYNC, {
        "name": db.pg_array([s.name for s in items]), "cron": db.pg_array([s.cron for s in items]),
        "timezone": db.pg_array([s.timezone for s in items]),
        "next_run_at": db.pg_array([s.next_after(now).isoformat() for s in items]),
    }, using)


def fire_due(schedules: dict, using=None) -> list[tuple[str, dt.datetime | None, int | None]]:
    """Fire every schedule whose tick has come; return (name, tick fired or None, id).

    One transaction: lock the due rows (others skip them), insert one instance per
    schedule for its latest due tick (per its catch-up policy), advance each row.
    """
    if not schedules:
        return []
    from .calls import insert

    fired = []
    with transaction.atomic(using=database_alias(using)):
        for name, next_run_at, now in db.fetchall(sql.SCHEDULES_DUE, {"names": db.pg_array(sorted(schedules))}, using):
            s = schedules[name]
            latest, nxt = s.latest_at_or_before(next_run_at, now)
            late = (now - latest).total_seconds()
            tick = latest if s.catch_up == "latest" or late <= MISFIRE_GRACE else None
            instance, error = None, None
            if tick is not None:
                try:
                    with transaction.atomic(using=database_alias(using)):  # a savepoint
                        instance = insert(s.machine, state=s.state, correlation_key=s.correlation_key(tick),
                                          correlation_scope=ALL_STATUSES, using=using)
                except DuplicateInstance:
                    logger.info("schedule %s: tick %s already fired", name, tick.isoformat())
                except GenDurableError as exc:
                    error = f"tick {tick.isoformat()} not fired: {exc}"
                    logger.error("schedule %s: %s", name, error)
            else:
                logger.warning("schedule %s: skipped missed tick(s) up to %s (%.0f s late; catch_up 'skip')",
                               name, latest.isoformat(), late)
            db.execute(sql.SCHEDULES_ADVANCE, {"name": name, "next_run_at": nxt, "tick": tick if instance else None,
                                               "instance": instance, "error": error}, using)
            fired.append((name, tick if instance else None, instance))
            telemetry.emit("schedule.fired" if instance else "schedule.skipped", {"count": 1},
                           {"schedule": name, "tick": latest, "late": late})
    return fired


def overview(using=None) -> list[dict]:
    """Every configured schedule for the admin: name, cron, timezone, machine, catch_up,
    next run, last run (tick and when it fired), last instance id, last error. The next
    run comes from the table once a worker has synced it, else is computed from now."""
    schedules = configured()
    if not schedules:
        return []
    stored = {r[0]: r for r in db.fetchall(sql.SCHEDULES_LIST, {"names": db.pg_array(sorted(schedules))}, using)}
    now = _now(using)
    out = []
    for name, s in sorted(schedules.items()):
        row = stored.get(name)
        current = row is not None and (row[1], row[2]) == (s.cron, s.timezone)
        out.append({
            "name": name, "cron": s.cron, "timezone": s.timezone, "machine": s.machine, "catch_up": s.catch_up,
            "next_run": row[3] if current else s.next_after(now),
            "last_tick": row[4] if row else None, "last_run": row[5] if row else None,
            "last_instance_id": row[6] if row else None, "last_error": row[7] if row else None,
            "synced": current,
        })
    return out
