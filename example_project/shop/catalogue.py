"""A stand-in for the shop's product service: prices and per-order stock limits.

The example keeps no tables of its own so it runs on gen_durable's tables alone; a
real shop would call its inventory and payment services here, passing the order key as
the idempotency key (steps run at least once).
"""

from decimal import Decimal

PRODUCTS = {
    "mug": {"price": Decimal("12.50"), "stock": 1000},
    "tee": {"price": Decimal("19.00"), "stock": 1000},
    "cap": {"price": Decimal("15.25"), "stock": 1000},
    "poster": {"price": Decimal("8.75"), "stock": 3},
}


class OrderError(ValueError):
    """An order that can never be fulfilled (unknown product, bad quantity, no stock)."""


def validate(items) -> list[dict]:
    """Return `items` normalised to [{"sku": str, "qty": int}, ...]; raise OrderError."""
    if not isinstance(items, list) or not items:
        raise OrderError("an order needs a non-empty list of items")
    out = []
    for item in items:
        if not isinstance(item, dict):
            raise OrderError(f"an item is an object with sku and qty, got {item!r}")
        sku, qty = item.get("sku"), item.get("qty", 1)
        if sku not in PRODUCTS:
            raise OrderError(f"unknown sku {sku!r}; known: {sorted(PRODUCTS)}")
        if isinstance(qty, bool) or not isinstance(qty, int) or qty < 1:
            raise OrderError(f"qty of {sku} must be a positive int, got {qty!r}")
        out.append({"sku": sku, "qty": qty})
    return out


def total(items) -> str:
    """The order total as a decimal string (JSON keeps it exact)."""
    return str(sum((PRODUCTS[i["sku"]]["price"] * i["qty"] for i in items), Decimal("0.00")))


def reserve(order_key: str, items) -> str:
    """Reserve stock for the order; idempotent per `order_key`. Returns a reservation id."""
    for i in items:
        if i["qty"] > PRODUCTS[i["sku"]]["stock"]:
            raise OrderError(f"only {PRODUCTS[i['sku']]['stock']} {i['sku']} in stock, {i['qty']} ordered")
    return f"res-{order_key}"
