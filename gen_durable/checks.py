"""System checks for `settings.GEN_DURABLE` (docs/design.md#settings): gen_durable.E0nn / W0nn.

One function per concern; each failure names the key and carries a hint. They run at
`manage.py check`, `migrate` and `rundurable` start-up.
"""

from __future__ import annotations

import difflib
import math
import numbers

from django.conf import settings as django_settings
from django.core.checks import Error, Tags, Warning, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, get_settings, install_hint, user_settings
from .limiter.config import MAX_GATE_LIMIT, valid_limit_name

ID = "gen_durable."


def _num(v, *, positive=False, minimum=0):
    ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
    return ok and (v > 0 if positive else v >= minimum)


INT4_MAX = 2**31 - 1  # the largest value a Postgres int parameter takes


def _int(v, *, minimum=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


@register(Tags.compatibility)
def check_unknown_keys(app_configs=None, **kwargs):
    """E001: a key of GEN_DURABLE that gen_durable does not know."""
    raw = getattr(django_settings, "GEN_DURABLE", None)
    if raw is not None and not isinstance(raw, dict):
        return [Error("GEN_DURABLE must be a dict.", hint="See docs/design.md#settings for the keys.", id=ID + "E001")]
    errors = []
    for key in sorted(user_settings()):
        if key not in DEFAULTS:
            close = difflib.get_close_matches(key, DEFAULTS, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else "Known keys: " + ", ".join(DEFAULTS)
            errors.append(Error(f"GEN_DURABLE has an unknown key {key!r}.", hint=hint, id=ID + "E001"))
    return errors


TOP_LEVEL_SUSPECTS = ("CONCURRENCY_LIMITS", "RATE_LIMITS", "LIMITER", "LEASE_TTL", "HEARTBEAT_INTERVAL",
                      "MAX_STEP_SECONDS", "DRAIN_TIMEOUT")


@register(Tags.compatibility)
def check_setting_name(app_configs=None, **kwargs):
    """W005: a Django setting whose name is close to GEN_DURABLE but is not it (a typo
    would otherwise leave every GEN_DURABLE default in force without a word)."""
    # GEN_DURABLE_<X> is a setting of its own (a project's or a test's), not a typo.
    names = [n for n in dir(django_settings) if n.isupper() and n != "GEN_DURABLE" and not n.startswith("GEN_DURABLE_")]
    close = difflib.get_close_matches("GEN_DURABLE", names, n=3, cutoff=0.85)
    warnings = [Warning(f"The setting {name!r} looks like a misspelt GEN_DURABLE; gen_durable does not read it.",
                        hint="Rename it GEN_DURABLE (or silence gen_durable.W005 in SILENCED_SYSTEM_CHECKS).",
                        id=ID + "W005") for name in close]
    # A gen_durable key written as a Django setting of its own is read by nobody. Only the
    # names no other app would plausibly use (not QUEUES, DATABASE, GC…).
    configured = user_settings()
    for key in TOP_LEVEL_SUSPECTS:
        if hasattr(django_settings, key) and key not in configured:
            warnings.append(Warning(
                f"The Django setting {key!r} is a key of GEN_DURABLE; gen_durable does not read it at the top level.",
                hint=f"Move it into GEN_DURABLE: GEN_DURABLE = {{..., {key!r}: ...}}.", id=ID + "W005"))
    return warnings


@register(Tags.compatibility)
def check_queues(app_configs=None, **kwargs):
    """E002: QUEUES must map non-empty names to positive ints."""
    queues = get_settings().QUEUES
    if not isinstance(queues, dict):
        return [Error("GEN_DURABLE['QUEUES'] must be a dict of queue name -> concurrency.",
                      hint='For example {"default": 10}.', id=ID + "E002")]
    from .exceptions import InvalidInput
    from .outcomes import text

    errors = []
    for name, conc in queues.items():
        if not isinstance(name, str) or not name:
            errors.append(Error(f"GEN_DURABLE['QUEUES'] has an invalid queue name {name!r}.",
                                hint="Queue names are non-empty strings.", id=ID + "E002"))
            continue
        try:
            text(name, "queue name")  # what a row's queue column, and insert, take
        except InvalidInput as exc:
            errors.append(Error(f"GEN_DURABLE['QUEUES'] has an invalid queue name {name!r}: {exc}.",
                                hint="Queue names are non-empty strings of at most 255 characters, without NUL.",
                                id=ID + "E002"))
        else:
            if not _int(conc, minimum=1):
                errors.append(Error(f"GEN_DURABLE['QUEUES'][{name!r}] must be a positive int, got {conc!r}.",
                                    hint="It is the number of concurrent steps per worker process.",
                                    id=ID + "E002"))
    return errors


@register(Tags.compatibility)
def check_extra_queues(app_configs=None, **kwargs):
    """E062: EXTRA_QUEUES must be a list of non-empty queue names or fnmatch patterns.

    W062: an entry that is also a key of QUEUES (this deployment runs it: not extra)."""
    s = get_settings()
    extra = s.EXTRA_QUEUES
    hint = ('Queues other deployments serve, which insert/pause_queue accept: for example ["reports", '
            '"tenant-*"] ("*" accepts any name).')
    if isinstance(extra, str) or not isinstance(extra, (list, tuple, set, frozenset)):
        return [Error(f"GEN_DURABLE['EXTRA_QUEUES'] must be a list of queue names, got {extra!r}.", hint=hint,
                      id=ID + "E062")]
    out = []
    queues = s.QUEUES if isinstance(s.QUEUES, dict) else {}
    for entry in extra:
        if not isinstance(entry, str) or not entry.strip() or "\x00" in entry:
            out.append(Error(f"GEN_DURABLE['EXTRA_QUEUES'] has an invalid entry {entry!r}.", hint=hint,
                             id=ID + "E062"))
        elif entry in queues:
            out.append(Warning(f"GEN_DURABLE['EXTRA_QUEUES'] names {entry!r}, a key of QUEUES.",
                               hint="EXTRA_QUEUES is for queues this deployment's workers do not run; remove it.",
                               id=ID + "W062"))
    return out


MAX_SETTING_SECONDS = 2_147_483  # 2**31 - 1 milliseconds, Postgres' largest statement_timeout


@register(Tags.compatibility)
def check_timings(app_configs=None, **kwargs):
    """E003: durations must be numbers of seconds; E030: a heartbeat that cannot keep a
    lease alive; W001: heartbeat × 3 > lease."""
    s = get_settings()
    errors = []
    explicit_heartbeat = user_settings().get("HEARTBEAT_INTERVAL") is not None
    for key in ("LEASE_TTL", "HEARTBEAT_INTERVAL", "POLL_INTERVAL", "MAX_POLL_INTERVAL"):
        if key == "HEARTBEAT_INTERVAL" and not explicit_heartbeat:
            continue  # derived from LEASE_TTL (conf.derived_heartbeat), checked there
        if not _num(getattr(s, key), positive=True):
            errors.append(Error(f"GEN_DURABLE['{key}'] must be a number of seconds > 0, got {getattr(s, key)!r}.",
                                hint="Durations are seconds (docs/design.md#settings).", id=ID + "E003"))
    if not _num(s.DRAIN_TIMEOUT):
        errors.append(Error(f"GEN_DURABLE['DRAIN_TIMEOUT'] must be seconds >= 0, got {s.DRAIN_TIMEOUT!r}.",
                            hint="Seconds in-flight steps get on shutdown.", id=ID + "E003"))
    if s.PREFETCH is not None and not _int(s.PREFETCH):
        errors.append(Error(f"GEN_DURABLE['PREFETCH'] must be None or an int >= 0, got {s.PREFETCH!r}.",
                            hint="Rows a queue claims beyond its free step threads: None (the default) sizes it "
                                 "from the measured step rate; an int fixes it (docs/guide.md, Tuning throughput).",
                            id=ID + "E003"))
    if s.MIN_DEMAND is not None and not _int(s.MIN_DEMAND, minimum=1):
        errors.append(Error(f"GEN_DURABLE['MIN_DEMAND'] must be None or an int >= 1, got {s.MIN_DEMAND!r}.",
                            hint="Free slots a queue waits for before it claims: None (the default) follows the "
                                 "claim-ahead; an int fixes it, e.g. 100 with PREFETCH 500 (docs/guide.md, "
                                 "Tuning throughput).", id=ID + "E003"))
    for key in ("LOCK_TIMEOUT", "STATEMENT_TIMEOUT"):
        if not _num(getattr(s, key), positive=True):
            errors.append(Error(f"GEN_DURABLE['{key}'] must be a number of seconds > 0, got {getattr(s, key)!r}.",
                                hint="It bounds the worker's own statements; see docs/reliability.md.", id=ID + "E003"))
    if not _int(s.MAX_PAYLOAD_BYTES, minimum=1):
        errors.append(Error("GEN_DURABLE['MAX_PAYLOAD_BYTES'] must be a positive int.", hint="Bytes of encoded JSON.", id=ID + "E003"))
    for key in ("LEASE_TTL", "HEARTBEAT_INTERVAL", "POLL_INTERVAL", "MAX_POLL_INTERVAL", "DRAIN_TIMEOUT",
                "LOCK_TIMEOUT", "STATEMENT_TIMEOUT"):
        value = getattr(s, key)
        if _num(value) and value > MAX_SETTING_SECONDS:
            # Postgres takes a timeout as int milliseconds; a lease or an interval this long
            # overflows timestamps and thread waits before it means anything.
            errors.append(Error(f"GEN_DURABLE['{key}'] is {value!r} seconds; the largest is "
                                f"{MAX_SETTING_SECONDS:,} (about 24.8 days, the longest timeout Postgres takes).",
                                hint="Durations are seconds (docs/design.md#settings).", id=ID + "E003"))
    if not errors:
        if s.POLL_INTERVAL > s.MAX_POLL_INTERVAL:
            errors.append(Error("GEN_DURABLE['POLL_INTERVAL'] exceeds MAX_POLL_INTERVAL.",
                                hint="The back-off ceiling must be >= the base interval.", id=ID + "E003"))
        if _num(s.LOCK_TIMEOUT, positive=True) and _num(s.STATEMENT_TIMEOUT, positive=True) \
                and s.LOCK_TIMEOUT > s.STATEMENT_TIMEOUT:
            errors.append(Error("GEN_DURABLE['LOCK_TIMEOUT'] exceeds STATEMENT_TIMEOUT.",
                                hint="A lock wait is part of its statement: keep LOCK_TIMEOUT <= STATEMENT_TIMEOUT.",
                                id=ID + "E003"))
        if explicit_heartbeat and s.HEARTBEAT_INTERVAL * 2 > s.LEASE_TTL:
            # The heartbeat skips a row locked at that instant (SKIP LOCKED), so a row
            # can miss one renewal: its lease must outlast two intervals, or a live step
            # is reaped and runs twice at once.
            errors.append(Error(
                f"GEN_DURABLE['HEARTBEAT_INTERVAL'] ({s.HEARTBEAT_INTERVAL}s) cannot keep a "
                f"{s.LEASE_TTL}s lease alive: a lease must outlast two heartbeats.",
                hint="Leave HEARTBEAT_INTERVAL unset (it is then LEASE_TTL / 3) or keep "
                     "HEARTBEAT_INTERVAL x 2 <= LEASE_TTL (x 3 recommended).",
                id=ID + "E030"))
        elif s.HEARTBEAT_INTERVAL * 3 > s.LEASE_TTL:
            errors.append(Warning(
                f"GEN_DURABLE heartbeat ({s.HEARTBEAT_INTERVAL}s) x 3 exceeds the lease ({s.LEASE_TTL}s).",
                hint="A missed heartbeat or two would let the reaper take a live step; keep HEARTBEAT_INTERVAL x 3 <= LEASE_TTL.",
                id=ID + "W001"))
    return errors


# The longest a section's duration may be, in seconds: a thread waits it out in one
# call (threading caps a wait at TIMEOUT_MAX, ~292 years, and raises past it), and a
# group-commit window holds every outcome that long while other steps run.
SECTION_LIMITS = {"MAX_DELAY": (60.0, "60"), "INTERVAL": (86400.0, "86400 (a day)"),
                  "RETENTION": (100 * 365 * 86400.0, "3153600000 (100 years)")}


def _section(value, name, keys, eid, *, may_be_false=True):
    if value is False and may_be_false:
        return []
    if not isinstance(value, dict):
        return [Error(f"GEN_DURABLE['{name}'] must be a dict{' or False' if may_be_false else ''}, got {value!r}.",
                      hint=f"Keys: {', '.join(keys)}.", id=ID + eid)]
    errors = []
    for k, v in value.items():
        if k not in keys:
            close = difflib.get_close_matches(str(k), keys, n=1)
            errors.append(Error(f"GEN_DURABLE['{name}'] has an unknown key {k!r}.",
                                hint=f"Did you mean {close[0]!r}?" if close else f"Keys: {', '.join(keys)}.", id=ID + eid))
            continue
        limit, shown = SECTION_LIMITS.get(k, (None, None))
        zero_ok = k in ("RETENTION", "MAX_DELAY")  # keep nothing / flush without lingering
        if k in ("BATCH", "MAX_BATCH", "MAX_BYTES"):
            ok = _int(v, minimum=1)
        else:
            ok = (_num(v) if zero_ok else _num(v, positive=True)) and math.isfinite(v) and v <= limit
        if not ok:
            what = ("a positive integer" + (" (bytes)" if k == "MAX_BYTES" else "")
                    if k in ("BATCH", "MAX_BATCH", "MAX_BYTES")
                    else f"a number of seconds >= 0 and <= {shown}" if zero_ok
                    else f"a positive number of seconds <= {shown}")
            errors.append(Error(f"GEN_DURABLE['{name}']['{k}'] must be {what}, got {v!r}.",
                                hint="Durations are seconds; batches are ints.", id=ID + eid))
    return errors


@register(Tags.compatibility)
def check_sections(app_configs=None, **kwargs):
    """E004: FLUSH / REAPER / GC dicts."""
    s = get_settings()
    errors = []
    if s.FLUSH is False:
        errors.append(Error("GEN_DURABLE['FLUSH'] cannot be False.", hint="Every outcome goes through the flush (docs/design.md#decisions).", id=ID + "E004"))
    else:
        errors += _section(s.FLUSH, "FLUSH", ("MAX_BATCH", "MAX_DELAY", "MAX_BYTES"), "E004", may_be_false=False)
    errors += _section(s.REAPER, "REAPER", ("INTERVAL",), "E004")
    errors += _section(s.GC, "GC", ("INTERVAL", "RETENTION", "BATCH"), "E004")
    return errors


HISTORY_KEYS = ("ENABLED", "RETENTION", "MAX_PER_INSTANCE")


@register(Tags.compatibility)
def check_history(app_configs=None, **kwargs):
    """E110: HISTORY is a dict of ENABLED (a bool), RETENTION (seconds >= 0, at most 100
    years) and MAX_PER_INSTANCE (an int >= 1 and <= 2**31 - 1: the GC sends it as a
    Postgres int, and a larger value would fail every GC tick)."""
    value = get_settings().HISTORY
    hint = 'For example {"ENABLED": True, "RETENTION": 86400, "MAX_PER_INSTANCE": 100} (docs/guide.md).'
    if not isinstance(value, dict):
        return [Error(f"GEN_DURABLE['HISTORY'] must be a dict, got {value!r}.", hint=hint, id=ID + "E110")]
    errors = []
    limit, shown = SECTION_LIMITS["RETENTION"]
    for k, v in value.items():
        if k not in HISTORY_KEYS:
            close = difflib.get_close_matches(str(k), HISTORY_KEYS, n=1)
            problem, fix = f" has an unknown key {k!r}", (f"Did you mean {close[0]!r}?" if close
                                                          else f"Keys: {', '.join(HISTORY_KEYS)}.")
        elif k == "ENABLED" and not isinstance(v, bool):
            problem, fix = f"['ENABLED'] must be True or False, got {v!r}", "False writes no timeline entries."
        elif k == "RETENTION" and not (_num(v) and math.isfinite(v) and v <= limit):
            problem, fix = (f"['RETENTION'] must be a number of seconds >= 0 and <= {shown}, got {v!r}",
                            "The GC sweep deletes timeline entries older than this.")
        elif k == "MAX_PER_INSTANCE" and not (_int(v, minimum=1) and v <= INT4_MAX):
            problem, fix = (f"['MAX_PER_INSTANCE'] must be an int >= 1 and <= {INT4_MAX}, got {v!r}",
                            "The GC sweep keeps this many of an instance's newest entries.")
        else:
            continue
        errors.append(Error(f"GEN_DURABLE['HISTORY']{problem}.", hint=fix, id=ID + "E110"))
    return errors


@register(Tags.compatibility)
def check_inline(app_configs=None, **kwargs):
    """E014: INLINE bounds an inline chain: MAX_STEPS an int >= 1, MAX_SECONDS seconds > 0."""
    value = get_settings().INLINE
    keys = ("MAX_STEPS", "MAX_SECONDS")
    if not isinstance(value, dict):
        return [Error(f"GEN_DURABLE['INLINE'] must be a dict, got {value!r}.",
                      hint='For example {"MAX_STEPS": 100, "MAX_SECONDS": 10}.', id=ID + "E014")]
    errors = []
    for k, v in value.items():
        if k not in keys:
            close = difflib.get_close_matches(str(k), keys, n=1)
            errors.append(Error(f"GEN_DURABLE['INLINE'] has an unknown key {k!r}.",
                                hint=f"Did you mean {close[0]!r}?" if close else f"Keys: {', '.join(keys)}.",
                                id=ID + "E014"))
        elif k == "MAX_STEPS" and not _int(v, minimum=1):
            errors.append(Error(f"GEN_DURABLE['INLINE']['MAX_STEPS'] must be an int >= 1, got {v!r}.",
                                hint="Steps an inline chain runs before it yields back to the pick; 1 turns chaining off.",
                                id=ID + "E014"))
        elif k == "MAX_SECONDS" and not _num(v, positive=True):
            errors.append(Error(f"GEN_DURABLE['INLINE']['MAX_SECONDS'] must be seconds > 0, got {v!r}.",
                                hint="Time after which an inline chain yields back to the pick.", id=ID + "E014"))
    return errors


@register(Tags.compatibility)
def check_max_step_seconds(app_configs=None, **kwargs):
    """E020: MAX_STEP_SECONDS is seconds > 0, or None (no default step timeout)."""
    value = get_settings().MAX_STEP_SECONDS
    if value is None or _num(value, positive=True):
        return []
    return [Error(f"GEN_DURABLE['MAX_STEP_SECONDS'] must be a number of seconds > 0 or None, got {value!r}.",
                  hint="The time budget of a step that sets no timeout of its own; past it the step is "
                       "abandoned as a StepTimeout (docs/guide.md \"Time\").", id=ID + "E020")]


@register(Tags.compatibility)
def check_slow_step_seconds(app_configs=None, **kwargs):
    """E070: SLOW_STEP_SECONDS is seconds > 0, or None (no slow-step warning)."""
    value = get_settings().SLOW_STEP_SECONDS
    if value is None or (_num(value, positive=True) and math.isfinite(value)):
        return []
    return [Error(f"GEN_DURABLE['SLOW_STEP_SECONDS'] must be a finite number of seconds > 0 or None, "
                  f"got {value!r}.",
                  hint="A step running longer than this is reported once (a WARNING on gen_durable.worker "
                       "and a step.slow telemetry event); None turns it off (docs/observability.md).",
                  id=ID + "E070")]


@register(Tags.compatibility)
def check_schedules(app_configs=None, **kwargs):
    """E021: every cron schedule (GEN_DURABLE['SCHEDULES'] and Machine.schedule) is valid:
    a cron expression cronsim parses, a registered machine, a known IANA timezone, a
    catch_up policy, a storable state; no name declared twice."""
    from .schedules import declared, validate

    raw = get_settings().SCHEDULES
    if not isinstance(raw, dict):
        return [Error(f"GEN_DURABLE['SCHEDULES'] must be a dict of name -> schedule, got {raw!r}.",
                      hint='For example {"nightly": {"cron": "0 3 * * *", "machine": "reports.durable.Nightly"}}.',
                      id=ID + "E021")]
    errors, seen = [], {}
    for name, cfg, where in declared():
        for problem in validate(name, cfg, where):
            errors.append(Error(problem if problem.endswith(("?", ".")) else problem + ".", hint='Keys: cron, machine, state, timezone, catch_up ("skip" or '
                                                    '"latest"); see docs/guide.md "Time".', id=ID + "E021"))
        if name in seen:
            errors.append(Error(f"Schedule {name!r} is declared twice ({seen[name]} and {where}).",
                                hint="Schedule names are unique; a machine's own schedule is named after it.",
                                id=ID + "E021"))
        seen.setdefault(name, where)
    return errors


@register(Tags.compatibility)
def check_producer(app_configs=None, **kwargs):
    """E015: PRODUCER (gd.insert_async's buffer): sizes, delay and an importable ON_ERROR."""
    value = get_settings().PRODUCER
    keys = ("MAX_BATCH", "MAX_DELAY", "MAX_BUFFER", "ON_ERROR")
    if not isinstance(value, dict):
        return [Error(f"GEN_DURABLE['PRODUCER'] must be a dict, got {value!r}.",
                      hint='For example {"MAX_BATCH": 1000, "MAX_DELAY": 0.1}.', id=ID + "E015")]
    errors = []
    for k, v in value.items():
        if k not in keys:
            close = difflib.get_close_matches(str(k), keys, n=1)
            errors.append(Error(f"GEN_DURABLE['PRODUCER'] has an unknown key {k!r}.",
                                hint=f"Did you mean {close[0]!r}?" if close else f"Keys: {', '.join(keys)}.",
                                id=ID + "E015"))
        elif k in ("MAX_BATCH", "MAX_BUFFER") and not _int(v, minimum=1):
            errors.append(Error(f"GEN_DURABLE['PRODUCER']['{k}'] must be an int >= 1, got {v!r}.",
                                hint="Rows per insert_all (MAX_BATCH) / rows queued at most (MAX_BUFFER).",
                                id=ID + "E015"))
        elif k == "MAX_DELAY" and not (_num(v) and math.isfinite(v)):
            errors.append(Error(f"GEN_DURABLE['PRODUCER']['MAX_DELAY'] must be seconds >= 0, got {v!r}.",
                                hint="How long a queued row may wait for its batch to fill.", id=ID + "E015"))
        elif k == "ON_ERROR" and v is not None:
            try:
                fn = import_string(v) if isinstance(v, str) else None
            except ImportError as exc:
                fn, why = None, str(exc)
            else:
                why = "" if callable(fn) else "it is not a dotted path to a callable"
            if not callable(fn):
                why = why or f"{v!r} is not a dotted path to a callable"
                errors.append(Error(f"GEN_DURABLE['PRODUCER']['ON_ERROR'] cannot be used: {why}.",
                                    hint="A dotted path to a function on_error(error, specs), or None.",
                                    id=ID + "E015"))
    if not errors and value["MAX_BUFFER"] < value["MAX_BATCH"]:
        errors.append(Error("GEN_DURABLE['PRODUCER']['MAX_BUFFER'] is below MAX_BATCH.",
                            hint="The queue must hold at least one batch.", id=ID + "E015"))
    return errors


@register(Tags.compatibility)
def check_opentelemetry(app_configs=None, **kwargs):
    """E050: OPENTELEMETRY is a bool or {"TRACES": bool, "METRICS": bool}; E051: it is on
    but opentelemetry-api is not installed."""
    from .integrations.otel import available

    value = get_settings().OPENTELEMETRY
    hint = 'False, True, or {"TRACES": True, "METRICS": True} (docs/observability.md).'
    if isinstance(value, dict):
        bad = sorted(set(value) - {"TRACES", "METRICS"})
        if bad or not all(isinstance(v, bool) for v in value.values()):
            return [Error(f"GEN_DURABLE['OPENTELEMETRY'] has unknown keys {bad} or non-bool values: {value!r}.",
                          hint=hint, id=ID + "E050")]
        on = any(value.get(k, True) for k in ("TRACES", "METRICS"))
    elif isinstance(value, bool):
        on = value
    else:
        return [Error(f"GEN_DURABLE['OPENTELEMETRY'] must be a bool or a dict, got {value!r}.", hint=hint,
                      id=ID + "E050")]
    if on and not available():
        return [Error("GEN_DURABLE['OPENTELEMETRY'] is on but opentelemetry-api is not installed.",
                      hint="I" + install_hint("otel")[1:] + ", and an OpenTelemetry SDK with an exporter; "
                           "or turn OPENTELEMETRY off.", id=ID + "E051")]
    return []


@register(Tags.compatibility)
def check_notify_and_limiter(app_configs=None, **kwargs):
    """E005: NOTIFY is "postgres" or "none"; E006: LIMITER shape."""
    s = get_settings()
    errors = []
    if s.NOTIFY not in ("postgres", "none"):
        errors.append(Error(f"GEN_DURABLE['NOTIFY'] must be 'postgres' or 'none', got {s.NOTIFY!r}.",
                            hint="'none' means poll only.", id=ID + "E005"))
    lim = s.LIMITER
    if not (lim == "postgres" or (isinstance(lim, dict) and lim.get("BACKEND") in ("postgres", "redis"))):
        errors.append(Error(f"GEN_DURABLE['LIMITER'] must be 'postgres' or {{'BACKEND': 'redis', 'URL': ...}}, got {lim!r}.",
                            hint="See docs/guide.md#postgres-or-redis.", id=ID + "E006"))
    elif isinstance(lim, dict) and lim.get("BACKEND") == "redis" and not isinstance(lim.get("URL"), str):
        errors.append(Error("GEN_DURABLE['LIMITER'] with BACKEND 'redis' needs a 'URL'.",
                            hint="For example 'redis://127.0.0.1:6379/0'.", id=ID + "E006"))
    elif isinstance(lim, dict) and lim.get("BACKEND") == "redis" and \
            lim["URL"].partition("://")[0] not in ("redis", "rediss", "unix"):
        # The schemes redis-py's from_url takes; anything else fails the worker's start.
        errors.append(Error(f"GEN_DURABLE['LIMITER']['URL'] must be a redis://, rediss:// or unix:// URL, "
                            f"got {lim['URL']!r}.", hint="For example 'redis://127.0.0.1:6379/0'.", id=ID + "E006"))
    elif isinstance(lim, dict):
        keys = ("BACKEND", "URL", "PREFIX") if lim.get("BACKEND") == "redis" else ("BACKEND",)
        for k in lim:
            if k not in keys:
                errors.append(Error(f"GEN_DURABLE['LIMITER'] has an unknown key {k!r}.",
                                    hint=f"Keys for this backend: {', '.join(keys)}.", id=ID + "E006"))
        if "PREFIX" in lim and (not isinstance(lim["PREFIX"], str) or not lim["PREFIX"]):
            errors.append(Error("GEN_DURABLE['LIMITER']['PREFIX'] must be a non-empty string.",
                                hint="Every Redis key of the limiter starts with it (default 'gen_durable:').",
                                id=ID + "E006"))
        if lim.get("BACKEND") == "redis":
            try:
                import redis  # noqa: F401
            except ImportError:
                errors.append(Error("GEN_DURABLE['LIMITER'] selects Redis, but the redis package is not installed.",
                                    hint="I" + install_hint("redis")[1:] + ".", id=ID + "E006"))
    return errors


def _limit_extras(section, name, cfg, keys):
    errors = []
    for k in cfg:
        if k not in keys:
            close = difflib.get_close_matches(str(k), keys, n=1)
            errors.append(Error(f"GEN_DURABLE['{section}'][{name!r}] has an unknown key {k!r}.",
                                hint=f"Did you mean {close[0]!r}?" if close else f"Keys: {', '.join(keys)}.",
                                id=ID + "E007"))
    if "shards" in cfg and not _int(cfg["shards"], minimum=1):
        errors.append(Error(f"GEN_DURABLE['{section}'][{name!r}]['shards'] must be a positive int.",
                            hint="Counter rows the budget is split over (default 1).", id=ID + "E007"))
    return errors


def _limit_name(section, name):
    """A limit name is matched against the part of a key before its first ':' — a name
    with a ':', or not a non-empty str, would never match a row (silently no limit)."""
    if valid_limit_name(name):
        return []
    return [Error(f"GEN_DURABLE['{section}'][{name!r}] is not a valid name: a non-empty str without ':'.",
                  hint=(f"Name it {name.split(':', 1)[0]!r}: " if isinstance(name, str) and name.split(":", 1)[0] else "")
                  + "keys 'name' and 'name:<anything>' fall under the limit 'name' (docs/guide.md, Limits).",
                  id=ID + "E007")]


@register(Tags.compatibility)
def check_limits(app_configs=None, **kwargs):
    """E007: RATE_LIMITS and CONCURRENCY_LIMITS entries."""
    s = get_settings()
    errors = []
    for name, cfg in (s.RATE_LIMITS or {}).items() if isinstance(s.RATE_LIMITS, dict) else ():
        errors += _limit_name("RATE_LIMITS", name)
        if not isinstance(cfg, dict) or not _num(cfg.get("allowed"), minimum=0) or not _num(cfg.get("period"), positive=True):
            errors.append(Error(f"GEN_DURABLE['RATE_LIMITS'][{name!r}] needs 'allowed' (>= 0) and 'period' (seconds > 0).",
                                hint='For example {"allowed": 100, "period": 60}.', id=ID + "E007"))
            if isinstance(cfg, dict):  # a misspelt 'allowed' ('alowed') is named too
                errors += [e for e in _limit_extras("RATE_LIMITS", name, cfg, ("allowed", "period", "burst", "shards"))
                           if "unknown key" in e.msg]
            continue
        errors += _limit_extras("RATE_LIMITS", name, cfg, ("allowed", "period", "burst", "shards"))
        infinite = [k for k in ("allowed", "period", "burst") if _num(cfg.get(k)) and not math.isfinite(cfg[k])]
        if infinite:
            errors.append(Error(f"GEN_DURABLE['RATE_LIMITS'][{name!r}]: {', '.join(infinite)} must be finite.",
                                hint="A bucket's tokens and refill are finite numbers.", id=ID + "E007"))
        if "burst" in cfg and not _num(cfg["burst"], minimum=0):
            errors.append(Error(f"GEN_DURABLE['RATE_LIMITS'][{name!r}]['burst'] must be a number >= 0.",
                                hint="Tokens a cold bucket holds; default: allowed.", id=ID + "E007"))
    for name, cfg in (s.CONCURRENCY_LIMITS or {}).items() if isinstance(s.CONCURRENCY_LIMITS, dict) else ():
        errors += _limit_name("CONCURRENCY_LIMITS", name)
        if not isinstance(cfg, dict) or not _int(cfg.get("limit"), minimum=1):
            errors.append(Error(f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}] needs 'limit', a positive int.",
                                hint='For example {"limit": 5}.', id=ID + "E007"))
            if isinstance(cfg, dict):  # a misspelt 'limit' ('limt') is named too
                errors += [e for e in _limit_extras("CONCURRENCY_LIMITS", name, cfg,
                                                    ("limit", "shards", "retry", "per")) if "unknown key" in e.msg]
            continue
        if cfg["limit"] > MAX_GATE_LIMIT:
            errors.append(Error(f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}]['limit'] exceeds 2**53.",
                                hint="Gate counters are float8 (exact integers up to 2**53).", id=ID + "E007"))
            continue
        errors += _limit_extras("CONCURRENCY_LIMITS", name, cfg, ("limit", "shards", "retry", "per"))
        if _int(cfg.get("shards"), minimum=1) and cfg["shards"] > cfg["limit"]:
            errors.append(Error(f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}]['shards'] ({cfg['shards']}) exceeds "
                                f"its 'limit' ({cfg['limit']}): a shard needs at least one slot.",
                                hint="Use at most `limit` shards.", id=ID + "E007"))
        if "per" in cfg and cfg["per"] not in ("name", "key"):
            errors.append(Error(f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}]['per'] must be 'name' or 'key', "
                                f"not {cfg['per']!r}.",
                                hint="'name' (default): every key of the name shares `limit` slots; "
                                     "'key': each key has `limit` slots of its own.", id=ID + "E007"))
        if "retry" in cfg and not _num(cfg["retry"], positive=True):
            errors.append(Error(f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}]['retry'] must be seconds > 0.",
                                hint="How soon a row denied by a full gate is offered again, per `limit` rows "
                                     "(default 0.25).", id=ID + "E007"))
    for key in ("RATE_LIMITS", "CONCURRENCY_LIMITS"):
        if not isinstance(getattr(s, key), dict):
            errors.append(Error(f"GEN_DURABLE['{key}'] must be a dict.", hint="name -> options", id=ID + "E007"))
    return errors


