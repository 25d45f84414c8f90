"""System checks for settings.GEN_DURABLE (docs/design.md#settings).

Each check runs under `override_settings(GEN_DURABLE=...)` and is compared with its
exact list of messages, as Django's own check tests do. No database is touched: the
checks read settings only.
"""

import contextlib
import copy
import inspect

import pytest
from django.conf import settings
from django.core import checks as django_checks
from django.core.checks import Error, Warning
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from gen_durable import checks, conf
from gen_durable.outcomes import Next as GdNext  # noqa: F401  (shadowed in an E120 test)
from gen_durable.conf import DEFAULTS

ALL_CHECKS = (
    checks.check_unknown_keys,
    checks.check_queues,
    checks.check_timings,
    checks.check_sections,
    checks.check_notify_and_limiter,
    checks.check_limits,
    checks.check_database,
)


def run_all():
    return [m for check in ALL_CHECKS for m in check()]


def E(n, msg, hint):
    return Error(msg, hint=hint, id=f"gen_durable.E{n:03d}")


# --- baseline -------------------------------------------------------------------------

def test_the_test_suite_settings_pass_every_check():
    assert run_all() == []


@override_settings(GEN_DURABLE={})
def test_an_empty_gen_durable_setting_passes_every_check():
    assert run_all() == []


def test_every_check_is_registered_with_django():
    registered = set(django_checks.registry.registry.get_checks())
    assert set(ALL_CHECKS) <= registered


def test_bad_settings_stop_manage_py_check_with_the_check_id():
    # `manage.py check` (and so migrate and rundurable) refuses to start on a bad
    # value and names it. (The suite's settings have no MIDDLEWARE, which the admin's
    # own checks flag, so only the compatibility tag that gen_durable uses is run.)
    with override_settings(GEN_DURABLE={"QUEUES": {"default": 0}}):
        with pytest.raises(SystemCheckError, match=r"gen_durable\.E002.*'default'"):
            call_command("check", tags=["compatibility"])
    call_command("check", tags=["compatibility"])  # and is quiet with the good settings


# --- E001 unknown keys ------------------------------------------------------------------

@override_settings(GEN_DURABLE={"QUEUS": {"default": 1}})
def test_unknown_key_is_named_with_a_did_you_mean_hint():
    assert checks.check_unknown_keys() == [
        E(1, "GEN_DURABLE has an unknown key 'QUEUS'.", "Did you mean 'QUEUES'?"),
    ]


@override_settings(GEN_DURABLE={"ZZZ": 1, "LEASE_TL": 60})
def test_each_unknown_key_gets_its_own_error_in_sorted_order():
    assert checks.check_unknown_keys() == [
        E(1, "GEN_DURABLE has an unknown key 'LEASE_TL'.", "Did you mean 'LEASE_TTL'?"),
        E(1, "GEN_DURABLE has an unknown key 'ZZZ'.", "Known keys: " + ", ".join(DEFAULTS)),
    ]


@override_settings(GEN_DURABLE=[("QUEUES", {"default": 1})])
def test_gen_durable_that_is_not_a_dict_is_an_error():
    assert checks.check_unknown_keys() == [
        E(1, "GEN_DURABLE must be a dict.", "See docs/design.md#settings for the keys."),
    ]


@override_settings(GEN_DURBLE={"QUEUES": {"reports": 1}}, GEN_DURABLE_EXTRA="x", GENERAL_OPTION=1)
def test_a_misspelt_gen_durable_setting_is_a_warning():
    assert checks.check_setting_name() == [
        checks.Warning("The setting 'GEN_DURBLE' looks like a misspelt GEN_DURABLE; gen_durable does not read it.",
                       hint="Rename it GEN_DURABLE (or silence gen_durable.W005 in SILENCED_SYSTEM_CHECKS).",
                       id="gen_durable.W005"),
    ]


def test_the_test_settings_have_no_misspelt_gen_durable():
    assert checks.check_setting_name() == []


@override_settings(REST_FRAMEWORK={}, CELERY_BROKER_URL="x", CHANNEL_LAYERS={}, Q_CLUSTER={}, HUEY={}, RQ_QUEUES={},
                   DRAMATIQ_BROKER={}, PROCRASTINATE_APP="x", GENERIC_DURABLE=1, GEN_DURABILITY=1, DURABLE=1,
                   GEN_DURABLE_TEST=1, SIMPLE_JWT={}, CORS_ALLOWED_ORIGINS=[], SENTRY_DSN="x")
def test_common_setting_names_are_not_taken_for_a_misspelt_gen_durable():
    """Every Django default is in the test settings (above); these are common project
    and third-party names, and near misses that are not typos of it."""
    assert checks.check_setting_name() == []


# --- E002 QUEUES ----------------------------------------------------------------------

QUEUE_HINT = "It is the number of concurrent steps per worker process."


NAME_HINT = "Queue names are non-empty strings of at most 255 characters, without NUL."


