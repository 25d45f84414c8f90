"""Cron schedules: validation, DST semantics, exactly one instance per tick, catch-up."""

import datetime as dt
import threading
from zoneinfo import ZoneInfo

import pytest
from django.core.checks import run_checks
from django.db import connection, connections
from django.test import override_settings

import gen_durable as gd
from gen_durable import registry, schedules
from gen_durable.models import Instance, ScheduleState
from gen_durable.schedules import Schedule, fire_due, overview, sync, tick_key
from tests.conftest import wait_until

PARIS = ZoneInfo("Europe/Paris")


def paris(*args, fold=0):
    return dt.datetime(*args, tzinfo=PARIS, fold=fold)


def ticks(s, start, n):
    out, t = [], start
    for _ in range(n):
        t = s.next_after(t)
        out.append(t)
    return out


# --- DST (cronsim follows Debian cron) ----------------------------------------------

def test_spring_forward_a_fixed_time_in_the_skipped_hour_runs_at_the_first_valid_time():
    daily = Schedule("d", "30 2 * * *", "tests.Plain", "Europe/Paris")
    got = ticks(daily, paris(2026, 3, 28, 12), 3)
    assert [t.isoformat() for t in got] == [
        "2026-03-29T03:00:00+02:00",  # 02:30 does not exist that night
        "2026-03-30T02:30:00+02:00", "2026-03-31T02:30:00+02:00"]
    hourly = Schedule("h", "0 * * * *", "tests.Plain", "Europe/Paris")
    got = [t.isoformat() for t in ticks(hourly, paris(2026, 3, 29, 0, 30), 3)]
    assert got == ["2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00"]


def test_fall_back_a_fixed_time_in_the_repeated_hour_runs_once_a_wildcard_hour_twice():
    daily = Schedule("d", "30 2 * * *", "tests.Plain", "Europe/Paris")
    got = [t.isoformat() for t in ticks(daily, paris(2026, 10, 24, 12), 2)]
    assert got == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]  # once, the first 02:30
    hourly = Schedule("h", "0 * * * *", "tests.Plain", "Europe/Paris")
    got = [t.isoformat() for t in ticks(hourly, paris(2026, 10, 25, 0, 30), 4)]
    assert got == ["2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00",
                   "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"]  # every real hour
    # Distinct instants, so distinct per-tick keys: both 02:00s fire, each once.
    assert len({hourly.correlation_key(t) for t in ticks(hourly, paris(2026, 10, 25, 0, 30), 4)}) == 4


def test_the_tick_after_an_instant_in_the_repeated_hour_is_after_it():
    """From the second pass of 01:00-03:00 (CET, fold=1) the next tick is after that
    instant, never the first pass's (CEST) tick 40 minutes earlier: a schedule planned
    then (start-up, a changed schedule) would fire at once a tick from before it existed."""
    second_pass = paris(2026, 10, 25, 2, 10, fold=1)  # 01:10 UTC
    assert second_pass.utcoffset() == dt.timedelta(hours=1)
    daily = Schedule("d", "30 2 * * *", "tests.Plain", "Europe/Paris")
    assert daily.next_after(second_pass).isoformat() == "2026-10-26T02:30:00+01:00"  # 02:30 ran at 00:30 UTC
    hourly = Schedule("h", "0 * * * *", "tests.Plain", "Europe/Paris")
    assert hourly.next_after(second_pass).isoformat() == "2026-10-25T03:00:00+01:00"
    half = Schedule("q", "*/30 * * * *", "tests.Plain", "Europe/Paris")
    assert half.next_after(second_pass).isoformat() == "2026-10-25T02:30:00+01:00"  # the second 02:30
    first_pass = paris(2026, 10, 25, 2, 10)  # 00:10 UTC: unchanged
    utc = [s.next_after(first_pass).astimezone(dt.timezone.utc).isoformat() for s in (daily, hourly, half)]
    assert utc == ["2026-10-25T00:30:00+00:00", "2026-10-25T01:00:00+00:00", "2026-10-25T00:30:00+00:00"]