@register(Tags.database)
def check_database(app_configs=None, databases=None, **kwargs):
    """E008: the engine alias exists and is PostgreSQL; W002: prepared statements off.
    Checked for GEN_DURABLE['DATABASE'] and every alias GEN_DURABLE['DATABASES'] routes to
    (a bad route itself is E090/E091)."""
    alias = get_settings().DATABASE
    dbs = django_settings.DATABASES
    if alias not in dbs:
        return [Error(f"GEN_DURABLE['DATABASE'] names an unknown database alias {alias!r}.",
                      hint=f"Aliases: {', '.join(dbs)}.", id=ID + "E008")]
    pooler = get_settings().POOLER
    if pooler is not None and pooler != "transaction":
        return [Error(f"GEN_DURABLE['POOLER'] must be None or 'transaction', got {pooler!r}.",
                      hint="'transaction' when the database is reached through a transaction-mode pooler "
                           "(PgBouncer pool_mode = transaction).", id=ID + "E009")]
    return [m for a in [alias] + [r for r in _routed_aliases() if r != alias and r in dbs]
            for m in _check_alias(a, dbs[a], pooler)]


def _routed_aliases() -> list[str]:
    routes = get_settings().DATABASES
    if not isinstance(routes, dict):
        return []
    return sorted({a for section in ("MACHINES", "QUEUES") if isinstance(routes.get(section), dict)
                   for a in routes[section].values() if isinstance(a, str)})