@pytest.mark.parametrize("queues, expected", [
    ({"default": 0}, [E(2, "GEN_DURABLE['QUEUES']['default'] must be a positive int, got 0.", QUEUE_HINT)]),
    ({"mail": -3}, [E(2, "GEN_DURABLE['QUEUES']['mail'] must be a positive int, got -3.", QUEUE_HINT)]),
    ({"mail": "3"}, [E(2, "GEN_DURABLE['QUEUES']['mail'] must be a positive int, got '3'.", QUEUE_HINT)]),
    ({"mail": 2.5}, [E(2, "GEN_DURABLE['QUEUES']['mail'] must be a positive int, got 2.5.", QUEUE_HINT)]),
    ({"mail": True}, [E(2, "GEN_DURABLE['QUEUES']['mail'] must be a positive int, got True.", QUEUE_HINT)]),
    ({"": 3}, [E(2, "GEN_DURABLE['QUEUES'] has an invalid queue name ''.", "Queue names are non-empty strings.")]),
    ({7: 3}, [E(2, "GEN_DURABLE['QUEUES'] has an invalid queue name 7.", "Queue names are non-empty strings.")]),
    (["default"], [E(2, "GEN_DURABLE['QUEUES'] must be a dict of queue name -> concurrency.",
                     'For example {"default": 10}.')]),
    ({"a": 1, "b": 0, "c": 2}, [E(2, "GEN_DURABLE['QUEUES']['b'] must be a positive int, got 0.", QUEUE_HINT)]),
    ({"default": 2, "a\x00b": 1}, [E(2, "GEN_DURABLE['QUEUES'] has an invalid queue name 'a\\x00b': queue name "
                                         "contains a NUL character (\\x00), which Postgres text cannot store: "
                                         "'a\\x00b'.", NAME_HINT)]),
    ({"q" * 256: 1}, [E(2, f"GEN_DURABLE['QUEUES'] has an invalid queue name {'q' * 256!r}: queue name is 256 "
                           f"characters long; the limit is 255 (it starts {'q' * 40!r}).", NAME_HINT)]),
], ids=["zero", "negative", "string", "float", "bool", "empty-name", "int-name", "not-a-dict", "one-of-three",
        "nul", "too-long"])
def test_queues_must_map_names_to_positive_ints(queues, expected):
    with override_settings(GEN_DURABLE={"QUEUES": queues}):
        assert checks.check_queues() == expected


@override_settings(GEN_DURABLE={"QUEUES": {}})
def test_no_queues_is_a_valid_web_only_node():
    assert checks.check_queues() == []


# --- E003 durations and knobs; W001 heartbeat vs lease ------------------------------

def seconds_error(key, value):
    return E(3, f"GEN_DURABLE['{key}'] must be a number of seconds > 0, got {value!r}.",
             "Durations are seconds (docs/design.md#settings).")


@pytest.mark.parametrize("overrides, expected", [
    ({"LEASE_TTL": 0}, [seconds_error("LEASE_TTL", 0)]),
    ({"LEASE_TTL": "60"}, [seconds_error("LEASE_TTL", "60")]),
    ({"HEARTBEAT_INTERVAL": -1}, [seconds_error("HEARTBEAT_INTERVAL", -1)]),
    ({"POLL_INTERVAL": None}, [seconds_error("POLL_INTERVAL", None)]),
    ({"MAX_POLL_INTERVAL": True}, [seconds_error("MAX_POLL_INTERVAL", True)]),
    ({"DRAIN_TIMEOUT": -0.5}, [E(3, "GEN_DURABLE['DRAIN_TIMEOUT'] must be seconds >= 0, got -0.5.",
                                  "Seconds in-flight steps get on shutdown.")]),
    ({"PREFETCH": -1}, [E(3, "GEN_DURABLE['PREFETCH'] must be None or an int >= 0, got -1.",
                          "Rows a queue claims beyond its free step threads: None (the default) sizes it from "
                          "the measured step rate; an int fixes it (docs/guide.md, Tuning throughput).")]),
    ({"MIN_DEMAND": 0}, [E(3, "GEN_DURABLE['MIN_DEMAND'] must be None or an int >= 1, got 0.",
                           "Free slots a queue waits for before it claims: None (the default) follows the "
                           "claim-ahead; an int fixes it, e.g. 100 with PREFETCH 500 (docs/guide.md, Tuning "
                           "throughput).")]),
    ({"MAX_PAYLOAD_BYTES": 0}, [E(3, "GEN_DURABLE['MAX_PAYLOAD_BYTES'] must be a positive int.",
                                  "Bytes of encoded JSON.")]),
    ({"POLL_INTERVAL": 6, "MAX_POLL_INTERVAL": 5}, [
        E(3, "GEN_DURABLE['POLL_INTERVAL'] exceeds MAX_POLL_INTERVAL.",
          "The back-off ceiling must be >= the base interval.")]),
    ({"LEASE_TTL": 0, "POLL_INTERVAL": "1"}, [seconds_error("LEASE_TTL", 0), seconds_error("POLL_INTERVAL", "1")]),
], ids=["lease-zero", "lease-string", "heartbeat-negative", "poll-none", "max-poll-bool", "drain-negative",
        "prefetch-negative", "min-demand-zero", "payload-zero", "poll-above-ceiling", "two-at-once"])
def test_durations_and_knobs_are_validated(overrides, expected):
    with override_settings(GEN_DURABLE=overrides):
        assert checks.check_timings() == expected


@pytest.mark.parametrize("key, value", [("STATEMENT_TIMEOUT", 3_000_000), ("LEASE_TTL", float("inf")),
                                        ("LEASE_TTL", 1e308), ("LOCK_TIMEOUT", 2_147_484), ("DRAIN_TIMEOUT", 1e12)])
def test_a_duration_past_what_postgres_and_the_clock_take_is_refused(key, value):
    # A statement_timeout above 2**31 - 1 ms fails every connection (retried for ever); an
    # infinite lease overflows the heartbeat's timestamps.
    overrides = {key: value, **({"STATEMENT_TIMEOUT": 1e7} if key == "LOCK_TIMEOUT" else {})}
    with override_settings(GEN_DURABLE=overrides):
        found = [m for m in checks.check_timings() if f"['{key}']" in m.msg]
    assert [(m.id, m.msg) for m in found] == [(
        "gen_durable.E003", f"GEN_DURABLE['{key}'] is {value!r} seconds; the largest is 2,147,483 (about "
                            "24.8 days, the longest timeout Postgres takes).")]


@override_settings(GEN_DURABLE={"STATEMENT_TIMEOUT": 2_147_483, "LOCK_TIMEOUT": 2_147_483, "LEASE_TTL": 2_147_483})
def test_the_largest_durations_are_accepted():
    assert checks.check_timings() == []


@override_settings(GEN_DURABLE={"DRAIN_TIMEOUT": 0, "PREFETCH": 0, "LEASE_TTL": 0.5, "HEARTBEAT_INTERVAL": 0.1,
                                "POLL_INTERVAL": 0.05, "MAX_POLL_INTERVAL": 0.05})
