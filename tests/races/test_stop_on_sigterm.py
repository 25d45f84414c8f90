"""Hammer: a SIGTERM at any moment of the worker's wait loop stops it (docs/design.md#worker).

The run loop waits on its stop request; SIGTERM's handler (`Supervisor.request_stop`)
sets it from the same thread, between two bytecodes of whatever the loop is doing. A
`threading.Event` there deadlocks whenever the signal lands while `wait()` holds the
Event's lock: the handler's `set()` waits for a lock its own thread holds. Each round
starts a process spinning on the wait (`wait(0)`: the lock-holding moments as dense as
they get), sends SIGTERM at a random moment and expects the process gone within
HANG_AFTER seconds. The negative control runs the same rounds over an Event and must
hang at least once.
"""

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 150
CONTROL_ROUNDS = 150  # the Event hung on most rounds when measured; stops at the first hang
HANG_AFTER = 2.0

# One process sets Django up, then forks a worker per round (a round costs milliseconds):
# a real Supervisor's handler and stop request, its wait as the run loop calls it.
ZYGOTE = """
import os, signal, sys, threading, django
django.setup()
from gen_durable.worker.supervisor import Supervisor, WorkerConfig
while sys.stdin.readline():
    pid = os.fork()
    if pid == 0:
        sup = Supervisor(WorkerConfig(queues={}, reaper=False, gc=False))  # touches no database
        if sys.argv[1] == "control":
            sup._stop = threading.Event()
        signal.signal(signal.SIGTERM, sup.request_stop)
        os.write(1, f"ready {os.getpid()}\\n".encode())
        while not sup._stop.wait(0):
            pass
        os._exit(0 if sup._stop_signal == signal.SIGTERM else 5)
    os.write(1, f"exit {os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}\\n".encode())
"""


def read_line(fd: int, timeout: float) -> str | None:
    """One line from `fd`, or None if none came within `timeout` seconds."""
    out, deadline = b"", time.monotonic() + timeout
    while not out.endswith(b"\n"):
        if not select.select([fd], [], [], max(deadline - time.monotonic(), 0))[0]:
            return None
        out += os.read(fd, 1)
    return out.decode().strip()


def rounds(kind: str, n: int, stop_at_first_hang: bool = False) -> tuple[int, list]:
    """(rounds whose worker did not exit within HANG_AFTER of its SIGTERM, exit codes of the others)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "example_project")])}
    zygote = subprocess.Popen([sys.executable, "-c", ZYGOTE, kind], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env, cwd=ROOT, bufsize=0)
    fd, hung, codes = zygote.stdout.fileno(), 0, []
    try:
        for _ in range(n):
            zygote.stdin.write(b"go\n")
            ready = read_line(fd, 30)
            assert ready and ready.startswith("ready "), ready
            pid = int(ready.split()[1])
            time.sleep(random.uniform(0, 0.005))
            os.kill(pid, signal.SIGTERM)
            done = read_line(fd, HANG_AFTER)
            if done is None:
                hung += 1
                os.kill(pid, signal.SIGKILL)
                read_line(fd, 30)
                if stop_at_first_hang:
                    break
            else:
                codes.append(int(done.split()[1]))
    finally:
        zygote.stdin.close()
        zygote.wait(30)
    return hung, codes


def test_sigterm_at_any_moment_of_the_wait_stops_the_worker():
    hung, codes = rounds("real", ROUNDS)
    assert hung == 0
    assert codes == [0] * ROUNDS  # each stopped by its handler, which saw SIGTERM


def test_negative_control_an_event_set_by_the_handler_can_hang():
    hung, _ = rounds("control", CONTROL_ROUNDS, stop_at_first_hang=True)
    assert hung == 1