def _check_alias(alias: str, cfg: dict, pooler) -> list:
    engine = cfg.get("ENGINE", "")
    if "postgresql" not in engine and "postgis" not in engine:  # PostGIS is PostgreSQL too
        return [Error(f"gen_durable needs PostgreSQL; database {alias!r} uses {cfg.get('ENGINE')!r}.",
                      hint="Use django.db.backends.postgresql with psycopg 3.", id=ID + "E008")]
    opts = cfg.get("OPTIONS", {})
    if pooler == "transaction":
        if opts.get("server_side_binding") is True or opts.get("prepare_threshold") is not None:
            return [Error(
                f"Database {alias!r} enables prepared statements, which a transaction-mode pooler cannot carry "
                "(GEN_DURABLE['POOLER'] = 'transaction').",
                hint="Remove server_side_binding and prepare_threshold from its OPTIONS.", id=ID + "E009")]
        return []
    if opts.get("server_side_binding") is not True or opts.get("prepare_threshold") is None:
        return [Warning(
            f"Database {alias!r} has prepared statements off (Django's default).",
            hint='Set OPTIONS={"server_side_binding": True, "prepare_threshold": 1} so each hot statement '
                 "is planned once per connection (docs/design.md#model); keep them off behind PgBouncer in transaction mode.",
            id=ID + "W002")]
    return []