def test_zero_drain_and_fractional_seconds_are_accepted():
    assert checks.check_timings() == []


@override_settings(GEN_DURABLE={"LEASE_TTL": 30, "HEARTBEAT_INTERVAL": 11})
def test_heartbeat_times_three_above_the_lease_warns():
    assert checks.check_timings() == [Warning(
        "GEN_DURABLE heartbeat (11s) x 3 exceeds the lease (30s).",
        hint="A missed heartbeat or two would let the reaper take a live step; "
             "keep HEARTBEAT_INTERVAL x 3 <= LEASE_TTL.",
        id="gen_durable.W001",
    )]


@override_settings(GEN_DURABLE={"LEASE_TTL": 30, "HEARTBEAT_INTERVAL": 10})
def test_heartbeat_exactly_a_third_of_the_lease_is_fine():
    assert checks.check_timings() == []


@override_settings(GEN_DURABLE={"LEASE_TTL": 30, "HEARTBEAT_INTERVAL": 11, "MIN_DEMAND": 0})
def test_heartbeat_warning_waits_until_the_values_are_valid():
    assert [m.id for m in checks.check_timings()] == ["gen_durable.E003"]


# --- E004 FLUSH / REAPER / GC -----------------------------------------------------

@pytest.mark.parametrize("overrides, expected", [
    ({"FLUSH": {"MAX_BATCH": 5, "MAX_DEALY": 1}}, [
        E(4, "GEN_DURABLE['FLUSH'] has an unknown key 'MAX_DEALY'.", "Did you mean 'MAX_DELAY'?")]),
    ({"REAPER": {"INTERVL": 5}}, [
        E(4, "GEN_DURABLE['REAPER'] has an unknown key 'INTERVL'.", "Did you mean 'INTERVAL'?")]),
    ({"GC": {"RETENTON": 5, "XYZZY": 1}}, [
        E(4, "GEN_DURABLE['GC'] has an unknown key 'RETENTON'.", "Did you mean 'RETENTION'?"),
        E(4, "GEN_DURABLE['GC'] has an unknown key 'XYZZY'.", "Keys: INTERVAL, RETENTION, BATCH.")]),
    ({"FLUSH": False}, [
        E(4, "GEN_DURABLE['FLUSH'] cannot be False.", "Every outcome goes through the flush (docs/design.md#decisions).")]),
    ({"REAPER": True}, [
        E(4, "GEN_DURABLE['REAPER'] must be a dict or False, got True.", "Keys: INTERVAL.")]),
    ({"GC": 60}, [
        E(4, "GEN_DURABLE['GC'] must be a dict or False, got 60.", "Keys: INTERVAL, RETENTION, BATCH.")]),
    ({"FLUSH": {"MAX_BATCH": 0}}, [
        E(4, "GEN_DURABLE['FLUSH']['MAX_BATCH'] must be a positive integer, got 0.",
          "Durations are seconds; batches are ints.")]),
    ({"FLUSH": {"MAX_BATCH": 2.5}}, [
        E(4, "GEN_DURABLE['FLUSH']['MAX_BATCH'] must be a positive integer, got 2.5.",
          "Durations are seconds; batches are ints.")]),
    ({"REAPER": {"INTERVAL": -1}}, [
        E(4, "GEN_DURABLE['REAPER']['INTERVAL'] must be a positive number of seconds <= 86400 (a day), got -1.",
          "Durations are seconds; batches are ints.")]),
    ({"REAPER": {"INTERVAL": float("inf")}}, [
        E(4, "GEN_DURABLE['REAPER']['INTERVAL'] must be a positive number of seconds <= 86400 (a day), got inf.",
          "Durations are seconds; batches are ints.")]),
    # A thread waits out MAX_DELAY in one call: infinity (or anything past threading's
    # TIMEOUT_MAX) would raise there and stop every commit of the worker.
    ({"FLUSH": {"MAX_DELAY": float("inf")}}, [
        E(4, "GEN_DURABLE['FLUSH']['MAX_DELAY'] must be a number of seconds >= 0 and <= 60, got inf.",
          "Durations are seconds; batches are ints.")]),
    ({"FLUSH": {"MAX_DELAY": float("nan")}}, [
        E(4, "GEN_DURABLE['FLUSH']['MAX_DELAY'] must be a number of seconds >= 0 and <= 60, got nan.",
          "Durations are seconds; batches are ints.")]),
    ({"FLUSH": {"MAX_DELAY": 61}}, [
        E(4, "GEN_DURABLE['FLUSH']['MAX_DELAY'] must be a number of seconds >= 0 and <= 60, got 61.",
          "Durations are seconds; batches are ints.")]),
    ({"FLUSH": "fast"}, [
        E(4, "GEN_DURABLE['FLUSH'] must be a dict, got 'fast'.", "Keys: MAX_BATCH, MAX_DELAY, MAX_BYTES.")]),
    ({"FLUSH": {"MAX_BYTES": 0}}, [
        E(4, "GEN_DURABLE['FLUSH']['MAX_BYTES'] must be a positive integer (bytes), got 0.",
          "Durations are seconds; batches are ints.")]),
    ({"GC": {"BATCH": "10"}}, [
        E(4, "GEN_DURABLE['GC']['BATCH'] must be a positive integer, got '10'.",
          "Durations are seconds; batches are ints.")]),
    ({"GC": {"RETENTION": -1}}, [
        E(4, "GEN_DURABLE['GC']['RETENTION'] must be a number of seconds >= 0 and <= 3153600000 (100 years), got -1.",
          "Durations are seconds; batches are ints.")]),
    ({"GC": {"RETENTION": float("inf")}}, [
        E(4, "GEN_DURABLE['GC']['RETENTION'] must be a number of seconds >= 0 and <= 3153600000 (100 years), got inf.",
          "Durations are seconds; batches are ints.")]),
], ids=["flush-typo", "reaper-typo", "gc-typo-and-unknown", "flush-false", "reaper-true", "gc-int",
        "max-batch-zero", "max-batch-float", "reaper-negative", "reaper-infinite", "max-delay-infinite",
        "max-delay-nan", "max-delay-over-a-minute", "flush-not-a-dict", "max-bytes-zero", "gc-batch-string", "retention-negative",
        "retention-infinite"])
