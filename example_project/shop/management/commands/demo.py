"""`manage.py demo`: run the shop end to end against a real `rundurable` worker.

1. Start `manage.py rundurable --processes N` as a subprocess (its log goes to a file).
2. Insert thousands of instances in two `insert_all` statements: `Pipeline` machines
   (throughput) and `send_receipt` jobs, some of which fail on purpose and retry.
3. Drive the HTTP endpoints in-process with django.test.Client: create orders
   (POST /orders/), wait until each is parked on its payment (GET …/result/), deliver
   the payment webhooks (POST /webhooks/payment/<key>/), wait for the results. Some
   orders are never paid (their Await times out) and one asks for more stock than
   there is; both end `failed` with a reason.
4. Wait (bounded) until every instance of this run is terminal, SIGTERM the worker,
   print counts by machine and status and the throughput, and exit non-zero when
   anything did not finish or ended other than expected.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connection
from django.test import Client

import gen_durable as gd
from shop.durable import Order, Pipeline, ShipParcel, send_receipt

MANAGE_PY = Path(__file__).resolve().parents[3] / "manage.py"
LIVE = ("runnable", "executing", "awaiting_signal", "awaiting_children")
SKUS = ("mug", "tee", "cap")

# Steps a finished instance ran (crash re-runs aside), from each machine's shape.
STEPS = {
    Pipeline.name: lambda attempt, step: 5,
    ShipParcel.name: lambda attempt, step: 2,
    send_receipt.name: lambda attempt, step: attempt + 1,
    # reserve_stock, charge, payment_received, join_shipping | release_stock; or stopped in reserve_stock
    Order.name: lambda attempt, step: 1 if step == "reserve_stock" else 4,
}


def _positive(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError(value)
    return n


class Failed(Exception):
    pass


class Command(BaseCommand):
    help = "Run the example shop end to end with a real rundurable worker and report throughput."

    def add_arguments(self, parser):
        parser.add_argument("--pipelines", type=_positive, default=2000, help="Pipeline machines (5 steps each).")
        parser.add_argument("--receipts", type=_positive, default=200, help="send_receipt jobs (1 in 4 retries).")
        parser.add_argument("--orders", type=_positive, default=50, help="Orders created over HTTP.")
        parser.add_argument("--abandoned", type=_positive, default=5,
                            help="How many of those orders are never paid (their payment Await times out).")
        parser.add_argument("--payment-timeout", type=float, default=2.0,
                            help="Seconds an abandoned order waits for its payment.")
        parser.add_argument("--processes", type=int, default=2, help="rundurable worker processes.")
        parser.add_argument("--timeout", type=float, default=90.0, help="Give up after this many seconds.")

    # ------------------------------------------------------------------ helpers
    def admin_user(self):
        """Create (or reset) the demo's superuser and print where the admin is."""
        import secrets

        from django.contrib.auth import get_user_model

        password = secrets.token_urlsafe(12)
        user, _ = get_user_model().objects.get_or_create(username="demo-admin", defaults={"email": ""})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.say(self.style.MIGRATE_HEADING("7. admin"))
        import devdb

        if devdb.EMBEDDED:  # the next manage.py reuses the embedded server by itself
            self.say("  run `cd example_project && ../.venv/bin/python manage.py runserver` (and `manage.py rundurable`),")
        else:  # without it the settings would start the embedded server: another, empty database
            self.say(f"  keep DATABASE_URL set ({devdb.shown_url(os.environ['DATABASE_URL'])}) and run")
            self.say("  `cd example_project && ../.venv/bin/python manage.py runserver` (and `manage.py rundurable`),")
        self.say("  then open http://localhost:8000/admin/ — instances, inboxes, the queue overview")
        self.say(f"  superuser: demo-admin  password: {password}  (a new password on every demo run)")

    def say(self, msg="", style=None):
        self.stdout.write(style(msg) if style else msg)

    def expect(self, ok: bool, what: str):
        if ok:
            self.say(f"  ok    {what}", self.style.SUCCESS)
        else:
            self.say(f"  FAIL  {what}", self.style.ERROR)
            self.failures.append(what)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # ------------------------------------------------------------------ worker
    def start_worker(self, processes: int):
        self.log = tempfile.NamedTemporaryFile(prefix="gd-demo-worker-", suffix=".log", delete=False)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # DATABASE_URL: set by devdb for the embedded server
        cmd = [sys.executable, str(MANAGE_PY), "rundurable", "--processes", str(processes)]
        self.say(f"$ {' '.join(['python', 'manage.py'] + cmd[2:])}   (log: {self.log.name})")
        # Own session: the demo decides when the worker stops (SIGTERM), also on Ctrl-C.
        self.worker = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=MANAGE_PY.parent,
                                       env=env, start_new_session=True)
        started = time.monotonic()
        while True:  # each worker process logs "gen_durable worker <token> starting: ..."
            text = Path(self.log.name).read_text(errors="replace")
            ready = sum("gen_durable worker" in line and "starting" in line for line in text.splitlines())
            if ready >= processes:
                break
            if self.worker.poll() is not None:
                raise Failed(f"rundurable exited with {self.worker.returncode} at start-up:\n{text[-3000:]}")
            if time.monotonic() - started > 30 or self.left() < 0:
                raise Failed(f"rundurable did not start within 30 s:\n{text[-3000:]}")
            time.sleep(0.05)
        self.say(f"  {processes} worker process(es) up in {time.monotonic() - started:.1f}s, "
                 f"queues {settings.GEN_DURABLE['QUEUES']}")

    def stop_worker(self) -> int | None:
        if getattr(self, "worker", None) is None:
            return None
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
            try:
                self.worker.wait(30)
            except subprocess.TimeoutExpired:
                self.say("  worker did not stop within 30 s of SIGTERM; killing it", self.style.ERROR)
                os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait()
        self.log.close()
        return self.worker.returncode

    def worker_log_summary(self):
        lines = Path(self.log.name).read_text(errors="replace").splitlines()
        bad = [ln for ln in lines if " WARNING " in ln or " ERROR " in ln or "Traceback" in ln]
        shown = [ln for ln in lines if "throughput:" in ln or " stopped: " in ln]
        for ln in shown[-8:]:
            self.say(f"  worker| {ln}")
        if bad:
            self.say(f"  worker logged {len(bad)} warning/error line(s), e.g.:", self.style.WARNING)
            for ln in bad[:5]:
                self.say(f"  worker| {ln}", self.style.WARNING)

    # ------------------------------------------------------------------ phases
    def bulk_insert(self, pipelines: int, receipts: int, run: str):
        t = time.perf_counter()
        ids = gd.insert_all([gd.Spec(Pipeline, state={"n": i}) for i in range(pipelines)])
        ids += gd.insert_all([
            gd.Spec(send_receipt, args={"order": f"{run}-r{i}", "email": f"customer{i}@example.com",
                                        # simulate an SMTP outage: 1 in 4 fails once, 1 in 20 twice
                                        "fail_first": 2 if i % 20 == 0 else 1 if i % 4 == 0 else 0})
            for i in range(receipts)])
        dt = time.perf_counter() - t
        self.say(f"  insert_all: {pipelines} Pipeline + {receipts} send_receipt in {dt * 1000:.0f} ms "
                 f"({len(ids) / dt:,.0f} rows/s, 2 statements)")
        self.retries_expected = sum(2 if i % 20 == 0 else 1 if i % 4 == 0 else 0 for i in range(receipts))

    def http_orders(self, client: Client, n: int, abandoned: int, payment_timeout: float, run: str) -> dict:
        """Create, pay and await orders over HTTP; return {"paid": [...], "abandoned": [...], ...}."""
        orders = {"paid": [], "abandoned": [], "rejected": []}
        t = time.perf_counter()
        for i in range(n):
            items = [{"sku": SKUS[(i + j) % len(SKUS)], "qty": 1 + (i + j) % 2} for j in range(1 + i % 3)]
            kind = "abandoned" if i >= n - abandoned else "paid"
            body = {"number": f"{run}-{i}", "email": f"buyer{i}@example.com", "items": items}
            if kind == "abandoned":
                body["payment_timeout"] = payment_timeout
            resp = client.post("/orders/", body, content_type="application/json")
            if resp.status_code != 201:
                raise Failed(f"POST /orders/ answered {resp.status_code}: {resp.content[:300]!r}")
            orders[kind].append({**resp.json(), "parcels": len(items)})
        # One order asks for more posters than there are: reserve_stock stops it.
        resp = client.post("/orders/", {"number": f"{run}-big", "items": [{"sku": "poster", "qty": 5}]},
                           content_type="application/json")
        if resp.status_code != 201:
            raise Failed(f"POST /orders/ answered {resp.status_code}: {resp.content[:300]!r}")
        orders["rejected"].append({**resp.json(), "parcels": 0})
        bad = client.post("/orders/", {"items": [{"sku": "unicorn"}]}, content_type="application/json")
        self.expect(bad.status_code == 400, f"POST /orders/ with an unknown sku → 400 ({bad.json()['error'][:40]}…)")
        self.say(f"  POST /orders/ × {n + 2} in {(time.perf_counter() - t) * 1000:.0f} ms; "
                 f"example: {(orders['paid'] or orders['rejected'])[0]}")

        # Each order reaches its Await: ?until=settled answers "awaiting" as soon as it parks.
        t = time.perf_counter()
        parked = 0
        for o in orders["paid"] + orders["abandoned"]:
            r = client.get(f"{o['result_url']}?timeout={min(5, max(self.left(), 0)):.1f}").json()
            parked += r["status"] == "awaiting" and r["step"] == "payment_received"
        self.expect(parked == n, f"{parked}/{n} orders parked awaiting payment_confirmed "
                                f"({(time.perf_counter() - t) * 1000:.0f} ms)")

        # The payment provider calls back; every 10th webhook is delivered twice (same event id).
        t = time.perf_counter()
        deduplicated = redelivered = 0
        for i, o in enumerate(orders["paid"]):
            body = {"event_id": f"evt_{o['order_key']}", "amount": o["total"], "currency": "EUR"}
            resp = client.post(o["webhook_url"], body, content_type="application/json")
            if resp.status_code != 202:
                raise Failed(f"POST {o['webhook_url']} answered {resp.status_code}: {resp.content[:300]!r}")
            if i % 10 == 0:
                again = client.post(o["webhook_url"], body, content_type="application/json")
                redelivered += 1
                deduplicated += again.status_code == 202 and again.json()["duplicate"]
        self.say(f"  POST /webhooks/payment/<key>/ × {len(orders['paid']) + redelivered} in "
                 f"{(time.perf_counter() - t) * 1000:.0f} ms ({deduplicated} of {redelivered} redeliveries "
                 "deduplicated; the others arrived after the order had consumed the first)")
        resp = client.post("/webhooks/payment/order:no-such-order/", {}, content_type="application/json")
        self.expect(resp.status_code == 404, "a webhook for an unknown order → 404 (gd.NoTarget)")

        # Wait for every order on the result endpoint (until=terminal waits through parking).
        t = time.perf_counter()
        results = {}
        for o in orders["paid"] + orders["abandoned"] + orders["rejected"]:
            while True:
                r = client.get(f"{o['result_url']}?timeout={min(5, max(self.left(), 0)):.1f}&until=terminal").json()
                if r["status"] in ("done", "failed") or self.left() <= 0:
                    results[o["id"]] = r
                    break
        self.say(f"  GET /orders/<id>/result/ settled {len(results)} orders in {(time.perf_counter() - t):.1f}s; "
                 f"example: {results[(orders['paid'] or orders['rejected'])[0]['id']]}")
        paid_ok = sum(results[o["id"]]["status"] == "done" and len(results[o["id"]]["result"]["tracking"]) == o["parcels"]
                      for o in orders["paid"])
        self.expect(paid_ok == len(orders["paid"]),
                   f"{paid_ok}/{len(orders['paid'])} paid orders done with one tracking number per parcel")
        timed_out = sum(results[o["id"]]["status"] == "failed"
                        and "payment not confirmed" in (results[o["id"]]["error"] or "") for o in orders["abandoned"])
        self.expect(timed_out == len(orders["abandoned"]),
                   f"{timed_out}/{len(orders['abandoned'])} unpaid orders failed after their {payment_timeout:g}s "
                   "payment timeout")
        big = results[orders["rejected"][0]["id"]]
        self.expect(big["status"] == "failed" and "in stock" in (big["error"] or ""),
                   f"the oversized order failed in reserve_stock: {big['error']!r}")
        resp = client.post(orders["rejected"][0]["webhook_url"], {}, content_type="application/json")
        self.expect(resp.status_code == 404, "a webhook for a finished order → 404 (gd.NoTarget)")
        return orders

    def wait_terminal(self, start_id: int) -> dict:
        last_print = time.monotonic()
        while True:
            with connection.cursor() as cur:
                cur.execute("SELECT status::text, count(*) FROM gen_durable WHERE id > %s GROUP BY 1", [start_id])
                counts = dict(cur.fetchall())
            live = {s: n for s, n in counts.items() if s in LIVE}
            if not live or self.left() <= 0:
                return live
            if time.monotonic() - last_print > 2:
                done = sum(n for s, n in counts.items() if s not in LIVE)
                self.say(f"  {done:,}/{sum(counts.values()):,} terminal; live: "
                         + ", ".join(f"{n} {s}" for s, n in sorted(live.items())))
                last_print = time.monotonic()
            time.sleep(0.1)

    def report(self, start_id: int):
        with connection.cursor() as cur:
            cur.execute(
                "SELECT fsm, status::text, count(*), count(*) FILTER (WHERE attempt > 0), "
                "min(inserted_at), max(updated_at), array_agg(attempt), array_agg(step) "
                "FROM gen_durable WHERE id > %s GROUP BY 1, 2 ORDER BY 1, 2", [start_id])
            rows = cur.fetchall()
        by = defaultdict(dict)
        self.say(f"  {'machine':<20} {'status':<18} {'count':>6} {'retried':>8} {'steps':>7}")
        total_steps = total_rows = 0
        first, last = None, None
        spans = {}
        for fsm, status, count, retried, t0, t1, attempts, steps_at in rows:
            steps = sum(STEPS.get(fsm, lambda a, s: 1)(a, s) for a, s in zip(attempts, steps_at))
            by[fsm][status] = count
            total_rows += count
            total_steps += steps
            first = t0 if first is None else min(first, t0)
            last = t1 if last is None else max(last, t1)
            lo, hi, s = spans.get(fsm, (t0, t1, 0))
            spans[fsm] = (min(lo, t0), max(hi, t1), s + steps)
            self.say(f"  {fsm:<20} {status:<18} {count:>6} {retried:>8} {steps:>7}")
        return by, total_rows, total_steps, first, last, spans

    # ------------------------------------------------------------------ main
    def handle(self, *, pipelines, receipts, orders, abandoned, payment_timeout, processes, timeout, **options):
        if abandoned > orders:
            raise CommandError("--abandoned cannot exceed --orders")
        self.failures = []
        self.deadline = time.monotonic() + timeout
        run = f"{int(time.time()):x}{os.getpid() % 1000:03d}"  # order numbers stay unique across runs
        with connection.cursor() as cur:
            cur.execute("SELECT coalesce(max(id), 0) FROM gen_durable")
            start_id = cur.fetchone()[0]
        self.say(self.style.MIGRATE_HEADING(f"gen_durable demo (run {run}, database "
                                            f"{connection.settings_dict['NAME']} via "
                                            f"{connection.settings_dict.get('HOST') or 'local socket'})"))
        rc = made = None
        try:
            self.say(self.style.MIGRATE_HEADING("1. worker"))
            self.start_worker(processes)
            self.say(self.style.MIGRATE_HEADING("2. bulk insert"))
            self.bulk_insert(pipelines, receipts, run)
            self.say(self.style.MIGRATE_HEADING("3. orders over HTTP"))
            host = next((h.lstrip(".") for h in settings.ALLOWED_HOSTS if h != "*"), "localhost")
            made = self.http_orders(Client(SERVER_NAME=host), orders, abandoned, payment_timeout, run)
            self.say(self.style.MIGRATE_HEADING("4. wait until every instance is terminal"))
            live = self.wait_terminal(start_id)
            self.expect(not live, "every instance of this run is terminal" + (f" — still live: {live}" if live else ""))
        except Failed as exc:
            self.failures.append(str(exc))
            self.say(f"  FAIL  {exc}", self.style.ERROR)
        finally:
            from gen_durable.results import ResultWatcher

            ResultWatcher.shutdown()  # await_result's LISTEN connection in this process
            rc = self.stop_worker()
        self.say(self.style.MIGRATE_HEADING("5. worker stopped (SIGTERM)"))
        self.expect(rc == 0, f"rundurable exited with {rc}")
        self.worker_log_summary()

        self.say(self.style.MIGRATE_HEADING("6. results"))
        by, total_rows, total_steps, first, last, spans = self.report(start_id)
        if made:
            paid, unpaid = len(made["paid"]), len(made["abandoned"]) + len(made["rejected"])
            parcels = sum(o["parcels"] for o in made["paid"])
            self.expect(by[Pipeline.name] == ({"done": pipelines} if pipelines else {}),
                       f"{pipelines} Pipeline done")
            self.expect(by[send_receipt.name] == {"done": receipts + paid},
                       f"{receipts + paid} send_receipt done ({receipts} bulk + {paid} queued by orders)")
            self.expect(by[ShipParcel.name] == ({"done": parcels} if parcels else {}), f"{parcels} ShipParcel done")
            self.expect(by[Order.name] == {"done": paid, "failed": unpaid}, f"Order: {paid} done, {unpaid} failed")
        if first is not None:
            span = (last - first).total_seconds()
            self.say(f"  all: {total_rows} instances, {total_steps} steps in {span:.2f}s (first insert → last "
                     f"outcome, database clock): {total_rows / span:,.0f} instances/s, {total_steps / span:,.0f} steps/s")
            if Pipeline.name in spans:
                lo, hi, steps = spans[Pipeline.name]
                s = (hi - lo).total_seconds()
                self.say(f"  Pipeline: {pipelines} instances × 5 steps in {s:.2f}s: {pipelines / s:,.0f} instances/s, "
                         f"{steps / s:,.0f} steps/s (sharing the worker with everything else)")
        self.admin_user()
        if self.failures:
            self.say(self.style.ERROR(f"demo FAILED: {len(self.failures)} check(s) failed; worker log: {self.log.name}"))
            sys.exit(1)
        os.unlink(self.log.name)
        self.say(self.style.SUCCESS("demo OK"))
