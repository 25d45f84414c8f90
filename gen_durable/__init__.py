"""gen_durable: Postgres-backed durable execution for Django (docs/guide.md).

Public API only; everything else is internal.
"""

from .calls import (
    acancel, ainsert, ainsert_all, apause_queue, apaused_queues, aresume_queue, aretry, asignal, cancel,
    insert, insert_all, pause_queue, paused_queues, resume_queue, retry, signal,
)
from .bulk import BulkResult, cancel_where, move_where, retry_where
from .exceptions import (
    DuplicateInstance,
    GenDurableError,
    IdAsKeyWarning,
    InvalidInput,
    InvalidOutcome,
    NoTarget,
    NotMigrated,
    NotRetryable,
    RoutedOutsideTransactionWarning,
    SerializationError,
    StepTimeout,
    TransactionLeftOpen,
    UnawaitedSignalWarning,
    UncommittedInstance,
    UnknownMachine,
)
from .machine import Context, Job, Machine, job, step
from .results import Result, Snapshot, aawait_result, aget, await_result, get
from .outcomes import Await, Cancel, Child, Done, Error, Next, Retry, ScheduleChildren, Spec, Stop
from .producer import Producer, flush_async, insert_async

__all__ = [
    "Await", "Cancel", "Child", "Context", "Done", "DuplicateInstance", "Error", "GenDurableError",
    "IdAsKeyWarning", "InvalidInput", "InvalidOutcome", "Job", "Machine", "Next", "NoTarget", "NotMigrated", "NotRetryable", "Retry", "RoutedOutsideTransactionWarning",
    "ScheduleChildren", "SerializationError", "Spec", "StepTimeout", "Stop", "TransactionLeftOpen", "UnawaitedSignalWarning", "UncommittedInstance", "UnknownMachine",
    "Result", "Snapshot", "aawait_result", "acancel", "aget", "ainsert", "ainsert_all", "asignal",
    "await_result", "cancel", "get", "insert", "insert_all", "job", "signal", "step",
    "apause_queue", "apaused_queues", "aresume_queue", "aretry", "pause_queue", "paused_queues",
    "resume_queue", "retry", "Producer", "flush_async", "insert_async",
    "BulkResult", "cancel_where", "move_where", "retry_where",
]