def test_flush_reaper_and_gc_sections_are_validated(overrides, expected):
    with override_settings(GEN_DURABLE=overrides):
        assert checks.check_sections() == expected


@override_settings(GEN_DURABLE={"REAPER": False, "GC": False})
def test_reaper_and_gc_may_be_switched_off_with_false():
    assert checks.check_sections() == []


@override_settings(GEN_DURABLE={"GC": {"RETENTION": 0}, "FLUSH": {"MAX_DELAY": 0.001}})
def test_zero_retention_is_accepted():
    assert checks.check_sections() == []


# --- E005 NOTIFY, E006 LIMITER --------------------------------------------------------

@pytest.mark.parametrize("notify, expected", [
    ("postgres", []),
    ("none", []),
    ("redis", [E(5, "GEN_DURABLE['NOTIFY'] must be 'postgres' or 'none', got 'redis'.", "'none' means poll only.")]),
    (None, [E(5, "GEN_DURABLE['NOTIFY'] must be 'postgres' or 'none', got None.", "'none' means poll only.")]),
])
def test_notify_is_postgres_or_none(notify, expected):
    with override_settings(GEN_DURABLE={"NOTIFY": notify}):
        assert checks.check_notify_and_limiter() == expected


def limiter_shape_error(value):
    return E(6, f"GEN_DURABLE['LIMITER'] must be 'postgres' or {{'BACKEND': 'redis', 'URL': ...}}, got {value!r}.",
             "See docs/guide.md#postgres-or-redis.")


@pytest.mark.parametrize("limiter, expected", [
    ("postgres", []),
    ({"BACKEND": "postgres"}, []),
    ({"BACKEND": "redis", "URL": "redis://127.0.0.1:6379/0"}, []),
    ("redis", [limiter_shape_error("redis")]),
    ({"BACKEND": "memcached"}, [limiter_shape_error({"BACKEND": "memcached"})]),
    ({"BACKEND": "redis"}, [E(6, "GEN_DURABLE['LIMITER'] with BACKEND 'redis' needs a 'URL'.",
                              "For example 'redis://127.0.0.1:6379/0'.")]),
    ({"BACKEND": "redis", "URL": "http://x"}, [
        E(6, "GEN_DURABLE['LIMITER']['URL'] must be a redis://, rediss:// or unix:// URL, got 'http://x'.",
          "For example 'redis://127.0.0.1:6379/0'.")]),
    ({"BACKEND": "redis", "URL": "rediss://cache:6380/1"}, []),
], ids=["postgres", "postgres-dict", "redis-url", "bare-redis-string", "unknown-backend", "redis-no-url",
        "redis-http-url", "rediss-url"])
def test_limiter_is_postgres_or_redis_with_a_url(limiter, expected):
    with override_settings(GEN_DURABLE={"LIMITER": limiter}):
        assert checks.check_notify_and_limiter() == expected


# --- E007 RATE_LIMITS / CONCURRENCY_LIMITS ---------------------------------------------

def rate_error(name):
    return E(7, f"GEN_DURABLE['RATE_LIMITS'][{name!r}] needs 'allowed' (>= 0) and 'period' (seconds > 0).",
             'For example {"allowed": 100, "period": 60}.')


def gate_error(name):
    return E(7, f"GEN_DURABLE['CONCURRENCY_LIMITS'][{name!r}] needs 'limit', a positive int.",
             'For example {"limit": 5}.')


@pytest.mark.parametrize("overrides, expected", [
    ({"RATE_LIMITS": {"stripe": {"allowed": 100, "period": 60, "burst": 10, "shards": 2}},
      "CONCURRENCY_LIMITS": {"gate": {"limit": 5, "shards": 2}}}, []),
    ({"RATE_LIMITS": {"frozen": {"allowed": 0, "period": 1}}}, []),
    ({"RATE_LIMITS": {"stripe": {"allowed": 10}}}, [rate_error("stripe")]),
    ({"RATE_LIMITS": {"stripe": {"allowed": -1, "period": 1}}}, [rate_error("stripe")]),
    ({"RATE_LIMITS": {"stripe": {"allowed": 1, "period": 0}}}, [rate_error("stripe")]),
    ({"RATE_LIMITS": {"stripe": 100}}, [rate_error("stripe")]),
    ({"CONCURRENCY_LIMITS": {"gate": {"limit": 0}}}, [gate_error("gate")]),
    ({"CONCURRENCY_LIMITS": {"gate": {"limit": 2.0}}}, [gate_error("gate")]),
    ({"CONCURRENCY_LIMITS": {"gate": {}}}, [gate_error("gate")]),
    ({"RATE_LIMITS": ["stripe"]}, [E(7, "GEN_DURABLE['RATE_LIMITS'] must be a dict.", "name -> options")]),
    ({"CONCURRENCY_LIMITS": None}, [E(7, "GEN_DURABLE['CONCURRENCY_LIMITS'] must be a dict.", "name -> options")]),
], ids=["valid", "zero-rate", "no-period", "negative-allowed", "zero-period", "not-a-dict-entry",
        "limit-zero", "limit-float", "limit-missing", "rate-limits-list", "gates-none"])
def test_rate_and_concurrency_limits_are_validated(overrides, expected):
    with override_settings(GEN_DURABLE=overrides):
        assert checks.check_limits() == expected


# --- E008 database alias, W002 prepared statements -----------------------------------
# Overriding DATABASES only changes what the check reads: Django's connection handler
# has already cached its settings, so the live test connection is untouched.

ignore_databases_warning = pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")


