"""The shop's Django tasks: Django's `@task`, run by gen_durable (settings.TASKS).

gen_durable imports this module at start-up (apps' `tasks` modules are discovered when
TASKS uses gen_durable.tasks.GenDurableBackend), so `rundurable` runs these with no
other setting. In your project write `from django.tasks import task` (Django 6.x) or
`from django_tasks import task` (5.2); the example imports gen_durable.tasks' re-export
so it runs on both.
"""

from gen_durable.tasks import task


@task(takes_context=True)
def send_receipt_copy(context, order_key, email):
    """E-mail another copy of an order's receipt (the demo only reports what it would send).

    Returns {"sent_to", "order_key", "attempt"}; raising would retry it (OPTIONS
    MAX_ATTEMPTS in settings.TASKS).
    """
    if not email or "@" not in email:
        raise ValueError(f"not an e-mail address: {email!r}")
    return {"sent_to": email, "order_key": order_key, "attempt": context.attempt}


@task
def noop():
    """Does nothing: bench/tasks_backends.py drains 20,000 of these (beside django-tasks-db)."""
    return None
