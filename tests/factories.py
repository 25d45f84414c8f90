"""factory-boy factories for rows (tests use them instead of hand-written INSERTs)."""

import factory
from factory.django import DjangoModelFactory

from gen_durable.models import HistoryEntry, Instance, Signal


class InstanceFactory(DjangoModelFactory):
    class Meta:
        model = Instance

    fsm = "tests.Counter"
    fsm_version = 1
    step = "start"
    status = "runnable"
    state = factory.LazyFunction(dict)
    queue = "default"
    priority = 0


class ExecutingFactory(InstanceFactory):
    """A row claimed by `locked_by` with a live lease (as the pick leaves it)."""

    status = "executing"
    locked_by = "test-worker"
    lease_expires_at = factory.LazyFunction(lambda: __import__("django.utils.timezone", fromlist=["now"]).now()
                                            + __import__("datetime").timedelta(seconds=60))


class TerminalFactory(InstanceFactory):
    status = "done"
    result = factory.LazyFunction(dict)


class SignalFactory(DjangoModelFactory):
    class Meta:
        model = Signal

    target = factory.SubFactory(InstanceFactory)
    name = "go"
    payload = factory.LazyFunction(dict)


class HandedBackFactory(InstanceFactory):
    """A row a worker that did not know its machine, version or step handed back
    (sql/hand_back.sql): runnable, out of the pick's range, marked unknown_since."""

    unknown_since = factory.LazyFunction(lambda: __import__("django.utils.timezone", fromlist=["now"]).now())
    eligible_at = factory.LazyFunction(lambda: __import__("datetime").datetime(9999, 1, 1,
                                                                               tzinfo=__import__("datetime").timezone.utc))


class WorkerFactory(DjangoModelFactory):
    """A worker registry row (gen_durable_workers), as a running worker's heartbeat keeps it."""

    class Meta:
        model = __import__("gen_durable.models", fromlist=["Worker"]).Worker

    id = factory.Sequence(lambda n: f"worker-token-{n}")
    host = "host-a"
    pid = factory.Sequence(lambda n: 1000 + n)
    queues = factory.LazyFunction(lambda: ["default"])


class HistoryEntryFactory(DjangoModelFactory):
    """A timeline entry (gen_durable_history) as the flush writes it."""

    class Meta:
        model = HistoryEntry

    instance_id = factory.Sequence(lambda n: 10**9 + n)
    attempt = 0
    step = "start"
    outcome = "next"
    worker = "test-worker"
    started_at = factory.LazyFunction(lambda: __import__("django.utils.timezone", fromlist=["now"]).now())
    finished_at = factory.LazyFunction(lambda: __import__("django.utils.timezone", fromlist=["now"]).now())
