"""`manage.py durable_bulk`: cancel, retry or move every instance matching a filter."""

from __future__ import annotations

import difflib

from django.core.management.base import BaseCommand, CommandError

from gen_durable import bulk, calls, registry
from gen_durable.exceptions import InvalidInput
from gen_durable.statuses import Status


class Command(BaseCommand):
    help = """Cancel, retry or move to another queue every instance matching a filter, in
    bounded batches that do not block workers (gd.cancel_where / retry_where / move_where;
    docs/guide.md "Bulk operations"). Prints progress after each batch; --dry-run only
    counts the matching rows. Example: manage.py durable_bulk retry --status failed --queue email"""

    def add_arguments(self, parser):
        parser.add_argument("operation", choices=("cancel", "retry", "move"))
        parser.add_argument("--status", action="append", choices=Status.values,
                            help="match this status (repeatable); default: live rows for cancel, failed for "
                                 "retry, every status but executing and done for move")
        parser.add_argument("--queue", help="match this queue")
        parser.add_argument("--machine", help="match this machine name (the fsm column)")
        parser.add_argument("--to-queue", help="move: the target queue (required for move)")
        parser.add_argument("--reason", help="cancel: the reason stored in last_error (required for cancel)")
        parser.add_argument("--batch", type=int, default=1000, help="ids per batch (1..10000, default 1000)")
        parser.add_argument("--database", default=None, help="database alias (default: GEN_DURABLE['DATABASE'])")
        parser.add_argument("--dry-run", action="store_true", help="count the matching rows, change nothing")

    def handle(self, *args, **o):
        op = o["operation"]
        if op == "move" and not o["to_queue"]:
            raise CommandError("move needs --to-queue")
        if op == "cancel" and not o["reason"]:
            raise CommandError("cancel needs --reason (it is stored in last_error)")
        if op != "move" and o["to_queue"]:
            raise CommandError("--to-queue is for move only")
        if op != "cancel" and o["reason"]:
            raise CommandError("--reason is for cancel only")
        status = o["status"]
        if status is None:
            status = {"cancel": None, "retry": "failed", "move": None}[op]

        known = sorted({name for name, _version in registry.all_machines()})
        if o["machine"] and o["machine"] not in known:
            # Not an error: the rows of a retired machine (no longer registered) still
            # match by name; but a typo would silently match nothing.
            close = difflib.get_close_matches(o["machine"], known, n=1)
            self.stderr.write(f"note: no registered machine is named {o['machine']!r}"
                              + (f" (did you mean {close[0]!r}?)" if close else "")
                              + "; a retired machine's rows still match")

        def progress(done, skipped, scanned):
            self.stdout.write(f"{op}: {scanned:,} matched so far, {done:,} done, {skipped:,} skipped")

        kw = {"status": status, "queue": o["queue"], "machine": o["machine"], "batch": o["batch"],
              "using": o["database"], "progress": progress}
        try:
            if op == "move":
                # Before the dry run's count too: a typo would strand the rows where no
                # worker looks (the admin refuses it the same way).
                calls.check_queue(o["to_queue"])
            if o["dry_run"]:
                result = bulk.count_where(op, **{k: v for k, v in kw.items() if k != "progress"})
                self.stdout.write(f"{op}: {result:,} instances match (dry run: nothing changed)")
                return
            if op == "cancel":
                result = bulk.cancel_where(reason=o["reason"], **kw)
            elif op == "retry":
                result = bulk.retry_where(**kw)
            else:
                result = bulk.move_where(to_queue=o["to_queue"], **kw)
        except InvalidInput as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(self.style.SUCCESS(
            f"{op}: {result.done:,} done, {result.skipped:,} skipped of {result.scanned:,} matched "
            f"in {result.batches} batch{'es' if result.batches != 1 else ''}"))
        for reason in result.reasons:
            self.stdout.write(f"  skipped {reason}")
