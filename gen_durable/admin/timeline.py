"""The timeline of one instance (docs/admin.md "Timeline", docs/design.md#history).

Two sources, merged newest first: the worker's entries (gen_durable_history, one per
attempt that committed: step, attempt, outcome, error, worker, start and end) and the
admin's own log (django.contrib.admin's LogEntry: who cancelled, retried or signalled
it, and why). Two bounded queries whatever either holds: the newest `limit` of each.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ..models import HistoryEntry, Instance

TIMELINE_LIMIT = 50  # entries shown on the detail page, newest first


@dataclass(frozen=True)
class Event:
    """One line of the timeline: an attempt (`entry`) or an admin action (`log`)."""

    at: datetime  # when it ended (an attempt) or was done (an admin action)
    entry: HistoryEntry | None = None
    log: object = None  # django.contrib.admin.models.LogEntry


def timeline(instance_id: int, using: str | None = None, limit: int = TIMELINE_LIMIT) -> list[Event]:
    """The newest `limit` events of instance `instance_id`, newest first.

    using: the database the instance lives on (its history is there); the admin log is
    on Django's default database and keys an entry by the bare id, so only the entries
    of this database are merged: those marked with it (site.database_mark) for another
    database, the unmarked ones for the default. Statements: one per source (the
    history's through gen_durable_history_instance), plus Django's cached content-type
    lookup once.
    """
    from django.contrib.admin.models import LogEntry
    from django.contrib.contenttypes.models import ContentType

    from ..conf import database_alias
    from .site import DATABASE_MARK, database_mark

    alias = using or database_alias()
    entries = list(HistoryEntry.objects.using(alias).filter(instance_id=instance_id).order_by("-id")[:limit])
    content_type = ContentType.objects.get_for_model(Instance)
    logs = LogEntry.objects.filter(content_type=content_type, object_id=str(instance_id))
    mark = database_mark(alias)
    logs = logs.filter(change_message__startswith=mark) if mark else logs.exclude(
        change_message__startswith=DATABASE_MARK)
    logs = list(logs.select_related("user").order_by("-action_time", "-id")[:limit])
    events = [Event(e.finished_at, entry=e) for e in entries] + [Event(g.action_time, log=g) for g in logs]
    events.sort(key=lambda ev: ev.at, reverse=True)
    return events[:limit]


OUTCOME_LABELS = {"next": "next step", "inline": "next step (inline)", "retry": "retry", "await": "awaits signals",
                  "schedule": "spawned children", "done": "done", "failed": "failed",
                  "lost": "lost (no outcome: the worker died or its lease lapsed)",
                  "abandoned": "abandoned (the worker shut down while it ran)"}


def compact_time(value, timespec: str = "seconds") -> str:
    """`MM-DD HH:MM:SS` in the current time zone, the whole timestamp (to `timespec`) in
    the title; "—" for None. Also the instances list's time columns (site.py)."""
    if value is None:
        return "—"
    local = timezone.localtime(value)
    return format_html('<span title="{}">{}</span>', local.isoformat(sep=" ", timespec=timespec),
                       local.strftime("%m-%d %H:%M:%S"))


def full_time(field: str):
    """A read-only admin display of datetime `field`: `YYYY-MM-DD HH:MM:SS±HH:MM` in the
    current time zone, "—" for None; labelled as the model field is."""
    from django.contrib import admin

    def show(self, obj):
        value = getattr(obj, field)
        return "—" if value is None else timezone.localtime(value).isoformat(sep=" ", timespec="seconds")

    show.__name__ = f"{field}_full"
    return admin.display(description=field.replace("_", " "), ordering=field)(show)


def _time(value) -> str:
    return compact_time(value, timespec="milliseconds")


def _duration(entry: HistoryEntry) -> str:
    if entry.started_at is None:
        return "—"
    seconds = max((entry.finished_at - entry.started_at).total_seconds(), 0.0)
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def _row(ev: Event):
    e, g = ev.entry, ev.log
    if e is not None:
        outcome = OUTCOME_LABELS.get(e.outcome, e.outcome)
        what = format_html('step <code>{}</code> attempt {} → <span class="gd-outcome gd-outcome-{}">{}</span>',
                           e.step, e.attempt, e.outcome, outcome)
        return ("gd-attempt", _time(ev.at), what, e.worker or "—", _duration(e), e.error or "")
    user = getattr(g.user, "get_username", lambda: "?")() if g.user_id else "—"
    return ("gd-admin", _time(ev.at), format_html("<strong>admin</strong> {}", user), "—", "—",
            g.get_change_message())


# The admin's LogEntry of a run on "all matching" has no object id (one summary per run),
# and calls made in code or a shell write no LogEntry: say so rather than let the
# timeline look complete (docs/admin.md "Timeline").
NOT_LISTED = ("Bulk (all matching) admin runs and calls made outside the admin (gd.cancel, gd.retry, "
              "gd.signal, gd.cancel_where / retry_where / move_where, manage.py durable_bulk) are not listed "
              "here; see the admin's Recent actions for the former.")


def timeline_html(instance_id: int, using: str | None = None, limit: int = TIMELINE_LIMIT) -> str:
    """The timeline as the detail page's table (docs/admin.md "Timeline")."""
    events = timeline(instance_id, using, limit)
    note = format_html('<p class="help" id="gd-timeline-not-listed">{}</p>', NOT_LISTED)
    if not events:
        return format_html("no entries (none written yet, or HISTORY is off){}", note)
    body = format_html_join("", '<tr class="{}"><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
                                '<td><pre class="gd-error-text">{}</pre></td></tr>', (_row(ev) for ev in events))
    more = (format_html('<p class="gd-more">the newest {} shown</p>', limit) if len(events) >= limit else "")
    return format_html('<table class="gd-inline" id="gd-timeline"><thead><tr><th>ended</th><th>what</th>'
                       "<th>worker</th><th>took</th><th>error / message</th></tr></thead><tbody>{}</tbody></table>{}{}",
                       body, more, note)
