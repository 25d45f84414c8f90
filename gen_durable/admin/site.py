"""The ModelAdmins registered on Django's admin site: instances, inboxes, limiter tables,
the queue overview's page; the package's docstring (gen_durable/admin/__init__.py) says
what they promise at scale."""

from __future__ import annotations

import json
import re
import uuid

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.db.models.functions import Substr
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from .. import bulk, calls, db, queues, registry, sql
from ..conf import database_alias, get_settings
from ..exceptions import DuplicateInstance, GenDurableError, InvalidInput, NoTarget, NotRetryable
from ..limiter.base import EPSILON
from ..limiter.config import get_limits
from ..models import Bucket, BucketConfig, Instance, QueueOverview, Signal
from ..outcomes import MAX_NAME_LENGTH, MAX_REASON_LENGTH
from ..statuses import Status
from . import overview
from .paging import CAP, EstimatedCountPaginator
from .timeline import compact_time, full_time

INLINE_LIMIT = 20  # newest inbox rows / children shown on the detail page
MAX_ACTION_ROWS = 1000  # one action confirms and applies at most this many instances
# "All matching" actions: one POST runs at most this many batches of ALL_BATCH ids
# (bulk.run_window), then offers to continue — a request never runs for minutes.
ALL_BATCH = 1000
ALL_BATCHES_PER_REQUEST = 5
# Changelist parameters an "all matching" action translates into a bulk filter, and
# those that narrow nothing (paging, ordering, facets, the database selector).
ALL_FILTERS = ("status", "queue", "machine")
ALL_IGNORED = ("p", "o", "_facets", "database", "e")
# What the result page's URL (POST/redirect/GET) carries besides the filter: the run's
# token (its counts, kept in the session) and where to continue from.
ALL_RESULT = ("run", "after", "top")
ALL_RESULTS_KEPT = 10  # results of the last runs kept in the session for their pages
BIGINT = 2**63


def safe_next(request, back, default):
    """`back` (a ?next= URL) if it stays on this site, else `default`: "//host/x" or
    "https://elsewhere" would make the admin an open redirect."""
    if back and url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()},
                                                require_https=request.is_secure()):
        return back
    return default


def _pretty(value):
    if value is None:
        return "—"
    return format_html("<pre class=\"gd-json\">{}</pre>",
                       json.dumps(value, indent=2, sort_keys=True, cls=DjangoJSONEncoder, ensure_ascii=False))


def _limits(key):
    """The configured limits to explain `key` with; None for no key, or while the limits
    are malformed (check E007 says why)."""
    if key is None:
        return None
    try:
        return get_limits()
    except ImproperlyConfigured:
        return None


def _exact_id(term: str):
    term = term.strip().lstrip("#")
    if term.isdigit() and int(term) < BIGINT:
        return int(term)
    return None


# --- filters: choices from configuration and registry --------------------------------
def engine_aliases() -> list[str]:
    """The aliases the admin offers in its database selector: GEN_DURABLE['DATABASE'] and
    every alias GEN_DURABLE['DATABASES'] routes to, in that order."""
    routes = get_settings().DATABASES if isinstance(get_settings().DATABASES, dict) else {}
    found = [database_alias()]
    for section in ("MACHINES", "QUEUES"):
        value = routes.get(section)
        for alias in (value.values() if isinstance(value, dict) else ()):
            if isinstance(alias, str) and alias not in found:
                found.append(alias)
    return found


def request_alias(request) -> str:
    """The database alias a page works on: `?database=ALIAS` (also read from a change
    page's preserved changelist filters, and from a POST), default GEN_DURABLE['DATABASE'].
    Raises Http404 for an alias Django's DATABASES lacks, BadRequest (400) when the
    request names two different aliases."""
    from urllib.parse import parse_qs

    from django.db import connections
    from django.http import Http404

    cached = getattr(request, "_gd_database", None)
    if cached is not None:
        return cached
    named = set(request.GET.getlist("database") + request.POST.getlist("database")) - {""}
    if len(named) > 1:  # which one an action would run on must never be a guess
        from django.core.exceptions import BadRequest

        raise BadRequest(f"one database at a time: the request names {', '.join(sorted(named))}")
    alias = request.GET.get("database") or request.POST.get("database")
    if not alias and request.GET.get("_changelist_filters"):
        alias = (parse_qs(request.GET["_changelist_filters"]).get("database") or [None])[0]
    alias = alias or database_alias()
    if alias not in connections.settings:
        raise Http404(f"no database alias {alias!r} (DATABASES has {', '.join(sorted(connections.settings))})")
    request._gd_database = alias
    return alias


def with_database(url: str, alias: str | None) -> str:
    """`url` with ?database=ALIAS added unless `alias` is the default one."""
    if not alias or alias == database_alias():
        return url
    return url + ("&" if "?" in url else "?") + urlencode({"database": alias})


class DatabaseFilter(admin.SimpleListFilter):
    """The database selector (`?database=ALIAS`): get_queryset reads the alias, so this
    filter narrows nothing itself; it shows the choice and keeps Django's changelist from
    taking `database` for a field lookup."""

    title = "database"
    parameter_name = "database"

    def lookups(self, request, model_admin):
        aliases = engine_aliases()
        current = request_alias(request)
        return [(a, a) for a in aliases + ([current] if current not in aliases else [])]

    def has_output(self):
        return len(self.lookup_choices) > 1

    def choices(self, changelist):
        current = self.value() or database_alias()
        for value, title in self.lookup_choices:
            yield {"selected": value == current, "query_string": changelist.get_query_string(
                {self.parameter_name: value}), "display": title}

    def queryset(self, request, queryset):
        return queryset


class EqualityFilter(admin.SimpleListFilter):
    """A filter on one column's equality (an index lookup); choices come from settings
    and the registry, never from `SELECT DISTINCT` over the table."""

    field = ""

    def queryset(self, request, queryset):
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class StatusFilter(EqualityFilter):
    title = parameter_name = field = "status"

    def lookups(self, request, model_admin):
        return Status.choices

    def queryset(self, request, queryset):
        if self.value() and self.value() not in Status.values:
            # The column is a Postgres enum: an unknown value is an error there, not "no rows".
            raise IncorrectLookupParameters(f"unknown status {self.value()!r}")
        return super().queryset(request, queryset)