def _served_queues() -> set:
    queues = get_settings().QUEUES
    return set(queues) if isinstance(queues, dict) else set()


@register(Tags.compatibility)
def check_machine_queues(app_configs=None, **kwargs):
    """W003: a registered machine whose queue GEN_DURABLE['QUEUES'] does not name.

    `rundurable` without --queue runs exactly the configured queues, so such a
    machine's rows would sit runnable forever.
    """
    from . import registry

    served = _served_queues()
    unserved: dict[str, dict] = {}  # queue -> {machine name: its first class}
    for (name, _version), cls in sorted(registry.all_machines().items()):
        if cls.queue not in served:
            unserved.setdefault(cls.queue, {}).setdefault(name, cls)
    warnings = []
    for queue, machines in unserved.items():
        # One warning per queue: a typo in QUEUES leaves every machine of the queue unserved.
        names = list(machines)
        close = difflib.get_close_matches(queue, served, n=1)
        hint = (f"Did you mean {close[0]!r}? " if close else "") + (
            f"Add {queue!r} to GEN_DURABLE['QUEUES'] (or run `rundurable --queue {queue}`); "
            f"configured queues: {sorted(served)}.")
        if len(names) == 1:
            who = f"Machine {names[0]!r} runs"
        else:
            shown = ", ".join(repr(n) for n in names[:3])
            who = f"Machines {shown}" + (f" and {len(names) - 3} more" if len(names) > 3 else "") + " run"
        warnings.append(Warning(f"{who} on queue {queue!r}, which no configured worker serves.",
                                hint=hint, obj=machines[names[0]], id=ID + "W003"))
    return warnings


