"""gen_durable: Postgres-backed durable execution for Django (SPEC §1).

Public API only; everything else is internal.
"""

from .calls import ainsert, ainsert_all, insert, insert_all
from .exceptions import (
    DuplicateInstance,
    GenDurableError,
    InvalidInput,
    InvalidOutcome,
    NoTarget,
    SerializationError,
    UnknownMachine,
)
from .machine import Context, Job, Machine, job, step
from .outcomes import Await, Cancel, Child, Done, Error, Next, Retry, ScheduleChildren, Spec, Stop

__all__ = [
    "Await", "Cancel", "Child", "Context", "Done", "DuplicateInstance", "Error", "GenDurableError",
    "InvalidInput", "InvalidOutcome", "Job", "Machine", "Next", "NoTarget", "Retry",
    "ScheduleChildren", "SerializationError", "Spec", "Stop", "UnknownMachine",
    "ainsert", "ainsert_all", "insert", "insert_all", "job", "step",
]