class RefusesUnstorableFilters:
    """A changelist whose query string holds a NUL (no text column can hold one, so the
    query would fail in Postgres) answers like Django's for any bad lookup: the list
    again, with `?e=1`'s notice."""

    def changelist_view(self, request, extra_context=None):
        if any("\x00" in value for values in request.GET.lists() for value in values[1]) or \
                any("\x00" in key for key in request.GET):
            return HttpResponseRedirect(request.path + "?" + ERROR_FLAG + "=1")
        return super().changelist_view(request, extra_context)


class QueueFilter(EqualityFilter):
    title = parameter_name = field = "queue"

    def lookups(self, request, model_admin):
        return [(q, q) for q in queues.configured_queues()]


class MachineFilter(EqualityFilter):
    title = parameter_name = "machine"
    field = "fsm"

    def lookups(self, request, model_admin):
        names = sorted({name for (name, _version) in registry.all_machines()})
        return [(n, n) for n in names]


# --- action forms ----------------------------------------------------------------------
class CancelForm(forms.Form):
    reason = forms.CharField(max_length=MAX_REASON_LENGTH, initial="cancelled in the admin",
                             help_text="Stored as the instance's last_error.")


ERROR_COLUMN = 60  # characters of last_error in the instances list
SEARCH_LIMIT = 1000  # rows a correlation-key search lists at most (a key reused by many finished rows)
AUDIT_REASON_HELP = "Optional: why — kept with who and when in the admin log (the instance's History)."


class RetryForm(forms.Form):
    reason = forms.CharField(max_length=MAX_REASON_LENGTH, required=False, help_text=AUDIT_REASON_HELP)


class SignalForm(forms.Form):
    name = forms.CharField(max_length=MAX_NAME_LENGTH, help_text="The signal name an Await waits for.")
    payload = forms.CharField(widget=forms.Textarea(attrs={"rows": 6, "cols": 60}), initial="{}",
                              help_text="JSON (an object, list, string, number, true/false or null).")
    dedup_key = forms.CharField(max_length=MAX_NAME_LENGTH, required=False,
                                help_text="Optional: a redelivery with the same key to the same instance is a no-op.")
    reason = forms.CharField(max_length=MAX_REASON_LENGTH, required=False, help_text=AUDIT_REASON_HELP)

    def clean_payload(self):
        try:
            return json.loads(self.cleaned_data["payload"])
        except ValueError as exc:
            raise forms.ValidationError(f"not valid JSON: {exc}") from None
        except RecursionError:  # json.loads of a deeply nested document
            raise forms.ValidationError("nested too deeply to decode") from None


def _queue_choice(value):
    """A target queue must be declared (settings QUEUES, a machine's queue or EXTRA_QUEUES):
    a typo would strand the rows where no worker looks."""
    name = value.strip()
    try:
        calls.check_queue(name)
    except InvalidInput as exc:
        raise forms.ValidationError(str(exc)) from None
    return name


class MoveForm(forms.Form):
    to_queue = forms.CharField(max_length=MAX_NAME_LENGTH, label="To queue",
                               help_text="A declared queue (GEN_DURABLE['QUEUES'], a machine's queue or "
                                         "EXTRA_QUEUES). Executing and done rows are not moved.")
    reason = forms.CharField(max_length=MAX_REASON_LENGTH, required=False, help_text=AUDIT_REASON_HELP)

    def clean_to_queue(self):
        return _queue_choice(self.cleaned_data["to_queue"])


ACTIONS = {
    "cancel": {"title": "Cancel", "verb": "cancel", "form": CancelForm,
               "help": "Each live instance becomes failed with the reason; a running step's late outcome is dropped."},
    "retry": {"title": "Retry now", "verb": "retry", "form": RetryForm,
              "help": "Failed instances run their current step again with a fresh attempt count; "
                      "instances parked on a signal wake as if their Await timed out; runnable ones "
                      "waiting for a back-off or schedule become due now."},
    "signal": {"title": "Deliver a signal", "verb": "signal", "form": SignalForm,
               "help": "The signal lands in each instance's inbox and wakes it if it awaits that name."},
    "move": {"title": "Move to a queue", "verb": "move", "form": MoveForm,
             "help": "Each instance's next step is claimed by the target queue's workers; executing and done "
                     "instances stay where they are (skipped)."},
}
ALL_MATCHING = ("cancel", "retry", "move")  # what bulk.py can do to every row of a filter