@register(Tags.database)
def check_connection_budget(app_configs=None, databases=None, **kwargs):
    """E031: one `rundurable` process with GEN_DURABLE['QUEUES'] needs more connections than
    the server allows (`rundurable` refuses such a start too, with its own --queue and
    --processes figures; docs/reliability.md, "Connections")."""
    s = get_settings()
    if not databases or s.DATABASE not in databases or not isinstance(s.QUEUES, dict):
        return []
    from django.db import DatabaseError

    from .worker.connections import ConnectionBudgetError, check_budget, connection_need

    try:
        check_budget(connection_need(s.QUEUES))
    except ConnectionBudgetError as exc:
        return [Error(f"{exc}".replace("--processes", "processes"),
                      hint="Each sync step thread may hold a connection: see docs/reliability.md, "
                           "\"Connections\", for the formula.", id=ID + "E031")]
    except DatabaseError:  # no server: other checks report that
        return []
    return []


# How far the unserved-queue warnings count a queue's rows ("1,000+ rows" beyond).
QUEUE_SAMPLE_CAP = 1000


def unserved_queues(served, using=None, patterns=()) -> list[tuple[str, int, int]]:
    """(queue, runnable rows — counted up to QUEUE_SAMPLE_CAP + 1 —, its head row's id)
    of each queue with runnable rows that is not in `served`, by name, nor matches one of
    `patterns` (fnmatch, as EXTRA_QUEUES). Statements: 1 (one probe per distinct runnable
    queue on the pick index), +1 when any is unserved. Raises DatabaseError."""
    import fnmatch

    from . import db, sql

    names = [r[0] for r in db.fetchall(sql.OVERVIEW_RUNNABLE_QUEUES, None, using)
             if r[0] not in served and not any(fnmatch.fnmatchcase(r[0], p) for p in patterns)]
    if not names:
        return []
    return [tuple(r) for r in db.fetchall(sql.QUEUE_SAMPLE, {"queues": db.pg_array(names),
                                                             "cap": QUEUE_SAMPLE_CAP}, using)]


