"""Reading the executions side record of tests/durable_app/supervision_machines.py:
one line "<id> <step> <attempt> start|end <pid> <monotonic time>" per step start and end,
written by the step itself (a file: it survives kill -9 and counts across processes)."""

from collections import defaultdict


def read(log):
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        f = line.split()
        if len(f) == 6:  # a line still being written is skipped
            out.append((int(f[0]), f[1], int(f[2]), f[3], int(f[4]), float(f[5])))
    return out


def runs(log, killed):
    """(id, step) -> [(pid, start, end)] in start order; `end` is the time of the end line
    that followed that start in the same process, or the kill time of its process
    (`killed`: pid -> monotonic time) when none did (None if neither)."""
    out = defaultdict(list)
    open_runs = {}
    for id_, step, _attempt, what, pid, t in sorted(read(log), key=lambda r: r[5]):
        if what == "start":
            run = [pid, t, killed.get(pid)]
            out[(id_, step)].append(run)
            open_runs[(id_, step, pid)] = run
        elif (id_, step, pid) in open_runs:
            open_runs.pop((id_, step, pid))[2] = t
    return {k: [tuple(r) for r in v] for k, v in out.items()}


def overlaps(intervals):
    """Pairs of (start, end, tag) intervals that overlap in time (end None: still open)."""
    found = []
    ordered = sorted(intervals, key=lambda r: r[0])
    for i, (s1, e1, t1) in enumerate(ordered):
        for s2, e2, t2 in ordered[i + 1:]:
            if e1 is None or s2 < e1:
                found.append(((s1, e1, t1), (s2, e2, t2)))
            else:
                break
    return found
