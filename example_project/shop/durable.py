"""The shop's durable machines; gen_durable imports this module at start-up.

- `Order`: reserve stock → charge → wait for the payment provider's webhook (signal
  "payment_confirmed", with a timeout) → ship every parcel in parallel (one `ShipParcel`
  child each) → join → done, queueing a receipt e-mail on the way out.
- `ShipParcel`: pack → label; the child machine of the fan-out.
- `send_receipt`: a job (`@gd.job`) on the "email" queue that retries with back-off; the
  demo makes some fail on purpose so the retries show.
- `Pipeline`: five tiny steps; the demo runs thousands of them to measure throughput.

Steps run at least once (a crash before the outcome commits re-runs the step), so each
side effect is keyed by something stable: the order key, the instance id.
"""

import asyncio
import time

import gen_durable as gd

from . import catalogue
from .catalogue import OrderError

PAYMENT_TIMEOUT = 30.0  # seconds an order waits for its payment webhook by default

# The receipt's correlation key stays reserved after it is sent (until GC), so a re-run
# of the step that queues it cannot send a second e-mail.
RECEIPT_SCOPE = ["runnable", "executing", "awaiting_signal", "awaiting_children", "done", "failed"]


class Order(gd.Machine):
    """One order, addressed by its correlation key "order:<number>".

    state: {"number", "email", "items": [{"sku", "qty"}], "payment_timeout"} at insert;
    the steps add "total", "reservation", "payment_id" and, on release, "reason".
    """

    name = "shop.Order"
    queue = "orders"
    initial = "reserve_stock"

    @gd.step
    def reserve_stock(self, ctx):
        items = catalogue.validate(ctx.state["items"])
        reservation = catalogue.reserve(ctx.correlation_key or f"order-id:{ctx.id}", items)
        return gd.Next("charge", state={**ctx.state, "items": items, "reservation": reservation,
                                        "total": catalogue.total(items)})

    @gd.step
    def charge(self, ctx):
        # A real shop creates a payment intent here (idempotency key: the order key) and
        # the provider calls POST /webhooks/payment/<order key>/ once the customer pays.
        payment_id = f"pi_{ctx.id}"
        return gd.Await("payment_confirmed", next="payment_received",
                        state={**ctx.state, "payment_id": payment_id},
                        timeout=ctx.state.get("payment_timeout", PAYMENT_TIMEOUT))

    @gd.step
    def payment_received(self, ctx):
        if not ctx.awaited:  # the Await timed out
            timeout = ctx.state.get("payment_timeout", PAYMENT_TIMEOUT)
            return gd.Next("release_stock", state={**ctx.state, "reason": f"payment not confirmed within {timeout:g}s"})
        payment = ctx.awaited[0].payload or {}
        if str(payment.get("amount")) != ctx.state["total"]:
            return gd.Next("release_stock", state={
                **ctx.state, "reason": f"paid {payment.get('amount')!r}, due {ctx.state['total']}"})
        parcels = [
            gd.Child(ShipParcel, state={"order": ctx.state["number"], "order_id": ctx.id, "parcel": i, **item})
            for i, item in enumerate(ctx.state["items"])
        ]
        return gd.ScheduleChildren(next="join_shipping", children=parcels,
                                   state={**ctx.state, "paid": payment.get("amount")})

    @gd.step
    def join_shipping(self, ctx):
        failed = [c for c in ctx.children if c.status != "done"]
        if failed:
            return gd.Stop(f"{len(failed)} parcel(s) failed: {failed[0].last_error}")
        try:
            send_receipt.insert(args={"order": ctx.state["number"], "email": ctx.state.get("email")},
                                correlation_key=f"receipt:{ctx.correlation_key or ctx.id}",
                                correlation_scope=RECEIPT_SCOPE)
        except gd.DuplicateInstance:
            pass  # this step ran before and queued it already
        tracking = sorted(c.result["tracking"] for c in ctx.children)
        return gd.Done({"order": ctx.state["number"], "total": ctx.state["total"],
                        "payment_id": ctx.state["payment_id"], "tracking": tracking})

    @gd.step
    def release_stock(self, ctx):
        # A real shop releases ctx.state["reservation"] here (idempotently).
        return gd.Stop(f"{ctx.state['reason']}; reservation {ctx.state['reservation']} released")

    def handle(self, error, ctx):
        if isinstance(error, OrderError):  # the order can never succeed
            return gd.Stop(str(error))
        if ctx.attempt < 3:  # anything else: assume it is transient
            return gd.Retry(delay=0.5 * 2 ** ctx.attempt)
        return gd.Stop(repr(error))


