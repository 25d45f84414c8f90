"""The admin's queue overview: one context builder per section.

`SECTIONS` is the page, top to bottom: each entry is a function
`build(using) -> dict | None` whose dict has a `template` (rendered with the dict as
`section`) and a `title`. Add a section by appending a builder (or inserting one at a
position); a builder returning None is skipped. Every query is bounded whatever the
size of the table (docs/admin.md lists them with their plans):

- queues: the configured queues, those with runnable rows (a loose index scan of
  gen_durable_pick), those a live worker serves and the paused ones; per queue the
  runnable and due rows (counted up to COUNT_CAP), the oldest due row's age, the
  executing rows (gen_durable_lease), the done and failed rows counted among the newest
  COUNT_CAP finished / failed ones (gen_durable_gc, gen_durable_failed; a lower bound
  past that), and the rows awaiting a signal or children — exact on a small table, else
  the planner's statistics while fresh, else a bounded sample read now;
- workers: the worker registry and the executing rows per claimant (`locked_by`), with
  each claimant's longest-running step ("longest running", from the same statement);
- schedules: the configured cron schedules, next run and last run (gen_durable_schedules,
  by primary key; nothing is read when none is configured);
- waiting for a release: rows a worker that did not know their machine, version or step
  handed back (a rolling deploy, docs/guide.md "Deploying"), per machine/version/step
  (gen_durable_unknown, which holds only them; nothing shown when there are none);
- completions: rows finished per minute over the last hour (gen_durable_gc, index only),
  the failed ones in red (gen_durable_failed, index only), drawn as a server-rendered
  SVG bar chart.
"""

from __future__ import annotations

import datetime as dt

from .. import db, registry, sql
from ..conf import get_settings
from ..queues import COUNT_CAP, configured_queues, queue_depth
from ..statuses import Status

CHART_MINUTES = 60
LONGEST_RUNNING = 10  # rows of the "longest running" table (one per claimant and queue)
ESTIMATED = ("awaiting_signal", "awaiting_children", "done", "failed")


SAMPLE_PAGES = 1000  # pages the awaiting counts read at most when the statistics cannot serve
STALE_FRACTION = 0.1  # the statistics are stale once this share of the rows changed since ANALYZE


def statistics(using=None) -> dict:
    """What the planner's statistics say (sql/overview_estimates.sql): per (queue,
    status) its estimate (`mcv`), when the table was last analysed, whether that is
    fresh (analysed, and at most STALE_FRACTION of the rows — at least 1,000 — changed
    since), the rows changed since and the table's size in pages now."""
    reltuples, analyzed, attnames, values, freqs, modified, live, pages = db.fetchone(
        sql.OVERVIEW_ESTIMATES, None, using)
    mcv: dict = {}
    if attnames and values:
        qi, si = attnames.index("queue"), attnames.index("status")
        for pair, freq in zip(values, freqs):
            mcv[(pair[qi], pair[si])] = round(freq * max(reltuples, 0))
    rows = max(reltuples or 0, live or 0, 0)
    fresh = analyzed is not None and (modified or 0) <= max(1000, STALE_FRACTION * rows)
    return {"mcv": mcv, "analyzed": analyzed, "fresh": fresh, "modified": modified or 0, "pages": pages or 0}


def finished_counts(using=None) -> dict:
    """Done and failed rows per queue counted among the newest COUNT_CAP + 1 finished and
    failed rows (sql/overview_finished.sql, two capped index scans): {"done": {queue: n},
    "failed": {queue: n}, "done_more": bool, "failed_more": bool} — *_more: more rows
    exist than were counted, so each n is a lower bound."""
    from django.db import transaction

    out = {"done": {}, "failed": {}, "done_more": False, "failed_more": False}
    alias = db.connection(using).alias
    # The capped index scans must not depend on the statistics (tests/plans): sorts off
    # for this one statement, in a savepoint rolled back after it, so the setting never
    # reaches the rest of the request's transaction.
    with transaction.atomic(using=alias):
        point = transaction.savepoint(using=alias)
        try:
            db.fetchone(sql.NO_SORT, None, using)
            rows = db.fetchall(sql.OVERVIEW_FINISHED, {"cap": COUNT_CAP}, using)
        finally:
            transaction.savepoint_rollback(point, using=alias)
    for kind, queue, status, n, sampled in rows:
        if kind == "finished":
            out["done_more"] = sampled > COUNT_CAP
            if status == "done":
                out["done"][queue] = n
        else:
            out["failed_more"] = sampled > COUNT_CAP
            out["failed"][queue] = n
    return out


