"""JSON encoding of states and typed State round-trips (docs/guide.md).

A typed State goes the way a row does: `codec.encode_state` → text bound to the
`jsonb` column → `json.loads` (what psycopg hands back) → `codec.load_typed`.
"""

from __future__ import annotations

import re
import dataclasses
import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Optional

import pytest

from gen_durable import codec
from gen_durable.exceptions import SerializationError

AMS = dt.timezone(dt.timedelta(hours=2), "CEST")


@dataclasses.dataclass
class Address:
    city: str = ""
    postcode: str = ""
    lat: Decimal = Decimal("0")


@dataclasses.dataclass
class OrderState:
    order_id: uuid.UUID = uuid.UUID(int=0)
    placed_at: Optional[dt.datetime] = None
    due: Optional[dt.date] = None
    cutoff: Optional[dt.time] = None
    total: Decimal = Decimal("0")
    window: dt.timedelta = dt.timedelta(0)
    ship_to: Address = dataclasses.field(default_factory=Address)
    previous: Optional[Address] = None
    prices: list[Decimal] = dataclasses.field(default_factory=list)
    owners: dict[str, uuid.UUID] = dataclasses.field(default_factory=dict)
    stops: list[Address] = dataclasses.field(default_factory=list)
    tags: tuple[str, ...] = ()
    coupon: Decimal | None = None
    note: Optional[str] = None
    count: int = 0


def full_state():
    return OrderState(
        order_id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
        placed_at=dt.datetime(2026, 7, 1, 9, 30, 15, 123456, tzinfo=AMS),
        due=dt.date(2026, 7, 3),
        cutoff=dt.time(17, 45, 30, 250001),
        total=Decimal("1234.5600"),
        window=dt.timedelta(days=1, hours=2, minutes=3, seconds=4, microseconds=5),
        ship_to=Address("Amsterdam", "1011 AB", Decimal("52.3676")),
        previous=Address("Utrecht"),
        prices=[Decimal("0.10"), Decimal("19.99"), Decimal("1E+3")],
        owners={"alice": uuid.UUID(int=1), "bob": uuid.UUID(int=2)},
        stops=[Address("Haarlem"), Address("Leiden", lat=Decimal("-4.5"))],
        tags=("gift", "express"),
        coupon=Decimal("5.00"),
        note="leave at door",
        count=3,
    )


def round_trip(cls, value):
    return codec.load_typed(cls, json.loads(codec.encode_state(value)))


def test_typed_state_round_trips_exactly():
    original = full_state()
    loaded = round_trip(OrderState, original)
    assert loaded == original
    # Equality alone would accept 1234.56 for 1234.5600 and a UTC datetime for the
    # same instant in +02:00: check types, digits and offsets too.
    assert type(loaded.order_id) is uuid.UUID
    assert str(loaded.total) == "1234.5600"
    assert [str(p) for p in loaded.prices] == ["0.10", "19.99", "1E+3"]
    assert loaded.placed_at.utcoffset() == dt.timedelta(hours=2)
    assert loaded.placed_at.microsecond == 123456
    assert loaded.cutoff == dt.time(17, 45, 30, 250001)
    assert type(loaded.ship_to) is Address and type(loaded.stops[1].lat) is Decimal
    assert all(type(v) is uuid.UUID for v in loaded.owners.values())
    assert loaded.tags == ("gift", "express")


def test_utc_datetime_round_trips():
    s = OrderState(placed_at=dt.datetime(2026, 1, 1, 0, 0, 0, 999999, tzinfo=dt.timezone.utc))
    assert round_trip(OrderState, s) == s


def test_optional_fields_left_none_round_trip():
    s = OrderState(total=Decimal("1"))
    loaded = round_trip(OrderState, s)
    assert loaded == s
    assert (loaded.placed_at, loaded.previous, loaded.coupon, loaded.note) == (None, None, None, None)


def test_encoded_state_is_a_json_object_of_plain_values():
    doc = json.loads(codec.encode_state(full_state()))
    assert isinstance(doc, dict)
    assert doc["total"] == "1234.5600" and doc["order_id"] == "12345678-1234-5678-1234-567812345678"
    assert doc["ship_to"] == {"city": "Amsterdam", "postcode": "1011 AB", "lat": "52.3676"}
    assert doc["due"] == "2026-07-03"