class ShipParcel(gd.Machine):
    """One parcel of an order: pack, then buy a label. state: {order, order_id, parcel, sku, qty}."""

    name = "shop.ShipParcel"
    queue = "orders"
    initial = "pack"

    @gd.step
    def pack(self, ctx):
        return gd.Next("label", state={**ctx.state, "weight_g": 350 * ctx.state["qty"]})

    @gd.step
    def label(self, ctx):
        tracking = f"TRK{ctx.state['order_id']:09d}-{ctx.state['parcel']}"
        return gd.Done({"parcel": ctx.state["parcel"], "tracking": tracking, "weight_g": ctx.state["weight_g"]})


def quick_backoff(attempt: int) -> float:
    """0.2 s, 0.4 s, 0.8 s, … (capped at 5 s) instead of the default 1 s, 2 s, 4 s, …"""
    return min(0.2 * 2 ** min(attempt, 10), 5.0)


@gd.job(queue="email", max_attempts=5, name="shop.send_receipt", backoff=quick_backoff)
def send_receipt(args, ctx):
    """E-mail a receipt. args: {"order", "email", "fail_first": N (demo: simulate an SMTP
    outage for the first N attempts)}. Raising retries after `backoff`; 5 attempts in all."""
    if ctx.attempt < args.get("fail_first", 0):
        raise ConnectionError(f"SMTP server unavailable (simulated, attempt {ctx.attempt + 1})")
    return {"sent_to": args.get("email"), "order": args.get("order"), "attempts": ctx.attempt + 1}




class Pipeline(gd.Machine):
    """Five tiny steps per instance, to measure steps per second. state: {"n": int}."""

    name = "shop.Pipeline"
    queue = "default"
    initial = "parse"

    @gd.step
    def parse(self, ctx):
        return gd.Next("validate", state={"n": ctx.state["n"], "value": ctx.state["n"] * 2})

    @gd.step
    def validate(self, ctx):
        if ctx.state["value"] % 2:
            return gd.Stop(f"odd value {ctx.state['value']}")
        return gd.Next("enrich")

    @gd.step
    def enrich(self, ctx):
        return gd.Next("store", state={**ctx.state, "bucket": ctx.state["n"] % 16})

    @gd.step
    def store(self, ctx):
        return gd.Next("publish")

    @gd.step
    def publish(self, ctx):
        return gd.Done({"n": ctx.state["n"], "bucket": ctx.state["bucket"]})


class InlinePipeline(Pipeline):
    """`Pipeline` with inline continuation: the five steps run back to back in one worker."""

    name = "shop.InlinePipeline"
    inline_execution = True


class AsyncPing(gd.Machine):
    """One `async def` step that awaits one second (an I/O-bound call, e.g. a webhook)."""

    name = "shop.AsyncPing"

    @gd.step
    async def start(self, ctx):
        await asyncio.sleep(1)
        return gd.Done()



@gd.job(name="shop.noop", queue="default")
def noop(args):
    """Does nothing: the unit of work of the drain benchmarks (bench/)."""
    return None


# The benchmarks' realistic jobs (bench/gd_workloads.py; the peers do the same work).
@gd.job(name="shop.write_row")
def write_row(args):
    """Writes one row with the ORM."""
    from .models import BenchRow

    BenchRow.objects.create(n=args.get("n", 0))


@gd.job(name="shop.sleep_20ms")
def sleep_20ms(args):
    """Waits 20 ms on (simulated) blocking I/O."""
    time.sleep(0.02)


@gd.job(name="shop.async_sleep_20ms")
async def async_sleep_20ms(args):
    """Awaits 20 ms of (simulated) I/O."""
    await asyncio.sleep(0.02)


class Waiter(gd.Machine):
    """Parks until signal "go" (or state["timeout"] seconds), then finishes with its payload:
    the unit of the signal and timer benchmarks."""

    name = "shop.Waiter"

    @gd.step
    def start(self, ctx):
        return gd.Await("go", next="finish", timeout=ctx.state.get("timeout"))

    @gd.step
    def finish(self, ctx):
        return gd.Done({"got": ctx.awaited[0].payload if ctx.awaited else None})