def awaiting_counts(stats: dict, using=None) -> dict:
    """Rows awaiting a signal / children per queue, and where the numbers come from:
    a table of at most SAMPLE_PAGES pages is read whole (exact); a larger one uses the
    statistics while they are fresh, else a sample of SAMPLE_PAGES pages read now
    (sql/overview_sampled.sql, TABLESAMPLE SYSTEM). Returns {"counts": {(queue,
    status): n}, "source": "exact" | "statistics" | "sample", "percent": float}."""
    pages = stats["pages"]
    if pages > SAMPLE_PAGES and stats["fresh"]:
        return {"counts": {k: v for k, v in stats["mcv"].items() if k[1] in ("awaiting_signal", "awaiting_children")},
                "source": "statistics", "percent": None}
    percent = 100.0 if pages <= SAMPLE_PAGES else 100.0 * SAMPLE_PAGES / pages
    scale = 100.0 / percent
    counts = {(q, st): round(n * scale) for q, st, n in db.fetchall(sql.OVERVIEW_SAMPLED, {"percent": percent}, using)}
    return {"counts": counts, "source": "exact" if percent >= 100.0 else "sample", "percent": percent}


def _count(n, estimated=False):
    """A count cell: the number, and whether it is a lower bound or an estimate."""
    if n is None:
        return {"n": None, "text": "·", "estimated": estimated}
    if not estimated and n >= COUNT_CAP:
        return {"n": n, "text": f"{COUNT_CAP:,}+", "estimated": False}
    return {"n": n, "text": ("≈ " if estimated else "") + f"{n:,}", "estimated": estimated}


def _at_least(n, estimate=None):
    """A lower-bound cell (more rows exist than were counted), with the statistics'
    estimate beside it when they are fresh and say more."""
    text = f"≥ {n:,}" + (f" (≈ {estimate:,})" if estimate is not None and estimate > n else "")
    return {"n": n, "text": text, "estimated": estimate is not None and estimate > n, "lower_bound": True}


def live_workers(using=None) -> list[dict]:
    live = get_settings().LEASE_TTL
    rows = db.fetchall(sql.OVERVIEW_WORKERS, {"live": live}, using)
    return [{"id": r[0], "host": r[1], "pid": r[2], "queues": list(r[3] or []), "started_at": r[4],
             "last_seen": r[5], "live": r[6]} for r in rows]


def queues_section(using=None) -> dict:
    runnable_queues = [r[0] for r in db.fetchall(sql.OVERVIEW_RUNNABLE_QUEUES, None, using)]
    paused = {r[0]: r[1] for r in db.fetchall(sql.PAUSED_QUEUES, None, using)}
    workers = live_workers(using)
    served: dict = {}
    for w in workers:
        if w["live"]:
            for q in w["queues"]:
                served[q] = served.get(q, 0) + 1
    executing: dict = {}
    for _locked_by, queue, n, *_rest in db.fetchall(sql.OVERVIEW_EXECUTING, None, using):
        executing[queue] = executing.get(queue, 0) + n
    names = sorted(set(configured_queues()) | set(runnable_queues) | set(paused) | set(served) | set(executing))
    depth = queue_depth(names, using)
    stats = statistics(using)
    finished = finished_counts(using)
    awaiting = awaiting_counts(stats, using)
    fresh_mcv = stats["mcv"] if stats["fresh"] else {}

    def cells(q):
        out = []
        for s in ESTIMATED:
            if s in ("done", "failed"):
                n = finished[s].get(q, 0)
                out.append(_at_least(n, fresh_mcv.get((q, s))) if finished[f"{s}_more"]
                           else {"n": n, "text": f"{n:,}", "estimated": False})
            else:
                out.append(_count(awaiting["counts"].get((q, s), 0), estimated=awaiting["source"] != "exact"))
        return out

    rows = []
    for q in names:
        runnable, due, oldest, now = depth.get(q, (0, 0, None, None))
        age = max((now - oldest).total_seconds(), 0.0) if oldest is not None and oldest <= now else None
        rows.append({
            "queue": q,
            "paused": q in paused, "paused_at": paused.get(q),
            "workers": served.get(q, 0),
            "unserved": runnable > 0 and not served.get(q),
            "runnable": _count(runnable), "due": _count(due),
            "oldest_age": age, "oldest_age_text": _age(age),
            "executing": _count(executing.get(q, 0)),
            "estimated": cells(q),
        })
    return {
        "template": "admin/gen_durable/overview/queues.html", "title": "Queues",
        "rows": rows, "estimated_statuses": [Status(s).label for s in ESTIMATED],
        "analyzed": stats["analyzed"], "stale": stats["analyzed"] is not None and not stats["fresh"],
        "modified": stats["modified"], "cap": COUNT_CAP, "finished": finished, "awaiting": awaiting,
        "sample_pages": f"{SAMPLE_PAGES:,}", "pages": f"{stats['pages']:,}", "cap_text": f"{COUNT_CAP:,}",
        "modified_text": f"{stats['modified']:,}",
        "unserved": [r for r in rows if r["unserved"]],
    }