@admin.register(Instance)
class InstanceAdmin(RefusesUnstorableFilters, admin.ModelAdmin):
    # Fits a 1400 px window beside the filters: status carries the seconds running, the
    # time is compact; priority, eligible_at and whole timestamps are on the detail page.
    list_display = ("id", "machine", "step", "status_running", "queue", "attempt", "updated",
                    "correlation_key", "error")
    list_display_links = ("id",)
    list_filter = (DatabaseFilter, StatusFilter, QueueFilter, MachineFilter)
    search_fields = ("=id",)  # shows the search box; get_search_results does exact lookups only
    search_help_text = "An instance id, or an exact correlation key (live, finished or failed instances)."
    ordering = ("-id",)
    sortable_by = ("id",)  # the primary key is the one index every row is in
    show_full_result_count = False
    # Django's "Show counts" (facets) counts every filter choice over the filtered rows:
    # more than 10 minutes at 1,000,000 rows. Off, so every page stays bounded.
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 50
    actions = ("cancel_selected", "retry_selected", "move_selected", "signal_selected")
    change_form_template = "admin/gen_durable/instance/change_form.html"
    change_list_template = "admin/gen_durable/instance/change_list.html"
    fieldsets = (
        (None, {"fields": ("id", "machine", "fsm_version", "step", "status", "queue", "priority", "attempt",
                           "eligible_at_full", "correlation_key", "inserted_at_full", "updated_at_full",
                           "running")}),
        ("State and outcome", {"fields": ("state_pretty", "result_pretty", "last_error_pretty",
                                          "last_traceback_pretty", "attempt_log_pretty")}),
        ("Timeline (newest first)", {"fields": ("timeline",)}),
        ("Lease", {"fields": ("locked_by", "lease_expires_at_full")}),
        ("Waiting", {"fields": ("awaits", "await_deadline_full", "parent_link", "children_pending")}),
        ("Limits", {"fields": ("concurrency_key_info", "concurrency_shard", "rate_limit_info", "weight")}),
        ("Inbox", {"fields": ("inbox",)}),
        ("Children", {"fields": ("children_list",)}),
    )

    # Whole timestamps, to the second, in the current time zone (Django's default format
    # for a read-only field stops at the minute: "Dec. 7, 2026, 9:35 a.m.").
    inserted_at_full = full_time("inserted_at")
    updated_at_full = full_time("updated_at")
    lease_expires_at_full = full_time("lease_expires_at")
    await_deadline_full = full_time("await_deadline")

    # --- read-only everywhere ----------------------------------------------------------
    def get_readonly_fields(self, request, obj=None):
        return [f for fs in self.fieldsets for f in fs[1]["fields"]]

    def get_fieldsets(self, request, obj=None):
        if obj is not None and obj.attempt_log:
            return self.fieldsets
        # Only a Django task's row keeps an attempt log: no empty field beside the timeline.
        return tuple((name, {**opts, "fields": tuple(f for f in opts["fields"] if f != "attempt_log_pretty")})
                     for name, opts in self.fieldsets)

    def has_add_permission(self, request):
        return False  # gd.insert validates against the machine; the admin form could not

    def has_delete_permission(self, request, obj=None):
        return False  # cancel is the safe way to stop an instance

    def get_queryset(self, request):
        qs = super().get_queryset(request).using(request_alias(request))
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == "gen_durable_instance_changelist":
            # The list shows none of the JSON columns; a row's state can be large.
            heavy = [f.name for f in Instance._meta.concrete_fields
                     if f.name in ("state", "result", "last_error", "last_traceback", "attempt_log")]
            # The error column: the first ERROR_COLUMN characters, cut by Postgres (a
            # last_error may be 4,000 characters; a page never ships 50 of them whole).
            qs = qs.defer(*heavy).annotate(error_head=Substr("last_error", 1, ERROR_COLUMN + 1))
        return qs

    def lookup_allowed(self, lookup, value, request=None):
        # "N more children" links filter on the parent (gen_durable_parent index).
        return lookup in ("parent", "parent__id__exact") or super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        from .. import db

        # Every row with this key, live or finished (gen_durable_correlation_key), newest
        # SEARCH_LIMIT. Resolved first, so the list's query is a primary-key lookup: an OR
        # of the two conditions in one WHERE makes the planner walk the whole primary key.
        ids = [r[0] for r in db.fetchall("SELECT id FROM gen_durable WHERE correlation_key = %s "
                                         "ORDER BY id DESC LIMIT %s", (term, SEARCH_LIMIT),
                                         request_alias(request))]
        id_ = _exact_id(term)
        if id_ is not None:
            ids.append(id_)
        return queryset.filter(id__in=ids), False

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        if request.method == "POST":
            return HttpResponseNotAllowed(["GET"])  # nothing here is edited by a form
        extra_context = dict(extra_context or {}, show_save=False, show_save_and_continue=False,
                             show_save_and_add_another=False, show_delete=False,
                             can_act=self.has_change_permission(request) and object_id is not None,
                             title=f"Instance #{object_id}" + (
                                 "" if request_alias(request) == database_alias()
                                 else f" (database {request_alias(request)})"))
        return super().changeform_view(request, object_id, form_url, extra_context)

    # --- detail fields -------------------------------------------------------------------
    _eligible_at = full_time("eligible_at")

    @admin.display(description="eligible at")
    def eligible_at_full(self, obj):
        """eligible_at, or, for a row a worker handed back because it does not know its
        machine, version or step (a rolling deploy; eligible_at then holds the far-future
        value that keeps it out of the pick), what it waits for and since when."""
        if obj.unknown_since is None:
            return self._eligible_at(obj)
        known = registry.knows(obj.fsm, obj.fsm_version, obj.step)
        return format_html(
            '<span class="gd-warn">waiting for a worker that knows {} v{} (step {})</span>, since {}: a worker '
            'handed it back untouched; {}',
            obj.fsm, obj.fsm_version, obj.step,
            timezone.localtime(obj.unknown_since).isoformat(sep=" ", timespec="seconds"),
            "this release knows it, so its workers pick it up again within about a second"
            if known else "no class of this release has it (docs/guide.md, \"Deploying\")")

    @admin.display(description="running")
    def running(self, obj):
        """Seconds an executing row's step has been running: since its claim (updated_at,
        which nothing touches while it executes; an inline chain counts from the chain's
        first step). The heartbeat renews the lease, not this. "—" when not executing."""
        return running_text(obj)

    @admin.display(description="status")
    def status_running(self, obj):
        """The status; for an executing row also its seconds running (see `running`)."""
        label = Status(obj.status).label if obj.status in Status.values else obj.status
        if obj.status != "executing":
            return label
        return format_html("{} · {}", label, running_text(obj))

    @admin.display(description="updated")
    def updated(self, obj):
        return compact_time(obj.updated_at)

    @admin.display(description="error")
    def error(self, obj):
        """last_error cut to ERROR_COLUMN characters (the whole text is on the detail page)."""
        text = getattr(obj, "error_head", None)
        if not text:
            return "—"
        short = text if len(text) <= ERROR_COLUMN else text[:ERROR_COLUMN - 1] + "…"
        if obj.status == "done":  # the instance went on and finished: the error is history, not red
            return format_html('<span class="gd-error-earlier" title="an earlier attempt failed: {}">'
                               'earlier attempt: {}</span>', text, short)
        return format_html('<span class="gd-error" title="{}">{}</span>', text, short)

    @admin.display(description="machine")
    def machine(self, obj):
        return obj.fsm

    @admin.display(description="state")
    def state_pretty(self, obj):
        return _pretty(obj.state)

    @admin.display(description="result")
    def result_pretty(self, obj):
        return _pretty(obj.result)

    @admin.display(description="attempt log")
    def attempt_log_pretty(self, obj):
        return _pretty(obj.attempt_log or None)  # Django Tasks: one record per attempt

    @admin.display(description="last error")
    def last_error_pretty(self, obj):
        return format_html("<pre class=\"gd-json\">{}</pre>", obj.last_error) if obj.last_error else "—"

    @admin.display(description="traceback")
    def last_traceback_pretty(self, obj):
        """The last failed attempt's traceback (file, line, code of each frame)."""
        if not obj.last_traceback:
            return "—"
        return format_html("<pre class=\"gd-json gd-traceback\">{}</pre>", obj.last_traceback)

    @admin.display(description="attempts and admin actions")
    def timeline(self, obj):
        """The worker's entries and the admin log of this instance (gen_durable/admin/timeline.py)."""
        from .timeline import timeline_html

        return timeline_html(obj.id, obj._state.db)

    @admin.display(description="concurrency key")
    def concurrency_key_info(self, obj):
        """The key and what governs it here: a configured gate, or K=1."""
        limits = _limits(obj.concurrency_key)
        if limits is None:
            return obj.concurrency_key or "—"
        gate = limits.gate_for(obj.concurrency_key)
        if gate is None:
            return format_html("{} <span class=\"gd-note\">(at most one executing per key)</span>",
                               obj.concurrency_key)
        scope = f"“{gate.name}”" if gate.per == "name" else "this key"
        return format_html("{} <span class=\"gd-note\">(gate {}: at most {} executing for {})</span>",
                           obj.concurrency_key, gate.name, gate.limit, scope)

    @admin.display(description="rate limit")
    def rate_limit_info(self, obj):
        """The rate key; a name RATE_LIMITS does not configure is flagged (the row stalls)."""
        limits = _limits(obj.rate_limit)
        if limits is None:
            return obj.rate_limit or "—"
        rate = limits.rate_for(obj.rate_limit)
        if rate is None:
            return format_html(
                "{} <strong class=\"gd-warning\">not configured in GEN_DURABLE['RATE_LIMITS']: this row is "
                "never admitted (re-offered every minute) until it is</strong>", obj.rate_limit)
        if obj.weight > rate.burst + EPSILON:
            return format_html(
                "{} <strong class=\"gd-warning\">weight {} exceeds the burst {} of this rate limit: this row is "
                "never admitted (re-offered every minute) until the burst is raised</strong>",
                obj.rate_limit, f"{obj.weight:g}", f"{rate.burst:g}")
        return format_html("{} <span class=\"gd-note\">({} per second, burst {})</span>",
                           obj.rate_limit, f"{rate.rate:g}", f"{rate.burst:g}")

    @admin.display(description="parent")
    def parent_link(self, obj):
        if obj.parent_id is None:
            return "—"
        url = with_database(reverse("admin:gen_durable_instance_change", args=[obj.parent_id]), obj._state.db)
        return format_html('<a href="{}">#{}</a>', url, obj.parent_id)

    @admin.display(description="inbox (newest first)")
    def inbox(self, obj):
        alias = obj._state.db  # the database the instance was read from (the page's selector)
        rows = list(Signal.objects.using(alias).filter(target_id=obj.id).order_by("-id")[:INLINE_LIMIT])
        total = len(rows) if len(rows) < INLINE_LIMIT else (
            Signal.objects.using(alias).filter(target_id=obj.id).count())
        if not rows:
            return "empty"
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>", (
            (s.id, s.name, json.dumps(s.payload, cls=DjangoJSONEncoder, ensure_ascii=False)[:500],
             s.dedup_key or "—", s.inserted_at) for s in rows))
        url = with_database(reverse("admin:gen_durable_signal_changelist") + "?" + urlencode({"target": obj.id}),
                            alias)
        return format_html(
            '<table class="gd-inline" id="gd-inbox"><thead><tr><th>id</th><th>name</th><th>payload</th>'
            "<th>dedup key</th><th>inserted at</th></tr></thead><tbody>{}</tbody></table>{}",
            body, _more(total - len(rows), url, "signals"))

    @admin.display(description="children (newest first)")
    def children_list(self, obj):
        alias = obj._state.db
        qs = Instance.objects.using(alias).filter(parent_id=obj.id)
        rows = list(qs.order_by("-id").only("id", "fsm", "step", "status", "result", "last_error")[:INLINE_LIMIT])
        total = len(rows) if len(rows) < INLINE_LIMIT else qs.count()
        if not rows:
            return "none"
        body = format_html_join("", '<tr><td><a href="{}">#{}</a></td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>', (
            (with_database(reverse("admin:gen_durable_instance_change", args=[c.id]), alias), c.id, c.fsm, c.status, c.step,
             (json.dumps(c.result, cls=DjangoJSONEncoder, ensure_ascii=False) if c.result is not None
              else (c.last_error or ""))[:500]) for c in rows))
        url = with_database(reverse("admin:gen_durable_instance_changelist") + "?" + urlencode({"parent": obj.id}),
                            alias)
        return format_html(
            '<table class="gd-inline" id="gd-children"><thead><tr><th>id</th><th>machine</th><th>status</th>'
            "<th>step</th><th>result / error</th></tr></thead><tbody>{}</tbody></table>{}",
            body, _more(total - len(rows), url, "children"))

    # --- actions -------------------------------------------------------------------------
    def get_urls(self):
        return [
            path("act/<str:action>/all/", self.admin_site.admin_view(self.all_matching_view),
                 name="gen_durable_instance_act_all"),
            path("act/<str:action>/", self.admin_site.admin_view(self.action_view), name="gen_durable_instance_act"),
        ] + super().get_urls()

    def _redirect_to_action(self, request, queryset, action):
        if request.POST.get("select_across") == "1":
            # Django's "Select all N": the whole filtered list, however long — the
            # "all matching" page runs it in bounded batches (bulk.py).
            if action not in ALL_MATCHING:
                self.message_user(request, f"{ACTIONS[action]['title']} applies to selected instances only "
                                           f"(at most {MAX_ACTION_ROWS}): select them on the page.", messages.ERROR)
                return None
            url = reverse("admin:gen_durable_instance_act_all", args=[action])
            query = request.GET.copy()
            query["next"] = request.get_full_path()
            return HttpResponseRedirect(url + "?" + query.urlencode())
        ids = list(queryset.order_by("-id").values_list("id", flat=True)[: MAX_ACTION_ROWS + 1])
        if len(ids) > MAX_ACTION_ROWS:
            self.message_user(request, f"Select at most {MAX_ACTION_ROWS} instances for one action, or "
                                       "\"Select all\" to act on every instance the filter matches.", messages.ERROR)
            return None
        url = reverse("admin:gen_durable_instance_act", args=[action])
        return HttpResponseRedirect(with_database(url + "?" + urlencode({"ids": ",".join(map(str, ids)),
                                                                         "next": request.get_full_path()}),
                                                  request_alias(request)))

    @admin.action(description="Cancel selected instances…", permissions=["change"])
    def cancel_selected(self, request, queryset):
        return self._redirect_to_action(request, queryset, "cancel")

    @admin.action(description="Retry selected instances now…", permissions=["change"])
    def retry_selected(self, request, queryset):
        return self._redirect_to_action(request, queryset, "retry")

    @admin.action(description="Move selected instances to a queue…", permissions=["change"])
    def move_selected(self, request, queryset):
        return self._redirect_to_action(request, queryset, "move")

    @admin.action(description="Deliver a signal to selected instances…", permissions=["change"])
    def signal_selected(self, request, queryset):
        return self._redirect_to_action(request, queryset, "signal")

    def action_view(self, request, action):
        """Confirmation page (GET) and execution (POST) of one action on ?ids=1,2,3."""
        spec = ACTIONS.get(action)
        if spec is None:
            from django.http import Http404

            raise Http404(f"no action {action!r}")
        if not self.has_change_permission(request):
            raise PermissionDenied
        raw = request.POST.get("ids") if request.method == "POST" else request.GET.get("ids", "")
        ids = []
        for part in (raw or "").split(","):
            id_ = _exact_id(part)
            if id_ is not None and id_ not in ids:
                ids.append(id_)
        ids = ids[:MAX_ACTION_ROWS]
        back = safe_next(request, request.POST.get("next") or request.GET.get("next"),
                         with_database(reverse("admin:gen_durable_instance_changelist"), request_alias(request)))
        form = spec["form"](request.POST if request.method == "POST" else None)
        if request.method == "POST" and ids and form.is_valid():
            self._apply(request, action, ids, form.cleaned_data)
            return HttpResponseRedirect(back)
        targets = list(Instance.objects.using(request_alias(request)).filter(id__in=ids)
                       .only("id", "fsm", "step", "status", "queue").order_by("-id"))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta, "title": f"{spec['title']}: {len(ids)} instance{'s' if len(ids) != 1 else ''}",
            "action": action, "spec": spec, "form": form, "targets": targets,
            "missing": sorted(set(ids) - {t.id for t in targets}), "ids": ",".join(map(str, ids)), "next": back,
            "database": request_alias(request),
        }
        return TemplateResponse(request, "admin/gen_durable/instance/action_confirm.html", context)

    def all_matching_view(self, request, action):
        """Confirmation (GET), one bounded run (POST) and its result (GET ?run=TOKEN) of
        cancel / retry / move on every instance matching the changelist filter in the query
        string (docs/admin.md, "All matching"). A POST runs at most ALL_BATCHES_PER_REQUEST
        batches, writes one summary LogEntry and redirects to its result page (a reload
        shows the result again and acts on nothing), which offers to continue from where
        it stopped."""
        from django.http import Http404

        if action not in ALL_MATCHING:
            raise Http404(f"no all-matching action {action!r}")
        if not self.has_change_permission(request):
            raise PermissionDenied
        spec = ACTIONS[action]
        using = request_alias(request)
        back = safe_next(request, request.GET.get("next"),
                         with_database(reverse("admin:gen_durable_instance_changelist"), using))
        template = "admin/gen_durable/instance/action_all.html"
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "spec": spec,
                   "action": action, "next": back, "database": using, "other_database": using != database_alias(),
                   "title": f"{spec['title']}: all matching instances", "run": uuid.uuid4().hex}
        filt, refused = all_matching_filter(request.GET)
        if refused:
            context["refused"] = refused
            return TemplateResponse(request, template, context)
        statuses = bulk.window_statuses(action, filt.get("status"))
        form = spec["form"](request.POST if request.method == "POST" else None)
        form.fields["reason"].widget.attrs["size"] = 60
        if action != "cancel":
            form.fields["reason"].help_text = ("Optional: why — kept with who, when, the filter and the counts in one "
                                               "admin log entry per run (the admin's recent actions).")
        context.update(form=form, bulk_filter=filt, filter_text=filter_text(filt) or "no filter: every instance",
                       statuses=statuses, per_request=f"{ALL_BATCH * ALL_BATCHES_PER_REQUEST:,}",
                       batch=f"{ALL_BATCH:,}", able=bulk.actionable_statuses(action))
        source = request.POST if request.method == "POST" else request.GET
        try:
            after, top = continue_state(source)
        except ValueError as exc:
            # A tampered or truncated Continue: never guess where to resume (a restart
            # would act again on rows the earlier runs did).
            context.update(bad_continue=str(exc), count="0")
            return TemplateResponse(request, template, context, status=400)
        if not statuses:
            # e.g. retry on status=executing: nothing of it can be acted on.
            context.update(inert=filt["status"], count="0")
            return TemplateResponse(request, template, context, status=400 if request.method == "POST" else 200)
        results = request.session.get(SESSION_RESULTS, {})
        if request.method == "GET" and request.GET.get("run"):
            return self._all_matching_result(request, context, results.get(request.GET["run"]), after, top)
        if request.method == "POST":
            token = request.POST.get("run") or ""
            if token in results:  # the same form sent again: show what it did, do nothing
                self.message_user(request, "That run has already been done; nothing was acted on again.",
                                  messages.WARNING)
                return HttpResponseRedirect(self._result_url(request, using, token, results[token]))
            if form.is_valid():
                data = form.cleaned_data
                result, error = bulk.BulkResult(), None
                try:
                    bulk.run_window(action, status=filt.get("status"), queue=filt.get("queue"),
                                    machine=filt.get("machine"),
                                    reason=data.get("reason") if action == "cancel" else None,
                                    to_queue=data.get("to_queue"), batch=ALL_BATCH, after=after, top=top,
                                    max_batches=ALL_BATCHES_PER_REQUEST, using=using, result=result)
                except InvalidInput as exc:
                    form.add_error(None, str(exc))
                except Exception as exc:
                    # Rows changed before the error stay changed (each committed on its
                    # own): the summary says how many, and that the run was interrupted.
                    error = exc
                    audit_all_matching(request, action, filt, data, result, using, error=exc)
                    if not isinstance(exc, DatabaseError):
                        raise
                    self.message_user(request, f"The run was interrupted by a database error after "
                                               f"{result.done:,} done, {result.skipped:,} skipped: {exc}. "
                                               "Continue to carry on from where it stopped.", messages.ERROR)
                else:
                    audit_all_matching(request, action, filt, data, result, using)
                if error is not None or not form.errors:
                    token = token or uuid.uuid4().hex
                    stored = {"done": result.done, "skipped": result.skipped, "scanned": result.scanned,
                              "reasons": result.reasons, "after": result.after, "top": result.top,
                              "finished": result.finished and error is None,
                              "error": None if error is None else str(error)[:500],
                              "data": {k: v for k, v in request.POST.items() if k in form.fields}}
                    results = {k: v for k, v in results.items() if k != token}
                    results[token] = stored
                    request.session[SESSION_RESULTS] = dict(list(results.items())[-ALL_RESULTS_KEPT:])
                    return HttpResponseRedirect(self._result_url(request, using, token, stored))
        qs = Instance.objects.using(using).filter(status__in=statuses)
        if filt.get("queue"):
            qs = qs.filter(queue=filt["queue"])
        if filt.get("machine"):
            qs = qs.filter(fsm=filt["machine"])
        counter = EstimatedCountPaginator(qs.order_by("-id"), 1)
        n = counter.count
        shown = form.data if form.is_bound else {}
        if "to_queue" in form.errors:  # a refused target: the shell line keeps the QUEUE placeholder
            shown = {k: v for k, v in shown.items() if k != "to_queue"}
        context.update(count=f"{n:,}", count_estimated=counter.estimated, cap=f"{CAP:,}",
                       command=bulk_command(action, filt, shown, using))
        return TemplateResponse(request, template, context)

    @staticmethod
    def _result_url(request, using, token, stored) -> str:
        """The result page of run `token`: the same filter, ?run=TOKEN and, unless the walk
        finished, where to continue (after, top)."""
        query = request.GET.copy()
        for key in ALL_RESULT:
            query.pop(key, None)
        query["run"] = token
        if not stored["finished"] and stored["top"]:  # (an error before the walk started: none)
            query["after"], query["top"] = str(stored["after"]), str(stored["top"])
        if using != database_alias():
            query["database"] = using
        return request.path + "?" + query.urlencode()

    def _all_matching_result(self, request, context, stored, after, top):
        """The result page of one run (GET: acts on nothing). Its counts come from the
        session; where to continue comes from the URL."""
        spec = ACTIONS[context["action"]]
        finished = after is None
        result = {"after": after if not finished else (stored or {}).get("after"), "top": top,
                  "finished": finished, "reasons": (stored or {}).get("reasons", []),
                  "error": (stored or {}).get("error"), "kept": stored is not None}
        form = spec["form"]((stored or {}).get("data") or None)
        context.update(result=result, form=form, run=uuid.uuid4().hex,
                       command=bulk_command(context["action"], context["bulk_filter"], (stored or {}).get("data", {}),
                                            context["database"]),
                       done=f"{(stored or {}).get('done', 0):,}", skipped=f"{(stored or {}).get('skipped', 0):,}",
                       scanned=f"{(stored or {}).get('scanned', 0):,}")
        return TemplateResponse(request, "admin/gen_durable/instance/action_all.html", context)

    def _apply(self, request, action, ids, data):
        done, skipped, never = [], [], {}
        using = request_alias(request)
        if action == "move":
            moved = {r[0] for r in db.fetchall(sql.BULK_MOVE, {"ids": db.pg_array(ids), "queue": data["to_queue"]},
                                               using)}
            done = [i for i in ids if i in moved]
            skipped = [f"#{i} (missing, executing, done, or already in the queue)" for i in ids if i not in moved]
            ids = []
        for id_ in ids:
            try:
                if action == "cancel":
                    calls.cancel(id_, data["reason"], using=using)
                elif action == "retry":
                    calls.retry(id_, using=using)
                else:
                    signal_id, fsm, version = calls.deliver_signal(id_, data["name"], data["payload"],
                                                                   data["dedup_key"] or None, using)
                    if fsm not in never:
                        never[fsm] = calls.unawaited_reason(data["name"], fsm, version)
                    if signal_id is None:
                        skipped.append(f"#{id_} (dedup key already delivered)")
                        continue
                done.append(id_)
            except NoTarget:
                skipped.append(f"#{id_} (missing or already finished)")
            except NotRetryable as exc:
                skipped.append(f"#{id_} ({exc.status})")
            except DuplicateInstance:
                skipped.append(f"#{id_} (its correlation key is held by another live instance)")
            except GenDurableError as exc:
                skipped.append(f"#{id_} ({exc})")
        if done:
            audit_instances(request, done, audit_message(action, data), using)
            shown = ", ".join(f"#{i}" for i in done[:20]) + (" …" if len(done) > 20 else "")
            count = f"{len(done)} instance{'s' if len(done) != 1 else ''} ({shown})"
            if action == "signal":
                message = f"Delivered signal {data['name']!r} to {count}."
            elif action == "move":
                message = f"Moved to queue {data['to_queue']!r}: {count}."
            else:
                message = f"{'Cancelled' if action == 'cancel' else 'Retried'}: {count}."
            self.message_user(request, message, messages.SUCCESS)
            if action == "signal":
                self._warn_unawaited(request, done, data["name"], using, [w for w in never.values() if w])
        if skipped:
            self.message_user(request, f"Skipped {len(skipped)}: " + "; ".join(skipped[:20])
                              + (" …" if len(skipped) > 20 else ""), messages.WARNING)


    def _warn_unawaited(self, request, ids, name, using, never=()):
        """A signal an instance parked on other names does not wake: stored, it waits for a
        step that awaits it (maybe a typo of the name). Said beside the success message;
        `never`: why some targets' machines can never await it (calls.unawaited_reason)."""
        if never:
            self.message_user(request, f"Signal {name!r} is stored in the inbox but will wake nothing: "
                                       + "; ".join(never), messages.WARNING)
            return
        rows = db.fetchall("SELECT id, awaits FROM gen_durable WHERE id = ANY(%s) AND status = 'awaiting_signal' "
                           "ORDER BY id LIMIT 20", (db.pg_array(ids),), using)
        other = [(id_, awaits) for id_, awaits in rows if awaits and name not in awaits]
        if other:
            said = "; ".join(f"#{id_} awaits {', '.join(map(repr, awaits))}" for id_, awaits in other)
            self.message_user(request, f"Signal {name!r} wakes nothing yet: {said}. It is stored and handed to a "
                                       "later step that awaits it.", messages.WARNING)


