"""Django tasks for tests/integration/test_tasks.py (imported by apps.ready: TASKS uses gen_durable).

`record` appends a line to a file so a worker subprocess's execution order is visible.
"""

import asyncio
import os

from gen_durable.tasks import task


@task
def noop():
    return None


@task
def add(a, b):
    return a + b


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs, "tuple": (1, 2)}


@task
def record(path, label):
    with open(path, "a") as f:
        f.write(f"{label} {os.getpid()}\n")
    return label


@task
def fail(message):
    raise ValueError(message)


@task
def bad_return():
    return object()


@task(takes_context=True)
def whoami(context, tag):
    result = context.task_result
    return {"attempt": context.attempt, "id": result.id, "status": str(result.status), "tag": tag,
            "workers": result.worker_ids, "started": result.started_at is not None}


@task(takes_context=True, backend="retrying")
def flaky(context, succeed_on):
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return {"attempt": context.attempt, "errors": len(context.task_result.errors)}


@task(backend="retrying")
def always_fails():
    raise KeyError("never")


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
async def async_whoami(context, tag):
    await asyncio.sleep(0)
    return {"attempt": context.attempt, "id": context.task_result.id, "tag": tag}
