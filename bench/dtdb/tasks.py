"""The benchmark's task: a no-op."""

from django_tasks import task


@task()
def noop() -> None:
    return None