def workers_section(using=None) -> dict:
    workers = live_workers(using)
    by_token = {w["id"]: w for w in workers}
    claims = []
    for locked_by, queue, n, lease, id_, fsm, step, attempt, running in db.fetchall(sql.OVERVIEW_EXECUTING, None, using):
        token = (locked_by or "").rsplit(":", 1)[-1]
        claims.append({"locked_by": locked_by, "queue": queue, "count": n, "lease_min": lease,
                       "worker": by_token.get(token), "id": id_, "fsm": fsm, "step": step, "attempt": attempt,
                       "running": max(running or 0.0, 0.0)})
    slow = get_settings().SLOW_STEP_SECONDS
    # The longest-running step of each claimant, longest first: a hung step shows here
    # however healthy its lease looks (the heartbeat renews it).
    longest = sorted(claims, key=lambda c: -c["running"])[:LONGEST_RUNNING]
    for c in longest:
        c["running_text"] = f"{c['running']:,.0f} s"
        c["slow"] = slow is not None and c["running"] >= slow
    return {"template": "admin/gen_durable/overview/workers.html", "title": "Workers",
            "workers": workers, "claims": claims, "longest": longest, "slow_after": slow}


def completions_section(using=None) -> dict:
    rows = db.fetchall(sql.OVERVIEW_COMPLETIONS, {"minutes": CHART_MINUTES}, using)
    now_row = db.fetchone("SELECT date_trunc('minute', now())", None, using)
    end = now_row[0]
    counts = {m: n for m, n, failed in rows if not failed}
    failures = {m: n for m, n, failed in rows if failed}
    minutes = [end - dt.timedelta(minutes=CHART_MINUTES - 1 - i) for i in range(CHART_MINUTES)]
    series = [counts.get(m, 0) for m in minutes]
    failed = [min(failures.get(m, 0), n) for m, n in zip(minutes, series)]
    return {"template": "admin/gen_durable/overview/completions.html", "title": "Completions per minute (last hour)",
            "chart": bar_chart(series, minutes, failed=failed), "total": sum(series), "failed": sum(failed)}


def bar_chart(series, minutes, width=600, height=120, pad=30, failed=None) -> dict:
    """Geometry of an SVG bar chart of `series` (one bar per minute); no JavaScript.

    failed: per minute, how many of the bar's rows failed — drawn as the bar's lower,
    red part (`fh`, from the baseline up), the rest above it."""
    top = max(series) if series else 0
    scale = (height - 10) / top if top else 0
    bar_w = (width - pad) / max(len(series), 1)
    failed = failed or [0] * len(series)
    bars = []
    for i, (n, f, minute) in enumerate(zip(series, failed, minutes)):
        h, fh = n * scale, f * scale
        bars.append({"x": round(pad + i * bar_w, 2), "y": round(height - h, 2), "w": round(max(bar_w - 1, 1), 2),
                     "h": round(h - fh, 2), "n": n, "failed": f, "fy": round(height - fh, 2), "fh": round(fh, 2),
                     "label": minute.strftime("%H:%M")})
    return {"width": width, "height": height + 20, "plot_h": height, "pad": pad, "bars": bars, "max": top,
            "first": minutes[0].strftime("%H:%M") if minutes else "", "last": minutes[-1].strftime("%H:%M") if minutes else ""}


def _age(seconds):
    if seconds is None:
        return "—"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def schedules_section(using=None) -> dict:
    """Cron schedules with their next and last run (gen_durable.schedules.overview):
    no statement when none is configured, else two primary-key reads."""
    from ..schedules import overview

    return {"template": "admin/gen_durable/overview/schedules.html", "title": "Schedules",
            "schedules": overview(using)}


def unknown_waiting(using=None) -> list[dict]:
    """Rows handed back by a worker that did not know them (sql/unknown_waiting.sql), one
    dict per (queue, machine, version, step): count, an example id, since when, and
    whether this process's registry knows them (else no registered class has them)."""
    out = []
    for queue, fsm, version, step, n, example, since in db.fetchall(sql.UNKNOWN_WAITING, None, using):
        out.append({"queue": queue, "fsm": fsm, "version": version, "step": step, "count": n,
                    "example": example, "since": since, "known_here": registry.knows(fsm, version, step)})
    return out


def unknown_section(using=None) -> dict | None:
    rows = unknown_waiting(using)
    if not rows:
        return None
    return {"template": "admin/gen_durable/overview/unknown.html", "title": "Waiting for a worker that knows them",
            "rows": rows}


SECTIONS = [unknown_section, queues_section, workers_section, schedules_section, completions_section]


def build(using=None) -> list[dict]:
    """Every section's context, in page order."""
    return [s for s in (builder(using) for builder in SECTIONS) if s is not None]
