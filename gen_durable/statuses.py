"""Instance statuses (the `gen_durable_status` enum), importable before apps load."""

from django.db.models import TextChoices


class Status(TextChoices):
    RUNNABLE = "runnable"
    EXECUTING = "executing"
    AWAITING_SIGNAL = "awaiting_signal"
    AWAITING_CHILDREN = "awaiting_children"
    DONE = "done"
    FAILED = "failed"


LIVE_STATUSES = ("runnable", "executing", "awaiting_signal", "awaiting_children")
TERMINAL_STATUSES = ("done", "failed")