def test_catch_up_after_a_long_outage_finds_the_latest_tick_without_walking_every_one():
    s = Schedule("m", "* * * * *", "tests.Plain", "UTC")
    first = dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    now = dt.datetime(2026, 6, 1, 12, 0, 30, tzinfo=dt.timezone.utc)
    latest, nxt = s.latest_at_or_before(first, now)
    assert (latest.isoformat(), nxt.isoformat()) == ("2026-06-01T12:00:00+00:00", "2026-06-01T12:01:00+00:00")


# --- validation ---------------------------------------------------------------------

def e021(settings_schedules):
    with override_settings(GEN_DURABLE={"SCHEDULES": settings_schedules}):
        return [e.msg for e in run_checks() if e.id == "gen_durable.E021"]


def test_checks_name_the_bad_entry():
    ok = {"cron": "0 3 * * *", "machine": "tests.Plain"}
    assert e021({"fine": ok}) == []
    assert any("'nightly'" in m and "bad cron expression" in m for m in e021({"nightly": {**ok, "cron": "61 * * * *"}}))
    assert any("'nightly'" in m and "unknown machine 'nope.Nope'" in m
               for m in e021({"nightly": {**ok, "machine": "nope.Nope"}}))
    assert any("'nightly'" in m and "unknown timezone 'Mars/Olympus'" in m
               for m in e021({"nightly": {**ok, "timezone": "Mars/Olympus"}}))
    assert any("catch_up" in m for m in e021({"nightly": {**ok, "catch_up": "all"}}))
    assert any("unknown key 'crn'" in m for m in e021({"nightly": {**ok, "crn": "x"}}))
    assert any("cannot be stored" in m for m in e021({"nightly": {**ok, "state": {"x": object()}}}))
    with override_settings(GEN_DURABLE={"SCHEDULES": ["x"]}):
        assert "gen_durable.E021" in [e.id for e in run_checks()]


def test_a_machine_class_schedules_itself():
    class Nightly(gd.Machine):
        name = "tests.sched.Nightly"
        schedule = {"cron": "0 3 * * *", "timezone": "Europe/Paris", "state": {"report": True}}

        @gd.step
        def start(self, ctx):
            return gd.Done({})

    try:
        got = schedules.configured()["tests.sched.Nightly"]
        assert (got.machine, got.cron, got.timezone, got.catch_up, got.state) == \
            ("tests.sched.Nightly", "0 3 * * *", "Europe/Paris", "skip", {"report": True})
        Nightly.schedule = {"cron": "0 3 * *"}
        assert any("Nightly.schedule" in m and "bad cron" in m for m in e021({}))
    finally:
        registry._machines.pop(("tests.sched.Nightly", 1), None)


# --- firing -------------------------------------------------------------------------

def minutely(name, catch_up="skip"):
    return {name: Schedule(name, "* * * * *", "tests.Plain", "UTC", catch_up, {"from": name})}


def yearly(name, catch_up="skip"):
    """Missed ticks that are all far older than the misfire grace."""
    return {name: Schedule(name, "0 0 1 1 *", "tests.Plain", "UTC", catch_up, {"from": name})}


def set_next(name, sql_instant):
    with connection.cursor() as cur:
        cur.execute(f"UPDATE gen_durable_schedules SET next_run_at = {sql_instant} WHERE name = %s", [name])


@pytest.mark.django_db(transaction=True)
def test_racing_processes_fire_a_tick_exactly_once(clean_tables):
    """Eight threads (own connections) fire the same due tick at once: one instance."""
    with connection.cursor() as cur:
        cur.execute("TRUNCATE gen_durable_schedules")
    cron = minutely("race")
    sync(cron)
    set_next("race", "date_trunc('minute', now())")
    barrier, results = threading.Barrier(8), []

    def racer():
        barrier.wait()
        results.append(fire_due(cron))
        connections.close_all()

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    fired = [f for r in results for f in r if f[2] is not None]
    assert len(fired) == 1
    assert Instance.objects.filter(fsm="tests.Plain").count() == 1
    row = ScheduleState.objects.get(name="race")
    assert row.last_instance_id == fired[0][2] and row.next_run_at > row.last_tick_at
    # The tick's key stays reserved through done/failed: even a reset schedule row
    # cannot fire that tick again.
    Instance.objects.filter(id=fired[0][2]).update(status="done")
    set_next("race", f"'{row.last_tick_at.isoformat()}'::timestamptz")
    assert fire_due(cron) == [("race", None, None)]
    assert Instance.objects.filter(fsm="tests.Plain").count() == 1
    with connection.cursor() as cur:
        cur.execute("TRUNCATE gen_durable_schedules")


