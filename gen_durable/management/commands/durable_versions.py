"""`manage.py durable_versions`: live rows per machine, version and step (docs/guide.md, "Deploying").

Retire a machine version (or remove a step, or a machine) once this lists no live row
of it: until then a worker must still know it, or those rows wait forever (a worker
that does not know a row hands it back untouched; it never fails it).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ... import registry
from ...checks import live_versions, unknown_rows_text
from ...conf import get_settings


class Command(BaseCommand):
    help = ("List live rows (not done or failed) per machine, version, step and status, and whether this "
            "release's registry runs them; a version with no live row can be retired.")

    def add_arguments(self, parser):
        parser.add_argument("--machine", help="only this machine name")
        parser.add_argument("--unknown", action="store_true",
                            help="only rows whose machine, version or step no class registered here has")
        parser.add_argument("--database", default=None, help="database alias (default: GEN_DURABLE['DATABASE'])")

    def handle(self, *, machine, unknown, database, **options):
        using = database or get_settings().DATABASE
        rows = [r for r in live_versions(using)
                if (machine is None or r["fsm"] == machine) and (not unknown or not r["known"])]
        # A removed machine is not registered here but may still have live rows: list
        # them. A name with neither is a typo: say the close registered name.
        if machine is not None and not rows and not any(n == machine for n, _v in registry.all_machines()):
            names = sorted({n for n, _v in registry.all_machines()})
            import difflib

            close = difflib.get_close_matches(machine, names, n=1)
            if close:
                raise CommandError(f"no machine named {machine!r} is registered here or has live rows; "
                                   f"did you mean {close[0]!r}?")
        if not rows:
            what = " of " + machine if machine else ""
            self.stdout.write(f"no live rows{what}{' this release does not know' if unknown else ''}")
            return
        header = ("machine", "version", "step", "status", "rows", "e.g. id", "handed back", "this release")
        table = [header] + [(r["fsm"], f"v{r['version']}", r["step"], r["status"], f"{r['count']:,}",
                             str(r["example"]), f"{r['handed_back']:,}",
                             "runs it" if r["known"] else unknown_rows_text(r)) for r in rows]
        widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
        for line in table:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(line, widths)) + "  " + line[-1])
        registered = sorted(registry.all_machines())
        live = {(r["fsm"], r["version"]) for r in live_versions(using)} if machine or unknown else \
            {(r["fsm"], r["version"]) for r in rows}
        retirable = [f"{n} v{v}" for n, v in registered if (n, v) not in live and (machine is None or n == machine)
                     and any(n == m and v < w for m, w in registered)]
        if retirable:
            self.stdout.write("no live rows (an older version may be removed): " + ", ".join(retirable))