SESSION_RESULTS = "gen_durable_all_matching"  # session key: the last runs' results
_WHOLE = re.compile(r"[0-9]{1,40}")  # then range-checked


def continue_state(values) -> tuple[int | None, int | None]:
    """(after, top) of a Continue (POST body or result page URL), (None, None) for a new
    run. ValueError, saying what is wrong, for one without the other, a value that is not
    a whole number, or one out of range (after > top, past the bigint ids)."""
    raw_after, raw_top = values.get("after") or "", values.get("top") or ""
    if not raw_after and not raw_top:
        return None, None
    if not raw_after or not raw_top:
        raise ValueError("a Continue needs both after and top (where the last run stopped); start again from "
                         "the list")
    if not (_WHOLE.fullmatch(raw_after) and _WHOLE.fullmatch(raw_top)):
        raise ValueError(f"after={raw_after[:30]!r}, top={raw_top[:30]!r}: not ids; start again from the list")
    after, top = int(raw_after), int(raw_top)
    if not after <= top < BIGINT - bulk.WINDOW:
        raise ValueError(f"after={after}, top={top}: out of range (after must be at most top, top an id); "
                         "start again from the list")
    return after, top


def all_matching_filter(query) -> tuple[dict, list[str]]:
    """The bulk filter (status, queue, machine) of a changelist query string, and what
    of it bulk.py cannot express (a search, a parent, any other lookup) — refused
    rather than dropped, which would widen the action to rows the list did not show."""
    filt, refused = {}, []
    for key in query:
        value = query.get(key)
        if key in ALL_FILTERS:
            if value:
                filt[key] = value
        elif key == "q":
            if value.strip():
                refused.append(f"the search {value.strip()!r}")
        elif key not in ALL_IGNORED and key not in ALL_RESULT and key != "next":
            refused.append(f"the filter {key}={value!r}")
    if filt.get("status") and filt["status"] not in Status.values:
        refused.append(f"the status {filt['status']!r} (not one of {', '.join(Status.values)})")
    return filt, refused


