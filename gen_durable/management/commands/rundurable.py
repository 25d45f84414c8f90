"""`manage.py rundurable`: run gen_durable workers (SPEC §5)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys

from django.core.management.base import BaseCommand, CommandError

from gen_durable.conf import get_settings


def queue_spec(value: str) -> tuple[str, int | None]:
    """argparse type for --queue NAME[=CONCURRENCY]."""
    name, _, conc = value.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"--queue needs a name, got {value!r}")
    if conc:
        try:
            n = int(conc)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--queue {name}=N needs an integer N, got {conc!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"--queue {name}=N needs N >= 1, got {n}")
        return name, n
    return name, None


def positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


class Command(BaseCommand):
    help = "Run gen_durable workers: schedulers for the configured queues, flusher, heartbeat, reaper and GC."
    requires_system_checks = "__all__"
    requires_migrations_checks = True

    def add_arguments(self, parser):
        parser.add_argument("--queue", action="append", type=queue_spec, dest="queue", default=None,
                            metavar="NAME[=N]", help="Queue to run (repeatable), with optional concurrency; "
                                                     "default: GEN_DURABLE['QUEUES'].")
        parser.add_argument("--processes", type=positive_int, default=1,
                            help="Worker processes (use one per core).")
        parser.add_argument("--no-reaper", action="store_true", help="Run no reaper in this process.")
        parser.add_argument("--no-gc", action="store_true", help="Run no GC in this process.")
        parser.add_argument("--burst", action="store_true",
                            help="Exit 0 once no row of these queues is runnable or executing.")
        parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)

    def handle(self, *, queue, processes, no_reaper, no_gc, burst, child, verbosity, **options):
        level = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}[verbosity]
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")
        logging.getLogger("gen_durable").setLevel(level)
        settings = get_settings()
        queues = dict(settings.QUEUES)
        if queue:
            queues = {name: (n or settings.QUEUES.get(name) or 10) for name, n in queue}
        if queue and child is None:
            self._check_queues([name for name, _ in queue], burst)
        if processes > 1 and child is None:
            return self._supervise(processes)
        from gen_durable.worker.supervisor import Supervisor, WorkerConfig

        # Maintenance runs in the first process only: it is safe but redundant elsewhere.
        first = child in (None, 0)
        config = WorkerConfig(queues=queues, reaper=not no_reaper and first, gc=not no_gc and first, burst=burst)
        code = Supervisor(config).run()
        if code:
            raise CommandError(f"worker exited with {code}")

    def _check_queues(self, names, burst: bool):
        """Warn about a --queue that nothing uses (a typo runs an idle worker); refuse it
        with --burst, which would otherwise exit 0 as if the work were done."""
        from gen_durable import db, registry

        declared = {cls.queue for cls in registry.all_machines().values()}
        unused = []
        for name in names:
            if name in declared:
                continue
            # One probe of the pick index: rows inserted with queue= still count.
            runnable = db.fetchone("SELECT EXISTS (SELECT 1 FROM gen_durable WHERE queue = %(q)s "
                                   "AND status = 'runnable')", {"q": name})[0]
            if not runnable:
                unused.append(name)
        if not unused:
            return
        message = (f"--queue {', '.join(map(repr, unused))}: no registered machine uses "
                   f"{'this queue' if len(unused) == 1 else 'these queues'} and no runnable instance is in it "
                   f"(machines use {sorted(declared)}; configured: {sorted(get_settings().QUEUES)})")
        if burst:
            raise CommandError(message + "; refusing --burst, which would exit 0 with nothing done")
        self.stderr.write(f"Warning: {message}")

    def _supervise(self, processes: int):
        argv = [a for a in sys.argv if not a.startswith("--processes")]
        # drop a separate value after --processes
        cleaned, skip = [], False
        for a in sys.argv:
            if skip:
                skip = False
                continue
            if a == "--processes":
                skip = True
                continue
            if a.startswith("--processes="):
                continue
            cleaned.append(a)
        argv = cleaned
        children = [subprocess.Popen([sys.executable] + argv + [f"--child={i}"]) for i in range(processes)]

        def forward(signum, frame):
            for p in children:
                if p.poll() is None:
                    p.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        codes = [p.wait() for p in children]
        bad = [c for c in codes if c]
        if bad:
            raise CommandError(f"{len(bad)} worker process(es) exited non-zero: {codes}")
        os.environ.pop("GEN_DURABLE_CHILD", None)