@pytest.mark.django_db
def test_skip_policy_drops_missed_ticks_and_moves_on(events):
    cron = yearly("skipper")
    sync(cron)
    set_next("skipper", "'2020-01-01 00:00+00'")  # seven ticks missed
    assert fire_due(cron) == [("skipper", None, None)]
    row = ScheduleState.objects.get(name="skipper")
    assert row.last_instance_id is None and row.next_run_at > dt.datetime.now(dt.timezone.utc)
    assert not Instance.objects.filter(fsm="tests.Plain").exists()
    assert [e for e, _, m in events if e == "schedule.skipped" and m["schedule"] == "skipper"]


@pytest.mark.django_db
def test_latest_policy_fires_the_latest_missed_tick_once_never_a_burst():
    cron = yearly("latest", catch_up="latest")
    sync(cron)
    set_next("latest", "'2020-01-01 00:00+00'")  # seven ticks missed
    [(name, tick, id_)] = fire_due(cron)
    assert Instance.objects.filter(fsm="tests.Plain").count() == 1  # one, not seven
    assert (tick.month, tick.day, tick.year) == (1, 1, dt.datetime.now(dt.timezone.utc).year)
    inst = Instance.objects.get(id=id_)
    assert inst.state == {"from": "latest"} and inst.correlation_key == cron["latest"].correlation_key(tick)
    assert fire_due(cron) == []  # advanced past now
    ov = {o["name"]: o for o in overview_of(cron)}
    assert ov["latest"]["last_tick"] == tick and ov["latest"]["last_instance_id"] == id_


def overview_of(cron):
    with override_settings(GEN_DURABLE={"SCHEDULES": {n: {"cron": s.cron, "machine": s.machine, "timezone": s.timezone,
                                                          "catch_up": s.catch_up} for n, s in cron.items()}}):
        return overview()


@pytest.mark.django_db
def test_sync_keeps_the_next_tick_and_replans_a_changed_expression():
    cron = minutely("keep")
    sync(cron)
    set_next("keep", "now() - interval '1 hour'")
    before = ScheduleState.objects.get(name="keep").next_run_at
    sync(cron)  # another process starting: unchanged
    assert ScheduleState.objects.get(name="keep").next_run_at == before
    sync({"keep": Schedule("keep", "0 3 * * *", "tests.Plain", "UTC")})
    assert ScheduleState.objects.get(name="keep").next_run_at.hour == 3


SECONDLY = {"every2s": {"cron": "*/2 * * * * *", "machine": "tests.Plain", "state": {"s": 1}, "timezone": "UTC"}}


@pytest.mark.django_db(transaction=True)
def test_two_workers_fire_each_tick_once_on_time(engine, queue_name, clean_tables):
    """Two worker processes (supervisors) share a two-second schedule: every tick fires
    once, from whichever timer gets there first, and none is missed."""
    with connection.cursor() as cur:
        cur.execute("TRUNCATE gen_durable_schedules")
    with override_settings(GEN_DURABLE={"SCHEDULES": SECONDLY, "POLL_INTERVAL": 0.05, "MAX_POLL_INTERVAL": 0.2,
                                        "LEASE_TTL": 3, "HEARTBEAT_INTERVAL": 0.5}):
        a = engine({"default": 2})
        b = engine({"default": 2})
        assert a.cron and b.cron
        wait_until(lambda: Instance.objects.filter(fsm="tests.Plain", status="done").count() >= 3,
                   timeout=20, what="three ticks fired and ran")
        a.stop(), b.stop()
    keys = list(Instance.objects.filter(fsm="tests.Plain").values_list("correlation_key", flat=True))
    assert len(keys) == len(set(keys))
    got = sorted(dt.datetime.fromisoformat(k.split(":", 2)[2]) for k in keys)
    assert all((y - x).total_seconds() == 2 for x, y in zip(got, got[1:]))  # none missed, none doubled
    row = ScheduleState.objects.get(name="every2s")
    assert row.last_tick_at == got[-1]
    with connection.cursor() as cur:
        cur.execute("TRUNCATE gen_durable_schedules")