def filter_text(filt: dict) -> str:
    return ", ".join(f"{k} = {filt[k]}" for k in ALL_FILTERS if filt.get(k))


def bulk_command(action: str, filt: dict, data, using: str) -> str:
    """The `manage.py durable_bulk` command line for the same filter (a shell runs it to
    the end in one go; it writes no admin LogEntry)."""
    import shlex

    parts = ["python", "manage.py", "durable_bulk", action]
    for key in ALL_FILTERS:
        if filt.get(key):
            parts += [f"--{key}", filt[key]]
    if action == "retry" and not filt.get("status"):
        parts += ["--status", "failed"]  # what the admin retries with no status filter (the command's default too)
    if action == "cancel":
        parts += ["--reason", (data.get("reason") or "").strip() or "REASON"]
    if action == "move":
        parts += ["--to-queue", (data.get("to_queue") or "").strip() or "QUEUE"]
    if using != database_alias():
        parts += ["--database", using]
    return " ".join(shlex.quote(p) for p in parts)


# --- audit trail (django.contrib.admin's LogEntry) ---------------------------------------
def audit_message(action: str, data: dict) -> str:
    """The change message of an admin action: what was done and the operator's reason."""
    reason = (data.get("reason") or "").strip()
    if action == "cancel":
        what = "Cancelled (admin action)"
    elif action == "retry":
        what = "Retried now (admin action)"
    elif action == "move":
        what = f"Moved to queue {data['to_queue']!r} (admin action)"
    else:
        what = f"Delivered signal {data['name']!r} (admin action)"
        if data.get("dedup_key"):
            what += f", dedup key {data['dedup_key']!r}"
        what += f", payload {json.dumps(data.get('payload'), cls=DjangoJSONEncoder, ensure_ascii=False)[:500]}"
    return f"{what}; reason: {reason}" if reason else f"{what}; no reason given"