def real_db():
    return copy.deepcopy(settings.DATABASES["default"])


@override_settings(GEN_DURABLE={"DATABASE": "reporting"})
def test_unknown_database_alias_is_an_error():
    assert checks.check_database() == [
        E(8, "GEN_DURABLE['DATABASE'] names an unknown database alias 'reporting'.",
          "Aliases: " + ", ".join(settings.DATABASES) + "."),
    ]


@ignore_databases_warning
def test_a_database_that_is_not_postgres_is_an_error():
    other = {**real_db(), "ENGINE": "django.db.backends.mysql"}
    with override_settings(DATABASES={"default": real_db(), "legacy": other},
                           GEN_DURABLE={"DATABASE": "legacy"}):
        assert checks.check_database() == [
            E(8, "gen_durable needs PostgreSQL; database 'legacy' uses 'django.db.backends.mysql'.",
              "Use django.db.backends.postgresql with psycopg 3."),
        ]


@ignore_databases_warning
def test_postgis_counts_as_postgres():
    gis = {**real_db(), "ENGINE": "django.contrib.gis.db.backends.postgis"}
    with override_settings(DATABASES={"default": gis}):
        assert checks.check_database() == []


W002_HINT = ('Set OPTIONS={"server_side_binding": True, "prepare_threshold": 1} so each hot statement '
             "is planned once per connection (docs/design.md#model); keep them off behind PgBouncer in transaction mode.")


@ignore_databases_warning
@pytest.mark.parametrize("options", [
    None,
    {},
    {"server_side_binding": True},
    {"server_side_binding": True, "prepare_threshold": None},
    {"prepare_threshold": 1},
], ids=["no-options", "empty", "binding-only", "threshold-none", "threshold-only"])
def test_prepared_statements_off_warns(options):
    cfg = real_db()
    cfg.pop("OPTIONS", None)
    if options is not None:
        cfg["OPTIONS"] = options
    with override_settings(DATABASES={"default": cfg}):
        assert checks.check_database() == [
            Warning("Database 'default' has prepared statements off (Django's default).",
                    hint=W002_HINT, id="gen_durable.W002"),
        ]


@ignore_databases_warning
def test_the_warning_follows_the_engine_alias_not_default():
    plain = real_db()
    plain.pop("OPTIONS", None)
    with override_settings(DATABASES={"default": real_db(), "jobs": plain}, GEN_DURABLE={"DATABASE": "jobs"}):
        assert [(m.id, m.msg) for m in checks.check_database()] == [
            ("gen_durable.W002", "Database 'jobs' has prepared statements off (Django's default).")]
    with override_settings(DATABASES={"default": plain, "jobs": real_db()}, GEN_DURABLE={"DATABASE": "jobs"}):
        assert checks.check_database() == []


@ignore_databases_warning
def test_an_alias_the_routes_name_is_checked_too():
    """A queue group's database (GEN_DURABLE['DATABASES']) runs the same engine: a
    routed alias gets E008 and W002 like GEN_DURABLE['DATABASE']; an unrouted one
    (the control) does not."""
    plain = real_db()
    plain.pop("OPTIONS", None)
    mysql = {**real_db(), "ENGINE": "django.db.backends.mysql"}
    dbs = {"default": real_db(), "bulk": plain, "legacy": mysql, "unrouted": plain}
    with override_settings(DATABASES=dbs, GEN_DURABLE={"DATABASES": {"QUEUES": {"imports": "bulk"},
                                                                     "MACHINES": {"app.M": "legacy"}}}):
        assert [(m.id, m.msg) for m in checks.check_database()] == [
            ("gen_durable.W002", "Database 'bulk' has prepared statements off (Django's default)."),
            ("gen_durable.E008", "gen_durable needs PostgreSQL; database 'legacy' uses 'django.db.backends.mysql'."),
        ]
    with override_settings(DATABASES=dbs):
        assert checks.check_database() == []


# --- conf.get_settings ------------------------------------------------------------------

@override_settings(GEN_DURABLE={"FLUSH": {"MAX_BATCH": 5}, "GC": {"RETENTION": 10}})
def test_partial_nested_dicts_merge_over_the_defaults():
    s = conf.get_settings()
    assert s.FLUSH == {"MAX_BATCH": 5, "MAX_DELAY": 0.005, "MAX_BYTES": 8 * 1024 * 1024}
    assert s.GC == {"INTERVAL": 60, "RETENTION": 10, "BATCH": 10000}
    assert s.REAPER == {"INTERVAL": 30}
    assert DEFAULTS["FLUSH"] == {"MAX_BATCH": 500, "MAX_DELAY": 0.005, "MAX_BYTES": 8 * 1024 * 1024}  # defaults not mutated


@override_settings(GEN_DURABLE={"REAPER": False, "QUEUES": {"mail": 2}})
def test_false_sections_and_top_level_dicts_replace_rather_than_merge():
    s = conf.get_settings()
    assert s.REAPER is False
    assert s.QUEUES == {"mail": 2}  # not merged with {"default": 10}


@override_settings(GEN_DURABLE={"LEASE_TL": 5, "AAA": 1})
def test_unknown_keys_are_kept_aside_not_applied():
    s = conf.get_settings()
    assert s.unknown == ("AAA", "LEASE_TL")
    assert s.LEASE_TTL == 60


def test_settings_are_frozen():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        conf.get_settings().LEASE_TTL = 1


def test_settings_reset_when_overridden_and_restored():
    before = conf.get_settings()
    assert before.QUEUES == settings.GEN_DURABLE["QUEUES"]
    with override_settings(GEN_DURABLE={"QUEUES": {"other": 7}, "LEASE_TTL": 99}):
        inside = conf.get_settings()
        assert (inside.QUEUES, inside.LEASE_TTL) == ({"other": 7}, 99)
    after = conf.get_settings()
    assert (after.QUEUES, after.LEASE_TTL) == (settings.GEN_DURABLE["QUEUES"], settings.GEN_DURABLE["LEASE_TTL"])