def describe_rows(n: int, example: int, cap: int | None = None) -> str:
    """`3 rows, e.g. id 42` (`1,000+ rows` past `cap`, for a count that stops there)."""
    count = f"{cap:,}+ rows" if cap is not None and n > cap else f"{n:,} row{'s' if n != 1 else ''}"
    return f"{count}, e.g. id {example}"


def describe_stranded(items, cap: int | None = None) -> str:
    """`payments (1,204 rows, e.g. id 42), …` of (name, rows, an id) triples."""
    return ", ".join(f"{name} ({describe_rows(n, example, cap)})" for name, n, example in items)


@register(Tags.database)
def check_runnable_queues(app_configs=None, databases=None, **kwargs):
    """W006: runnable rows wait in queues GEN_DURABLE['QUEUES'] does not name (an insert with
    a misspelt `queue=`): no worker started from these settings would run them."""
    s = get_settings()
    if not databases or s.DATABASE not in databases or not isinstance(s.QUEUES, dict):
        return []
    from django.db import DatabaseError

    try:
        unserved = unserved_queues(s.QUEUES)
    except DatabaseError:  # not migrated yet, or no server: other checks report that
        return []
    errors = []
    for queue, n, example in unserved:
        close = difflib.get_close_matches(queue, list(s.QUEUES), n=1)
        errors.append(Warning(
            f"Runnable rows wait in queue {queue!r} ({describe_rows(n, example, QUEUE_SAMPLE_CAP)}), "
            "which GEN_DURABLE['QUEUES'] does not name.",
            hint=(f"Did you mean {close[0]!r}? A misspelt queue= at insert: move those rows to the right "
                  f"queue (the admin's \"Move selected instances to a queue\", or `manage.py durable_bulk move "
                  f"--queue {queue} --to-queue {close[0]}`). " if close else "")
            + "If the queue is meant to exist, add it to QUEUES (or run a worker with --queue for it).",
            id=ID + "W006"))
    return errors