def audit_instances(request, ids, message, using=None) -> None:
    """One LogEntry (action CHANGE) per instance an admin action changed, written in one
    INSERT: who (request.user), when (action_time), what and why (message); shown on the
    instance's History page and in the admin's recent actions. The rows are read from
    `using`, the database they were changed in (default GEN_DURABLE['DATABASE']): another
    database's row with the same id is another instance. LogEntry keeps only the bare id,
    so an entry of another database starts its message with `database_mark(alias)` (and
    names it after its object_repr): the History page and recent actions say which
    instance it was, and the detail page's timeline lists only its own database's."""
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    using = using or database_alias()
    mark = database_mark(using)
    content_type = ContentType.objects.get_for_model(Instance)
    rows = Instance.objects.using(using).filter(id__in=ids).only("id", "fsm", "step", "status")
    LogEntry.objects.bulk_create([
        LogEntry(user_id=request.user.pk, content_type=content_type, object_id=str(row.id),
                 object_repr=(str(row)[:200 - len(mark) - 1] + " " + mark.strip()) if mark else str(row)[:200],
                 action_flag=CHANGE, change_message=mark + message)
        for row in rows])


DATABASE_MARK = "[database "  # how a LogEntry of another database's instance starts its message


def database_mark(alias: str) -> str:
    """The prefix of the admin log message of an action on database `alias`: none for the
    default one (GEN_DURABLE['DATABASE'], and every entry written before databases were
    marked), `[database ALIAS] ` for another."""
    return "" if alias == database_alias() else f"{DATABASE_MARK}{alias}] "