def test_database_alias_defaults_from_settings():
    assert conf.database_alias() == "default"
    assert conf.database_alias("other") == "other"
    with override_settings(GEN_DURABLE={"DATABASE": "jobs"}):
        assert conf.database_alias() == "jobs"


def test_zero_flush_delay_is_accepted():
    with override_settings(GEN_DURABLE={"FLUSH": {"MAX_DELAY": 0}}):
        assert checks.check_sections() == []


def test_limit_entries_reject_unknown_keys_and_bad_shards_or_burst():
    with override_settings(GEN_DURABLE={
        "RATE_LIMITS": {"api": {"allowed": 10, "period": 1, "brust": 5, "burst": -1}},
        "CONCURRENCY_LIMITS": {"pool": {"limit": 2, "shards": 0}, "pdf": {"limit": 2, "per": "tenant"},
                               "erp": {"limit": 1, "per": "key"}},
    }):
        msgs = [e.msg for e in checks.check_limits()]
    assert msgs == [
        "GEN_DURABLE['RATE_LIMITS']['api'] has an unknown key 'brust'.",
        "GEN_DURABLE['RATE_LIMITS']['api']['burst'] must be a number >= 0.",
        "GEN_DURABLE['CONCURRENCY_LIMITS']['pool']['shards'] must be a positive int.",
        "GEN_DURABLE['CONCURRENCY_LIMITS']['pdf']['per'] must be 'name' or 'key', not 'tenant'.",
    ]


# --- E030: a heartbeat that cannot keep a lease alive; the derived default -----------

@override_settings(GEN_DURABLE={"LEASE_TTL": 5, "HEARTBEAT_INTERVAL": 20})
def test_a_heartbeat_longer_than_half_the_lease_is_an_error():
    (error,) = checks.check_timings()
    assert error.id == "gen_durable.E030" and isinstance(error, Error)
    assert error.msg == ("GEN_DURABLE['HEARTBEAT_INTERVAL'] (20s) cannot keep a 5s lease alive: "
                         "a lease must outlast two heartbeats.")


@override_settings(GEN_DURABLE={"LEASE_TTL": 5})
def test_an_unset_heartbeat_is_a_third_of_the_lease_and_passes_the_checks():
    from gen_durable.conf import get_settings

    assert get_settings().HEARTBEAT_INTERVAL == pytest.approx(5 / 3)
    assert checks.check_timings() == []


@override_settings(GEN_DURABLE={"LEASE_TTL": 60, "HEARTBEAT_INTERVAL": None})
def test_the_default_heartbeat_is_20_seconds_for_the_default_lease():
    from gen_durable.conf import get_settings

    assert get_settings().HEARTBEAT_INTERVAL == 20

def test_machines_of_one_unserved_queue_get_one_warning():
    import gen_durable as gd
    from gen_durable import registry
    from gen_durable.checks import check_machine_queues

    made = []
    for i in range(5):
        made.append(type(f"Typo{i}", (gd.Machine,), {"name": f"tests.checks.Typo{i}", "queue": "dfeault",
                                                     "start": gd.step(lambda self, ctx: gd.Done())}))
    try:
        with override_settings(GEN_DURABLE={"QUEUES": {"default": 4}}):
            found = [m for m in check_machine_queues() if "'dfeault'" in m.msg]
        assert [(m.id, m.msg) for m in found] == [
            ("gen_durable.W003", "Machines 'tests.checks.Typo0', 'tests.checks.Typo1', 'tests.checks.Typo2' and 2 "
                                 "more run on queue 'dfeault', which no configured worker serves.")]
        assert found[0].obj is made[0] and found[0].hint.startswith("Did you mean 'default'?")
    finally:
        for i in range(5):
            registry._machines.pop((f"tests.checks.Typo{i}", 1), None)
        registry._known = None


def test_a_machine_whose_queue_no_configured_worker_serves_is_warned_about():
    import gen_durable as gd
    from gen_durable import registry
    from gen_durable.checks import check_machine_queues

    class Mistyped(gd.Machine):
        name = "tests.checks.Mistyped"
        queue = "emial"

        @gd.step
        def start(self, ctx):
            return gd.Done()

    try:
        with override_settings(GEN_DURABLE={"QUEUES": {"email": 2, "default": 4}}):
            found = [m for m in check_machine_queues() if m.obj is Mistyped]
        assert [(m.id, m.msg) for m in found] == [
            ("gen_durable.W003", "Machine 'tests.checks.Mistyped' runs on queue 'emial', which no configured worker serves.")]
        assert found[0].hint.startswith("Did you mean 'email'?")
        with override_settings(GEN_DURABLE={"QUEUES": {"emial": 1}}):
            assert not [m for m in check_machine_queues() if m.obj is Mistyped]
    finally:
        registry._machines.pop(("tests.checks.Mistyped", 1), None)


@pytest.mark.parametrize("limits, expected", [
    ({"RATE_LIMITS": {"api": {"alowed": 5, "period": 1}}}, rate_error("api")),
    ({"CONCURRENCY_LIMITS": {"erp": {"limt": 2}}}, gate_error("erp")),
], ids=["rate-typo", "gate-typo"])
def test_a_malformed_limit_beside_a_schedule_is_reported_not_raised(limits, expected):
    """The schedule check builds its row (rate-limit lookups included): a malformed limit
    must surface as E007, never as a KeyError out of `manage.py check`."""
    schedules = {"tick": {"cron": "*/5 * * * *", "machine": "tests.Counter"}}
    with override_settings(GEN_DURABLE={**limits, "SCHEDULES": schedules}):
        messages = [m for check in (checks.check_limits, checks.check_schedules) for m in check()]
    assert messages[0] == expected
    assert "has an unknown key" in messages[1].msg  # the misspelt key is named too
    assert [m.id for m in messages] == ["gen_durable.E007"] * 2