@pytest.mark.django_db
def test_admin_overview_lists_schedules_with_next_and_last_run(admin_client):
    from django.urls import reverse

    cfg = {"nightly": {"cron": "0 3 * * *", "machine": "tests.Plain", "timezone": "Europe/Paris"}}
    with override_settings(GEN_DURABLE={"SCHEDULES": cfg}):
        url = reverse("admin:gen_durable_queueoverview_changelist")
        body = admin_client.get(url).content.decode()
        assert 'id="gd-schedule-nightly"' in body and "no worker has started it yet" in body and "never" in body
        cron = schedules.configured()
        sync(cron)
        set_next("nightly", "now() - interval '1 second'")
        [(_, tick, id_)] = fire_due(cron)
        body = admin_client.get(url).content.decode()
    row = body.split('id="gd-schedule-nightly"')[1].split("</tr>")[0]
    assert "<code>0 3 * * *</code>" in row and "Europe/Paris" in row and f"#{id_}" in row
    assert ">never<" not in row and " 03:00:00 CE" in row  # the next run, 03:00 Paris time


# --- long names ---------------------------------------------------------------------

def test_a_schedule_name_over_the_limit_is_a_check_error():
    """A 300-character name is refused by E021 (it passed the check and then failed
    every tick: its key did not fit the column)."""
    ok = {"cron": "0 3 * * *", "machine": "tests.Plain"}
    [message] = e021({"n" * 300: ok})
    assert "300 characters long; the limit is 255" in message
    assert e021({"n" * 255: ok}) == []


def test_a_schedule_name_with_a_nul_is_a_check_error():
    """A NUL passed the check; the sync then failed and disabled every schedule of the process."""
    ok = {"cron": "0 3 * * *", "machine": "tests.Plain"}
    [message] = e021({"s\x00": ok, "fine": ok})
    assert "the schedule name contains a NUL character" in message


def test_every_valid_name_gets_a_tick_key_that_fits_and_stays_distinct():
    tick = dt.datetime(2026, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc)  # the longest stamp
    short = Schedule("nightly", "0 3 * * *", "tests.Plain", "UTC")
    assert short.correlation_key(tick) == "schedule:nightly:2026-12-31T23:59:59.999999+00:00"  # unchanged
    names = ["a" * 255, "a" * 254 + "b", "é" * 255, "a" * 220]
    keys = {tick_key(n, tick) for n in names}
    assert len(keys) == len(names) and all(len(k) <= 255 for k in keys)
    assert tick_key("a" * 255, tick) != tick_key("a" * 255, tick + dt.timedelta(minutes=1))


@pytest.mark.django_db
def test_a_schedule_with_a_long_name_fires():
    """Negative control of the failure the issue saw: the plain key of this name is longer
    than 255 characters (insert would refuse it); the derived one is inserted."""
    name = "long-" + "x" * 245
    cron = {name: Schedule(name, "* * * * *", "tests.Plain", "UTC", "skip", {"from": "long"})}
    sync(cron)
    set_next(name, "date_trunc('minute', now())")
    [(got, tick, id_)] = fire_due(cron)
    assert tick is not None and id_ is not None
    assert len(f"schedule:{name}:{tick.astimezone(dt.timezone.utc).isoformat()}") > 255
    assert Instance.objects.get(id=id_).correlation_key == cron[name].correlation_key(tick)
    assert ScheduleState.objects.get(name=name).last_error is None


def test_machine_schedule_declaration_rejects_what_can_never_fire():
    with pytest.raises(gd.InvalidInput, match="300 characters long; the limit is 255"):
        class TooLong(gd.Machine):
            name = "m" * 300
            schedule = {"cron": "0 3 * * *"}

            @gd.step
            def start(self, ctx):
                return gd.Done({})
    with pytest.raises(gd.InvalidInput, match="bad cron expression"):
        class BadCron(gd.Machine):
            name = "tests.sched.BadCron"
            schedule = {"cron": "61 * * * *"}

            @gd.step
            def start(self, ctx):
                return gd.Done({})
    with pytest.raises(gd.InvalidInput, match="needs 'cron'"):
        class NoCron(gd.Machine):
            name = "tests.sched.NoCron"
            schedule = {}

            @gd.step
            def start(self, ctx):
                return gd.Done({})
    assert ("m" * 300, 1) not in registry._machines and ("tests.sched.BadCron", 1) not in registry._machines