@register(Tags.database)
def check_rate_limit_names(app_configs=None, databases=None, **kwargs):
    """W004: live rows name rate limits that RATE_LIMITS does not configure (they would stall)."""
    alias = get_settings().DATABASE
    if not databases or alias not in databases:
        return []
    from django.db import DatabaseError

    from .limiter import unknown_rate_limits

    try:
        unknown = unknown_rate_limits()
    except DatabaseError:  # not migrated yet, or no server: other checks report that
        return []
    if not unknown:
        return []
    return [Warning(f"Rows waiting to run name rate limits that are not configured: {describe_stranded(unknown)}.",
                    hint="Add them to GEN_DURABLE['RATE_LIMITS']; until then those rows stay runnable and "
                         "are never admitted (each is re-offered every 60 s).", id=ID + "W004")]


@register(Tags.compatibility)
def check_database_routes(app_configs=None, **kwargs):
    """E090: GEN_DURABLE['DATABASES'] is not {"MACHINES": {name: alias}, "QUEUES": {queue: alias}};
    E091: it routes to an alias DATABASES lacks; W090: it names a machine no app registers
    (its inserts would land on DATABASE, not where the route says); W091: it names a queue
    no one declares (inserts refuse such a queue, so the route is dead — a typo)."""
    from django.db import connections

    from . import registry

    routes = get_settings().DATABASES
    hint = ('GEN_DURABLE["DATABASES"] = {"MACHINES": {"app.Machine": "alias"}, "QUEUES": {"queue": "alias"}} '
            "(docs/scaling.md).")
    if not isinstance(routes, dict):
        return [Error("GEN_DURABLE['DATABASES'] must be a dict.", hint=hint, id=ID + "E090")]
    errors = []
    for key in sorted(set(routes) - {"MACHINES", "QUEUES"}):
        errors.append(Error(f"GEN_DURABLE['DATABASES'] has an unknown key {key!r}.", hint=hint, id=ID + "E090"))
    known = {name for name, _version in registry.all_machines()}
    for section in ("MACHINES", "QUEUES"):
        value = routes.get(section, {})
        if not isinstance(value, dict):
            errors.append(Error(f"GEN_DURABLE['DATABASES'][{section!r}] must be a dict of name -> alias.",
                                hint=hint, id=ID + "E090"))
            continue
        for name, alias in sorted(value.items(), key=lambda kv: str(kv[0])):
            where = f"GEN_DURABLE['DATABASES'][{section!r}][{name!r}]"
            if not isinstance(name, str) or not name or not isinstance(alias, str) or not alias:
                errors.append(Error(f"{where} must map a non-empty name to a database alias (a string).",
                                    hint=hint, id=ID + "E090"))
            elif alias not in connections.settings:
                errors.append(Error(f"{where} routes to database {alias!r}, which DATABASES lacks.",
                                    hint=f"Aliases: {sorted(connections.settings)}.", id=ID + "E091"))
            elif section == "MACHINES" and name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                errors.append(Warning(f"{where}: no registered machine is named {name!r}; its route has no effect.",
                                      hint=f"Did you mean {close[0]!r}?" if close else
                                      "Machine names are registered names such as 'app.Machine'.",
                                      id=ID + "W090"))
            elif section == "QUEUES" and not queue_is_declared(name):
                from .calls import declared_queues

                close = difflib.get_close_matches(name, sorted(declared_queues()[0]), n=1)
                errors.append(Warning(f"{where}: no one declares queue {name!r} (GEN_DURABLE['QUEUES'], a "
                                      "registered machine's queue, EXTRA_QUEUES), so no insert can use the route.",
                                      hint=f"Did you mean {close[0]!r}?" if close else
                                      "Declare the queue, or remove the route.", id=ID + "W091"))
    return errors