def test_empty_object_loads_as_all_defaults():
    assert codec.load_typed(OrderState, {}) == OrderState()
    assert codec.load_typed(OrderState, None) == OrderState()


def test_missing_keys_take_defaults_and_unknown_keys_are_ignored():
    # A row written by an older or newer State keeps loading.
    loaded = codec.load_typed(OrderState, {"total": "9.5", "retired_field": 1})
    assert loaded == OrderState(total=Decimal("9.5"))


def test_legacy_row_whose_jsonb_is_a_json_string_loads():
    # old writers double-encoded, so the jsonb holds a string.
    original = full_state()
    legacy = json.loads(json.dumps(codec.encode_state(original)))
    assert isinstance(legacy, str)
    assert codec.load_typed(OrderState, legacy) == original


def test_a_typed_dict_field_gets_its_int_and_float_keys_back():
    @dataclasses.dataclass
    class Tallies:
        by_price: dict[float, int] = dataclasses.field(default_factory=dict)
        by_id: dict[int, str] = dataclasses.field(default_factory=dict)
        by_name: dict[str, float] = dataclasses.field(default_factory=dict)

    value = Tallies(by_price={9.99: 3}, by_id={42: "a"}, by_name={"x": 1.5})
    encoded = codec.encode_state(value)
    assert json.loads(encoded)["by_id"] == {"42": "a"}  # JSON's keys are strings...
    assert codec.load_typed(Tallies, json.loads(encoded)) == value  # ...the annotation parses them back


def test_plain_dict_state_uses_djangos_encodings():
    text = codec.encode_state({"at": dt.datetime(2026, 7, 1, 9, 30, tzinfo=dt.timezone.utc),
                               "amount": Decimal("1.50"), "id": uuid.UUID(int=3), "on": dt.date(2026, 7, 1)})
    assert json.loads(text) == {"at": "2026-07-01T09:30:00Z", "amount": "1.50",
                                "id": "00000000-0000-0000-0000-000000000003", "on": "2026-07-01"}


def test_datetimes_keep_their_microseconds_in_plain_states_too():
    # DjangoJSONEncoder alone would write "…15.123Z" and lose 456 µs.
    text = codec.encode_state({"at": dt.datetime(2026, 7, 1, 9, 30, 15, 123456, tzinfo=dt.timezone.utc),
                               "t": dt.time(8, 0, 0, 1)})
    assert json.loads(text) == {"at": "2026-07-01T09:30:15.123456Z", "t": "08:00:00.000001"}
    # Whole milliseconds keep Django's exact text.
    text = codec.encode_state({"at": dt.datetime(2026, 7, 1, 9, 30, 15, 123000, tzinfo=dt.timezone.utc)})
    assert json.loads(text) == {"at": "2026-07-01T09:30:15.123Z"}


def test_none_state_encodes_as_an_empty_object():
    assert codec.encode_state(None) == "{}"


def test_sets_encode_as_sorted_lists_in_results_and_typed_states():
    assert json.loads(codec.encode({"s": {3, 1, 2}}, "result")) == {"s": [1, 2, 3]}

    @dataclasses.dataclass
    class S:
        s: set[int]

    assert json.loads(codec.encode_state({"s": {3, 1, 2}}, state_type=S)) == {"s": [1, 2, 3]}
    assert codec.load_typed(S, json.loads(codec.encode_state(S(s={3, 1, 2})))) == S(s={1, 2, 3})


def test_an_untyped_state_refuses_sets_and_non_dicts():
    """On main a set came back as a list and a list or int state was stored as is."""
    with pytest.raises(SerializationError, match="a set does not round-trip"):
        codec.encode_state({"s": {1}}, "state of M")
    for bad in ([1, 2], 3, "text", (1,)):
        with pytest.raises(SerializationError, match="state of M must be a dict"):
            codec.encode_state(bad, "state of M")


# --- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [
    {"x": object()},
    {"x": b"bytes"},
    {"x": float("nan")},
    {"x": float("inf")},
    {"x": dt.time(12, 0, tzinfo=dt.timezone.utc)},
    {1j: 1},
], ids=["object", "bytes", "nan", "inf", "aware-time", "complex-key"])
def test_non_json_values_raise_serialization_error_naming_what(value):
    with pytest.raises(SerializationError, match="state of tests.Thing is not JSON-serialisable"):
        codec.encode_state(value, "state of tests.Thing")


