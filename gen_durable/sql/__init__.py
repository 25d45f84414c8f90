"""Internal: the engine's SQL, one statement per file, loaded once at import.

Each `.sql` file starts with a header (purpose, typed parameters, index used, guard,
docs/design.md). Texts are static — no SQL is built at run time — so psycopg's prepared
statement cache plans each shape once per connection (docs/design.md#model).
"""

from pathlib import Path

_DIR = Path(__file__).parent


def _load(name: str) -> str:
    """The statement as sent: its first line (the name, which pg_stat_statements and
    logs show) and its SQL, without the header's other comment lines or indentation.
    psycopg parses the placeholders of a query up to 4,096 bytes once and caches the
    result; a longer text is parsed again on every execution (the flush's was)."""
    lines = (_DIR / f"{name}.sql").read_text().splitlines()
    body = (line.strip() for line in lines[1:])
    return "\n".join([lines[0], *(line for line in body if line and not line.startswith("--"))]) + "\n"


INSERT = _load("insert")
INSERT_ALL = _load("insert_all")
PICK = _load("pick")
LOAD_SIGNALS = _load("load_signals")
LOAD_CHILDREN = _load("load_children")
FLUSH = _load("flush")
HISTORY_INSERT = _load("history_insert")
HISTORY_BEGIN = _load("history_begin")
HISTORY_GC_AGE = _load("history_gc_age")
HISTORY_GC_CAP = _load("history_gc_cap")
PARK_RECHECK = _load("park_recheck")
SPAWN_PARK = _load("spawn_park")
JOIN_PARENTS = _load("join_parents")
HEARTBEAT = _load("heartbeat")
RELEASE = _load("release")
HAND_BACK = _load("hand_back")
ADOPT_KNOWN = _load("adopt_known")
UNKNOWN_WAITING = _load("unknown_waiting")
LIVE_VERSIONS = _load("live_versions")
BURST_LEFTOVERS = _load("burst_leftovers")
ABANDON = _load("abandon")
STILL_OWNED = _load("still_owned")
WRITTEN_HERE = _load("written_here")
RECLAIM = _load("reclaim")
REAP = _load("reap")
EXPIRE_AWAITS = _load("expire_awaits")
NEXT_TIMERS = _load("next_timers")
GATE_HOLDERS = _load("gate_holders")
SCHEDULES_SYNC = _load("schedules_sync")
SCHEDULES_DUE = _load("schedules_due")
SCHEDULES_ADVANCE = _load("schedules_advance")
SCHEDULES_LIST = _load("schedules_list")
GC_SELECT = _load("gc_select")
GC_CHILDREN = _load("gc_children")
GC_DELETE = _load("gc_delete")
SIGNAL = _load("signal")
GET = _load("get")
CANCEL = _load("cancel")
RETRY = _load("retry")
PAUSE_QUEUE = _load("pause_queue")
RESUME_QUEUE = _load("resume_queue")
QUEUE_PAUSED = _load("queue_paused")
PAUSED_QUEUES = _load("paused_queues")
WORKER_REGISTER = _load("worker_register")
WORKER_UNREGISTER = _load("worker_unregister")
OVERVIEW_RUNNABLE_QUEUES = _load("overview_runnable_queues")
QUEUE_SAMPLE = _load("queue_sample")
OVERVIEW_QUEUE_DEPTH = _load("overview_queue_depth")
OVERVIEW_EXECUTING = _load("overview_executing")
BULK_SELECT = _load("bulk_select")
BULK_NEXT = _load("bulk_next")
BULK_MOVE = _load("bulk_move")
OVERVIEW_ESTIMATES = _load("overview_estimates")
OVERVIEW_FINISHED = _load("overview_finished")
OVERVIEW_SAMPLED = _load("overview_sampled")
NO_SORT = _load("no_sort")
OVERVIEW_WORKERS = _load("overview_workers")
OVERVIEW_COMPLETIONS = _load("overview_completions")
METRICS_COMPLETIONS = _load("metrics_completions")
DEFER = _load("defer")
LIMITER_LOCK = _load("limiter_lock")
LIMITER_DEBIT = _load("limiter_debit")
LIMITER_CREDIT = _load("limiter_credit")
RECONCILE_LOCK = _load("reconcile_lock")
RECONCILE_COUNT = _load("reconcile_count")
RECONCILE_HEAL = _load("reconcile_heal")
SWEEP_RATE_BUCKETS = _load("sweep_rate_buckets")
SYNC_LIMITS = _load("sync_limits")
UNKNOWN_RATE_LIMITS = _load("unknown_rate_limits")
TASK_ENQUEUE = _load("task_enqueue")


def names() -> list[str]:
    """Every statement file's stem (for the guard test that each one is used)."""
    return sorted(p.stem for p in _DIR.glob("*.sql"))