def queue_is_declared(name: str) -> bool:
    import fnmatch

    from .calls import declared_queues

    names, patterns = declared_queues()
    return name in names or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def live_versions(using=None) -> list[dict]:
    """Live rows per (machine, version, step, status): `fsm`, `version`, `step`, `status`,
    `count`, `example` (an id), `handed_back` (rows a worker that did not know them handed
    back), `known` (whether this process's registry runs them). Statements: 1 (it reads
    every live row). Raises DatabaseError."""
    from . import db, registry, sql

    return [{"fsm": fsm, "version": version, "step": step, "status": status, "count": n, "example": example,
             "handed_back": back, "known": registry.knows(fsm, version, step)}
            for fsm, version, step, status, n, example, back in db.fetchall(sql.LIVE_VERSIONS, None, using)]


def unknown_rows_text(row) -> str:
    """What of a live_versions() row no registered class has, in words."""
    from . import registry

    versions = sorted(v for (n, v) in registry.all_machines() if n == row["fsm"])
    if not versions:
        return (f"no registered machine is named {row['fsm']!r} (a worker knows the classes the apps' "
                "durable.py modules define or import)")
    if row["version"] not in versions:
        return f"{row['fsm']} has versions {', '.join(f'v{v}' for v in versions)} here, not v{row['version']}"
    steps = sorted(registry.step_names(registry.get(row["fsm"], row["version"])))
    close = difflib.get_close_matches(row["step"], steps, n=1)
    return (f"{row['fsm']} v{row['version']} has no step {row['step']!r} (steps: {', '.join(steps)}"
            + (f"; renamed from {row['step']!r} to {close[0]!r}? declare step_aliases" if close else "") + ")")


@register(Tags.database)
def check_unknown_machines(app_configs=None, databases=None, **kwargs):
    """W060: live rows whose machine, version or step no registered class has.

    A worker of this release never runs them: it hands them back untouched
    (docs/guide.md, "Deploying"). Expected for a moment during a rolling deploy; left
    over after it, they are a removed machine, version or step. Reads every live row."""
    alias = get_settings().DATABASE
    if not databases or alias not in databases:
        return []
    from django.db import DatabaseError

    try:
        rows = [r for r in live_versions() if not r["known"]]
    except DatabaseError:  # not migrated yet, or no server: other checks report that
        return []
    out = []
    for r in rows:
        out.append(Warning(
            f"{r['count']:,} {r['status']} row{'s' if r['count'] != 1 else ''} of {r['fsm']} v{r['version']} at "
            f"step {r['step']!r} (e.g. id {r['example']}): {unknown_rows_text(r)}.",
            hint="Workers of this release hand them back untouched for a worker that knows them. Keep the "
                 "old class (or version, or an alias of the step) until they drained, or retry them at a "
                 "step this release has (gd.retry(id, step=...)); `manage.py durable_versions` lists "
                 "live rows per machine/version/step (docs/guide.md, \"Deploying\").",
            id=ID + "W060"))
    return out


@register(Tags.compatibility)
def check_outcome_steps(app_configs=None, **kwargs):
    """E120: a step or handle() whose code returns `Next("name")` (or `Await(next=)`,
    `ScheduleChildren(next=)`) with a literal step name its machine does not have.

    Found when the line runs, it fails the instance; read from the source here, it is a
    typo caught before the first row reaches it (names built at run time are not seen)."""
    from . import registry
    from .machine import step_suggestion
    from .source_steps import literal_step_names, step_functions

    errors, seen = [], set()
    for (name, _version), cls in sorted(registry.all_machines().items(), key=lambda kv: repr(kv[0])):
        if cls in seen:
            continue
        seen.add(cls)
        try:  # whatever a step object is made of, reading it never stops `check`
            functions = step_functions(cls)
        except Exception:
            functions = []
        for attr, func in functions:
            try:
                named = literal_step_names(func) if callable(func) else []
            except Exception:
                named = []
            for outcome, step, filename, line in named:
                if step in cls.steps:
                    continue
                where = f"{filename}:{line}"
                guess = step_suggestion(cls, step)
                errors.append(Error(
                    f"{name}.{attr} returns {outcome}({step!r}) ({where}), but {name} has no step {step!r}"
                    + (guess if guess.endswith("?") else guess + "."),
                    hint=f"Its steps are {sorted(cls.steps)}; the instance would fail when that line runs "
                         "(a renamed step keeps its old name in `step_aliases`).",
                    obj=cls, id=ID + "E120"))
    return errors