def audit_all_matching(request, action, filt, data, result, using=None, error=None) -> None:
    """One LogEntry for one run of an "all matching" action: who, when, what (the
    filter, the database unless the default, the id range walked, done/skipped counts) and
    why; `error`: the run stopped on it part-way ("interrupted: ..."). It has no object id
    (it names many), so it shows in the admin's recent actions, not on an instance's History."""
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    what = audit_message(action, data).replace("(admin action)", "(admin action, all matching)", 1)
    scope = filter_text(filt) or "no filter"
    if using and using != database_alias():
        scope += f"; database: {using}"
    finished = result.finished and error is None
    ids = f"ids {result.start}..{result.after}" + ("" if finished else f" of ..{result.top}")
    message = (f"{what}; filter: {scope}; {ids}; {result.done:,} done, {result.skipped:,} skipped of "
               f"{result.scanned:,} matched" + ("" if finished else "; not finished"))
    if error is not None:
        message += f"; interrupted: {type(error).__name__}: {error}"[:1000]
    LogEntry.objects.create(
        user_id=request.user.pk, content_type=ContentType.objects.get_for_model(Instance), object_id=None,
        object_repr=f"all matching: {scope}"[:200], action_flag=CHANGE, change_message=message)


def audit_queue(request, queue, message) -> None:
    """A LogEntry for a pause or resume of `queue` (content type: the queue overview)."""
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    LogEntry.objects.create(
        user_id=request.user.pk, action_flag=CHANGE, change_message=message,
        content_type=ContentType.objects.get_for_model(QueueOverview, for_concrete_model=False),
        object_id=queue[:255], object_repr=f"queue {queue}"[:200])