def test_an_unknown_schedule_machine_suggests_a_registered_name():
    with override_settings(GEN_DURABLE={"SCHEDULES": {"tick": {"cron": "0 3 * * *", "machine": "tests.Countr"}}}):
        [message] = checks.check_schedules()
    assert "unknown machine 'tests.Countr'" in message.msg
    assert message.msg.endswith("did you mean 'tests.Counter'?")  # the one closest name, no "?."


@pytest.mark.django_db
def test_runnable_rows_in_a_queue_no_worker_is_configured_for_are_a_warning(settings):
    import gen_durable as gd
    from tests.durable_app.durable import Plain

    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "QUEUES": {"default": 4, "emails": 2}}
    typo = [gd.insert(Plain, queue="emials") for _ in range(2)]  # the first is the queue's head
    gd.insert(Plain, queue="emails")
    # (rows other tests left in their own queues may be reported too)
    warnings = [w for w in checks.check_runnable_queues(databases=["default"]) if "'emials'" in w.msg
                or "'emails'" in w.msg]
    assert [(w.id, w.msg, w.hint) for w in warnings] == [
        ("gen_durable.W006", f"Runnable rows wait in queue 'emials' (2 rows, e.g. id {min(typo)}), which "
                             "GEN_DURABLE['QUEUES'] does not name.",
         "Did you mean 'emails'? A misspelt queue= at insert: move those rows to the right queue (the admin's "
         "\"Move selected instances to a queue\", or `manage.py durable_bulk move --queue emials --to-queue emails`). "
         "If the queue is meant to exist, add it to QUEUES (or run a worker with --queue for it)."),
    ]
    assert checks.check_runnable_queues() == []  # only with --database


@pytest.mark.parametrize("overrides, needle", [
    ({"CONCURRENCY_LIMITS": {"pdf:a": {"limit": 2}}}, "CONCURRENCY_LIMITS']['pdf:a'] is not a valid name"),
    ({"RATE_LIMITS": {"api:x": {"allowed": 1, "period": 1}}}, "RATE_LIMITS']['api:x'] is not a valid name"),
    ({"CONCURRENCY_LIMITS": {"": {"limit": 2}}}, "CONCURRENCY_LIMITS'][''] is not a valid name"),
    ({"CONCURRENCY_LIMITS": {5: {"limit": 2}}}, "CONCURRENCY_LIMITS'][5] is not a valid name"),
    ({"CONCURRENCY_LIMITS": {"pdf": {"limit": 2, "shards": 5}}}, "['shards'] (5) exceeds its 'limit' (2)"),
    ({"CONCURRENCY_LIMITS": {"pdf": {"limit": 2**53 + 1}}}, "['limit'] exceeds 2**53"),
    ({"RATE_LIMITS": {"a": {"allowed": float("inf"), "period": 1}}}, "['a']: allowed must be finite"),
    ({"RATE_LIMITS": {"a": {"allowed": 5, "period": 1, "burst": float("inf")}}}, "['a']: burst must be finite"),
], ids=["gate-colon", "rate-colon", "gate-empty", "gate-int", "shards-above-limit", "limit-huge",
        "allowed-inf", "burst-inf"])
def test_limits_that_could_never_apply_are_rejected(overrides, needle):
    """A name is matched against the part of a key before its first ':' — a name with a
    ':' (or not a non-empty str) never matches a row, so its limit was silently ignored;
    a gate's shards beyond its limit were silently clamped; a limit the float8 counters
    cannot hold crashed the admission; an infinite rate or burst crashed every Redis
    admission (the bucket's expiry is burst / rate)."""
    from gen_durable.limiter.config import parse
    from django.core.exceptions import ImproperlyConfigured

    with override_settings(GEN_DURABLE=overrides):
        messages = checks.check_limits()
    assert [m.id for m in messages] == ["gen_durable.E007"]
    assert needle in messages[0].msg
    with pytest.raises(ImproperlyConfigured):
        parse(overrides.get("RATE_LIMITS"), overrides.get("CONCURRENCY_LIMITS"))


@pytest.mark.django_db
def test_queues_that_cannot_fit_max_connections_are_an_error_with_database(settings):
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW max_connections")
        limit = int(cur.fetchone()[0])
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "QUEUES": {"default": limit}}
    (error,) = checks.check_connection_budget(databases=["default"])
    assert error.id == "gen_durable.E031"
    need = int(error.msg.split("needs up to ", 1)[1].split()[0])
    assert need > limit  # the step threads alone take every slot, the roles come on top
    assert f"1 process(es) × ({limit} step threads + 2 for async steps + 1 feeder (one per queue) + 1 flusher" in error.msg
    assert f"max_connections {limit}" in error.msg and "--processes" not in error.msg
    assert checks.check_connection_budget() == []  # only with --database
    settings.GEN_DURABLE = {**settings.GEN_DURABLE, "QUEUES": {"default": 4}}
    assert checks.check_connection_budget(databases=["default"]) == []


@override_settings(CONCURRENCY_LIMITS={"erp": {"limit": 2}}, QUEUES={"x": 1}, GEN_DURABLE={"LEASE_TTL": 30})
def test_a_gen_durable_key_written_as_a_top_level_setting_is_a_warning():
    """The README's keys belong inside GEN_DURABLE; at the top level nobody reads them.
    Generic names another app may own (QUEUES here) are not flagged."""
    assert [(w.id, w.msg) for w in checks.check_setting_name()] == [
        ("gen_durable.W005", "The Django setting 'CONCURRENCY_LIMITS' is a key of GEN_DURABLE; gen_durable does "
                             "not read it at the top level."),
    ]


def test_a_misspelt_limit_key_is_named_beside_the_missing_limit():
    with override_settings(GEN_DURABLE={"CONCURRENCY_LIMITS": {"erp": {"limt": 2}}}):
        msgs = [e.msg for e in checks.check_limits()]
    assert msgs == ["GEN_DURABLE['CONCURRENCY_LIMITS']['erp'] needs 'limit', a positive int.",
                    "GEN_DURABLE['CONCURRENCY_LIMITS']['erp'] has an unknown key 'limt'."]


