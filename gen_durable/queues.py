"""What the engine reads about queues outside a worker: their names and their depth.

Shared by the admin's overview (gen_durable.admin.overview) and the OpenTelemetry
queue gauges (gen_durable.integrations.otel); one bounded statement each, whatever the
size of the table (docs/admin.md lists the plans).
"""

from __future__ import annotations

from . import db, registry, sql
from .conf import get_settings

COUNT_CAP = 10_000  # runnable/due rows are counted up to this many per queue


def configured_queues() -> list[str]:
    """Queues named by settings QUEUES or by a registered machine (no database read)."""
    names = set(get_settings().QUEUES)
    names.update(cls.queue for cls in registry.all_machines().values() if getattr(cls, "queue", None))
    return sorted(names)


def queue_depth(queues, using=None) -> dict:
    """queue -> (runnable ≤ COUNT_CAP, due ≤ COUNT_CAP, oldest due eligible_at | None, now)."""
    if not queues:
        return {}
    rows = db.fetchall(sql.OVERVIEW_QUEUE_DEPTH, {"queues": list(queues), "cap": COUNT_CAP}, using)
    return {r[0]: r[1:] for r in rows}