def running_seconds(obj, now=None) -> float | None:
    """Seconds since an executing instance was claimed (updated_at); None otherwise."""
    if obj.status != "executing" or obj.updated_at is None:
        return None
    now = now or timezone.now()
    return max((now - obj.updated_at).total_seconds(), 0.0)


def running_text(obj) -> str:
    seconds = running_seconds(obj)
    if seconds is None:
        return "—"
    slow = get_settings().SLOW_STEP_SECONDS
    text = f"{seconds:,.0f} s"
    if slow is not None and seconds >= slow:
        return format_html('<span class="gd-warn" title="over SLOW_STEP_SECONDS ({} s)">{}</span>', f"{slow:g}", text)
    return text


def _more(n, url, what):
    if n <= 0:
        return ""
    return format_html('<p class="gd-more">{} more {} — <a href="{}">see all</a></p>', f"{n:,}", what, url)


@admin.register(Signal)
class SignalAdmin(RefusesUnstorableFilters, admin.ModelAdmin):
    list_display = ("id", "target_link", "name", "dedup_key", "payload_short", "inserted_at")
    search_fields = ("=target__id",)
    search_help_text = "A target instance id (its whole inbox), or name:<signal name> with ?target=<id>."
    ordering = ("-id",)
    sortable_by = ("id",)
    show_full_result_count = False
    # Django's "Show counts" (facets) counts every filter choice over the filtered rows:
    # more than 10 minutes at 1,000,000 rows. Off, so every page stays bounded.
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator
    list_per_page = 100

    list_filter = (DatabaseFilter,)

    def get_queryset(self, request):
        return super().get_queryset(request).using(request_alias(request))

    def lookup_allowed(self, lookup, value, request=None):
        # gen_durable_signals_target (target_id, name) serves both.
        return lookup in ("target", "target__id__exact", "name") or super().lookup_allowed(lookup, value, request)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.startswith("name:"):
            return queryset.filter(name=term[5:].strip()), False
        id_ = _exact_id(term)
        return (queryset.filter(target_id=id_) if id_ is not None else queryset.none()), False

    @admin.display(description="target")
    def target_link(self, obj):
        url = with_database(reverse("admin:gen_durable_instance_change", args=[obj.target_id]), obj._state.db)
        return format_html('<a href="{}">#{}</a>', url, obj.target_id)

    @admin.display(description="payload")
    def payload_short(self, obj):
        text = json.dumps(obj.payload, cls=DjangoJSONEncoder, ensure_ascii=False)
        return text if len(text) <= 120 else text[:120] + "…"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(RefusesUnstorableFilters, admin.ModelAdmin):
    """The limiter's tables: the limiter owns every write."""

    def get_queryset(self, request):
        return super().get_queryset(request).using(request_alias(request))

    def get_list_filter(self, request):
        return (DatabaseFilter, *self.list_filter)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(BucketConfig)
class BucketConfigAdmin(ReadOnlyAdmin):
    list_display = ("kind", "name", "rate", "capacity", "shards", "updated_at")
    list_filter = ("kind",)
    ordering = ("kind", "name")


@admin.register(Bucket)
class BucketAdmin(ReadOnlyAdmin):
    list_display = ("kind", "key", "shard", "capacity", "available", "last_refill")
    list_filter = ("kind",)
    ordering = ("kind", "key", "shard")
    show_full_result_count = False
    # Django's "Show counts" (facets) counts every filter choice over the filtered rows:
    # more than 10 minutes at 1,000,000 rows. Off, so every page stays bounded.
    show_facets = admin.ShowFacets.NEVER
    paginator = EstimatedCountPaginator


@admin.register(QueueOverview)
class QueueOverviewAdmin(admin.ModelAdmin):
    """The overview page (linked from the admin index as "Queue overview")."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("gen_durable.view_instance") or request.user.has_perm(
            "gen_durable.change_instance")

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        return [
            path("", self.admin_site.admin_view(self.overview_view), name="gen_durable_queueoverview_changelist"),
            path("pause/", self.admin_site.admin_view(self.pause_view), name="gen_durable_queueoverview_pause"),
        ]

    def can_pause(self, request):
        return request.user.has_perm("gen_durable.change_instance")

    def overview_view(self, request):
        if not self.has_view_permission(request):
            raise PermissionDenied
        alias = request_alias(request)
        aliases = engine_aliases()
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta, "title": "Queue overview" + ("" if alias == database_alias()
                                                                  else f" (database {alias})"),
            "sections": overview.build(alias), "can_pause": self.can_pause(request),
            "database": alias, "databases": aliases + ([alias] if alias not in aliases else []),
            "database_query": "" if alias == database_alias() else urlencode({"database": alias}),
        }
        return TemplateResponse(request, "admin/gen_durable/overview/page.html", context)

    def pause_view(self, request):
        """POST queue=<name>&op=pause|resume (change permission on instances)."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.can_pause(request):
            raise PermissionDenied
        queue, op = request.POST.get("queue", ""), request.POST.get("op")
        using = request_alias(request)
        try:
            if op in ("pause", "resume"):
                changed = (calls.pause_queue(queue, using=using) if op == "pause"
                           else calls.resume_queue(queue, using=using))
                if changed:
                    audit_queue(request, queue, f"{'Paused' if op == 'pause' else 'Resumed'} queue {queue!r} "
                                                "in the queue overview")
            if op == "pause":
                self.message_user(request, f"Queue {queue!r} paused: workers stop claiming from it within about "
                                           "a second." if changed else f"Queue {queue!r} was already paused.",
                                  messages.SUCCESS if changed else messages.WARNING)
            elif op == "resume":
                self.message_user(request, f"Queue {queue!r} resumed." if changed
                                  else f"Queue {queue!r} was not paused.",
                                  messages.SUCCESS if changed else messages.WARNING)
            else:
                self.message_user(request, f"unknown operation {op!r}", messages.ERROR)
        except GenDurableError as exc:
            self.message_user(request, str(exc), messages.ERROR)
        return HttpResponseRedirect(with_database(reverse("admin:gen_durable_queueoverview_changelist"), using))