@pytest.mark.django_db
def test_an_unserved_queue_is_counted_only_up_to_the_cap(monkeypatch):
    """The W006 count stops at QUEUE_SAMPLE_CAP (the scan reads at most cap + 1 index
    entries of the queue, whatever its size) and says so."""
    import gen_durable as gd
    from tests.durable_app.durable import Plain

    monkeypatch.setattr(checks, "QUEUE_SAMPLE_CAP", 3)
    ids = gd.insert_all([gd.Spec(Plain, queue="stranded-q") for _ in range(5)])
    few = gd.insert(Plain, queue="stranded-r")
    found = {q: (n, example) for q, n, example in checks.unserved_queues({"default"}) if q.startswith("stranded-")}
    assert found["stranded-q"][0] == 4  # cap + 1: "more than the cap"
    assert found["stranded-q"][1] in ids
    assert found["stranded-r"] == (1, few)
    assert checks.describe_stranded([("stranded-q", *found["stranded-q"])], 3).startswith("stranded-q (3+ rows, e.g. id ")


@contextlib.contextmanager
def _registered_for_the_test(*names):
    """Machines a test declares, taken out of the process-wide registry afterwards (other
    tests run `manage.py check`, which would report them)."""
    from gen_durable import registry

    try:
        yield
    finally:
        for name in names:
            registry._machines.pop((name, 1), None)
            registry._known = None


def test_a_literal_step_name_no_step_of_its_machine_has_is_e120_naming_the_line():
    import gen_durable as gd
    from gen_durable import outcomes

    with _registered_for_the_test("tests.e120.Order"):
        class Order(gd.Machine):
            name = "tests.e120.Order"

            @gd.step
            def start(self, ctx):
                if ctx.state.get("wait"):
                    return gd.Await("paid", next="finsh", timeout=60)
                return outcomes.Next("chrage")  # the module.Name form resolves too

            @gd.step
            def charge(self, ctx):
                return gd.Next(ctx.state["to"])  # built at run time: not seen

            @gd.step
            def finish(self, ctx):
                return gd.Next("charge")  # a step it has: fine

            def handle(self, error, ctx):
                return gd.ScheduleChildren(next="finnish", children=[])

        errors = [e for e in checks.check_outcome_steps() if e.obj is Order]
    assert [e.id for e in errors] == ["gen_durable.E120"] * 3
    messages = sorted(e.msg for e in errors)
    assert messages[0].startswith("tests.e120.Order.handle returns ScheduleChildren('finnish') (")
    assert messages[0].endswith("but tests.e120.Order has no step 'finnish'; did you mean 'finish'?")
    assert "tests.e120.Order.start returns Await('finsh')" in messages[1] and "did you mean 'finish'?" in messages[1]
    assert "tests.e120.Order.start returns Next('chrage')" in messages[2] and "did you mean 'charge'?" in messages[2]
    line = inspect.getsourcelines(Order.start)[1] + 4  # from its decorator line
    assert f"tests/unit/test_checks.py:{line})" in messages[2]


def test_e120_names_a_method_that_lacks_its_step_decorator():
    import gen_durable as gd

    with _registered_for_the_test("tests.e120.Forgot"):
        class Forgot(gd.Machine):
            name = "tests.e120.Forgot"

            @gd.step
            def start(self, ctx):
                return gd.Next("ship")

            def ship(self, ctx):  # no @gd.step
                return gd.Done()

        (error,) = [e for e in checks.check_outcome_steps() if e.obj is Forgot]
    assert error.msg.endswith("has no step 'ship'; tests.e120.Forgot.ship is a method but not a step: "
                              "decorate it with @gd.step.")


def test_an_outcome_class_of_another_library_named_next_is_not_e120():
    import gen_durable as gd

    class Next:  # not gen_durable's: its argument is no step name
        def __init__(self, page):
            self.page = page

    with _registered_for_the_test("tests.e120.Pager"):
        class Pager(gd.Machine):
            name = "tests.e120.Pager"

            @gd.step
            def start(self, ctx):
                Next("page-2")
                return gd.Done()

        assert [e for e in checks.check_outcome_steps() if e.obj is Pager] == []
    with _registered_for_the_test("tests.e120.Shadow"):
        class Shadow(gd.Machine):
            name = "tests.e120.Shadow"

            @gd.step
            def start(self, ctx):
                GdNext = lambda page: page  # noqa: E731, N806  (a local shadowing the module's name)
                GdNext("page-2")
                return gd.Next("start")

        assert [e for e in checks.check_outcome_steps() if e.obj is Shadow] == []
    # A name the function's globals do not know at all is not guessed at either.
    from gen_durable.source_steps import literal_step_names

    assert literal_step_names(lambda: Undefined("x")) == []  # noqa: F821


class _Raises:
    def __getattr__(self, name):
        raise RuntimeError("a lazy object that cannot be read here")


_LAZY = _Raises()

_TABLE = {"rows": []}


def test_e120_reads_code_it_cannot_resolve_without_failing_the_check():
    """`manage.py check` must never die reading a step: an attribute whose lookup raises,
    an unhashable attribute, no source at all (a class made by exec) are skipped."""
    import gen_durable as gd

    with _registered_for_the_test("tests.e120.Odd", "tests.e120.Exec"):
        class Odd(gd.Machine):
            name = "tests.e120.Odd"

            @gd.step
            def start(self, ctx):
                _LAZY.anything("x")
                _TABLE.get("rows")
                return gd.Next("start")

        namespace = {"gd": gd}
        exec("class Exec(gd.Machine):\n    name = 'tests.e120.Exec'\n\n    @gd.step\n"
             "    def start(self, ctx):\n        return gd.Next('nowhere')\n", namespace)
        errors = [e for e in checks.check_outcome_steps() if e.obj in (Odd, namespace["Exec"])]
    assert errors == []
