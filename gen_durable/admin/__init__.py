"""The Django admin of gen_durable: instances, inboxes, limiter tables, queue overview.

- `site`: the ModelAdmins (registered when Django's admin autodiscovery imports
  this package), their filters, forms, actions and the admin log entries they write;
- `paging`: the changelist's paginator, which counts from the planner's estimate;
- `overview`: the queue overview's sections, one context builder each.

Installing the app registers everything; nothing to write in a project's admin.py.
Built for tables of millions of rows (docs/admin.md):

- changelists never count the whole table (`EstimatedCountPaginator`, its estimate
  labelled "≈"; `show_full_result_count = False`; Django's facets off), sort only by the primary key, filter on choices
  taken from the settings and the machine registry (never `SELECT DISTINCT`), and search
  by exact id or exact correlation key, live or not (index lookups, never `icontains`);
- the detail page shows the newest INLINE_LIMIT inbox rows and children, with a count
  of the rest and a link to them;
- actions (cancel, retry now, move to a queue, deliver a signal) go through the public
  calls, need the change permission and a confirmation page; on "Select all N" cancel,
  retry and move act on every instance the filter matches, in bounded batches of
  `gen_durable.bulk` (a filter it cannot express is refused); view-only staff see
  everything and change nothing.
"""

from .site import InstanceAdmin, QueueOverviewAdmin, SignalAdmin  # importing site registers them

__all__ = ["InstanceAdmin", "QueueOverviewAdmin", "SignalAdmin"]