def test_serialization_error_is_a_type_error():
    with pytest.raises(TypeError):
        codec.encode_state({"x": object()})


def test_payload_over_the_limit_is_rejected_and_at_the_limit_accepted():
    value = {"blob": "x" * 100}
    size = len(codec.encode_state(value))
    assert codec.encode_state(value, limit=size) is not None
    with pytest.raises(SerializationError, match=rf"{size} bytes of JSON, over the {size - 1}-byte limit"):
        codec.encode_state(value, "state", limit=size - 1)


def test_the_limit_counts_bytes_not_characters():
    value = {"name": "é" * 50}
    text = codec.encode_state(value)
    size = len(text.encode())
    assert codec.encode_state(value, limit=size) == text
    with pytest.raises(SerializationError, match="MAX_PAYLOAD_BYTES"):
        codec.encode_state(value, limit=size - 1)


def test_no_limit_means_no_size_check():
    assert len(codec.encode_state({"blob": "x" * 2_000_000})) > 2_000_000


@pytest.mark.parametrize("text", [
    '{"n": 1, "s": "\\u00e9\\u0000"}', "[1, 2.5, null, true]", '"x"', "12", "null", "-1.5e3",
    ' {"a": 1} ', b'{"b": 2}', '{"nested": {"deep": [{"x": []}]}}',
])
def test_loads_decodes_like_json_loads(text):
    # codec.loads scans jsonb text with the C scanner directly; whatever it cannot take
    # whole (surrounding whitespace, bytes) goes through json.loads.
    assert codec.loads(text) == json.loads(text)


@pytest.mark.parametrize("text", ['{"a": 1} x', "", "{", "NaNx"])
def test_loads_rejects_what_json_loads_rejects(text):
    with pytest.raises(json.JSONDecodeError):
        codec.loads(text)


def test_encode_matches_the_stdlib_encoder_and_rejects_cycles():
    value = {"b": [1, 2.5, None, True], "a": "é", "t": (1, 2)}
    assert codec.encode(value, "v") == json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(SerializationError, match="not JSON"):
        codec.encode(cyclic, "v")
    assert codec.encode({"after": "a failed encode"}, "v") == '{"after":"a failed encode"}'


@pytest.mark.parametrize("value, where", [
    ({"x": object()}, "at ['x']"),
    ({"a": 1, "order": {"lines": [1, 2, b"bytes"]}}, "at ['order']['lines'][2]"),
    ({"ok": 1, 1j: 1}, "at key 1j of it"),
])
def test_the_error_names_where_the_unencodable_value_is(value, where):
    with pytest.raises(SerializationError, match=rf"state of tests\.Thing is not JSON-serialisable {re.escape(where)}: "):
        codec.encode_state(value, "state of tests.Thing")


def test_a_model_instance_in_a_state_says_to_store_its_primary_key():
    from django.contrib.auth.models import User

    with pytest.raises(SerializationError) as exc:
        codec.encode_state({"user": User(pk=3, username="a")}, "state of tests.Thing")
    assert str(exc.value).startswith("state of tests.Thing is not JSON-serialisable at ['user']: ")
    assert str(exc.value).endswith("(a User model instance: store its primary key, .pk, and read the row again "
                                   "in the step)")


@pytest.mark.parametrize("make", [
    lambda: (lambda l: (l.append(l), l.append(l), l)[-1])([]),            # a list holding itself twice
    lambda: (lambda d: (d.update(a=d, b=d), d)[-1])({}),                   # a dict likewise
], ids=["list", "dict"])
@pytest.mark.timeout(30)  # without the mechanism the walk never ends (2**50 steps): fail, not hang
def test_a_cyclic_value_is_refused_at_once_naming_where_it_closes(make):
    """The error-path helpers look into each container once: a cycle with fan-out is
    refused as the encoder finds it, not after walking every path through it."""
    with pytest.raises(SerializationError, match=r"at \['x'\]\[(0|'a')\] \(a circular reference: it contains itself\)"):
        codec.encode_state({"x": make()}, "state of tests.Thing")


def test_a_value_deeper_than_the_helpers_look_is_said_to_be_inside_the_deepest_path_they_saw():
    deep = object()
    for _ in range(200):
        deep = [deep]
    with pytest.raises(SerializationError, match=r"is not JSON-serialisable inside (\[0\]){50}: "):
        codec.encode(deep, "state of tests.Thing")
