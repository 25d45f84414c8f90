"""JSON encoding of states, results and payloads (Django's JSON encoder; docs/guide.md).

Plain dict states are stored as encoded by `DjangoJSONEncoder` (datetime → ISO string,
Decimal → string, UUID → string) and come back as those strings. A machine that
declares `State` as a dataclass (or a pydantic model) gets its values back typed:
the field annotations drive the decoding, so datetime, date, time, timedelta,
Decimal, UUID, nested dataclasses, lists and dicts round-trip exactly.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import threading
import types
import typing
import uuid
from decimal import Decimal
from functools import lru_cache

from django.core.serializers.json import DjangoJSONEncoder
from django.utils.dateparse import parse_date, parse_datetime, parse_duration, parse_time

from .exceptions import SerializationError


class Encoder(DjangoJSONEncoder):
    def default(self, o):
        # DjangoJSONEncoder cuts microseconds to milliseconds; when that would lose
        # digits, keep all six so a datetime (or naive time) survives the round trip.
        if isinstance(o, dt.datetime) and o.microsecond % 1000:
            text = o.isoformat()
            return text[:-6] + "Z" if text.endswith("+00:00") else text
        if isinstance(o, dt.time) and o.microsecond % 1000 and o.utcoffset() is None:
            return o.isoformat()
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            return {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
        dump = getattr(o, "model_dump", None)  # pydantic v2
        if callable(dump):
            return dump(mode="json")
        if isinstance(o, (set, frozenset)):
            if not getattr(_thread, "sets_ok", True):
                raise TypeError("a set does not round-trip through JSON (it would come back as a list): "
                                "store a list, or declare the machine's `State` with a set[...] field")
            return sorted(o, key=repr)
        return super().default(o)


# One shared instance: json.dumps(cls=...) would build an encoder per call (hot path).
# ensure_ascii=False leaves a lone surrogate as a character, so the UTF-8 encoding
# below rejects it (as escaped ASCII it would pass here and fail in Postgres).
_ENCODER = Encoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)
# \u0000 that is not an escaped backslash followed by "u0000": jsonb cannot store NUL.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

try:  # CPython's C encoder, called directly: JSONEncoder.encode adds ~1 µs of Python per value
    from json.encoder import c_make_encoder as _c_make_encoder
    from json.encoder import encode_basestring as _encode_basestring
except ImportError:  # pragma: no cover - a Python without the _json accelerator
    _c_make_encoder = None


_thread = threading.local()


def _dumps(value) -> str:
    """`_ENCODER.encode(value)`, through the C encoder when there is one (same output:
    the stdlib builds this encoder for a one-shot encode of a non-str value). One encoder
    per thread: its circular-reference markers must not be shared."""
    if _c_make_encoder is None or isinstance(value, str):
        return _ENCODER.encode(value)
    encoder = getattr(_thread, "encoder", None)
    if encoder is None:
        encoder = _thread.encoder = _c_make_encoder(
            {}, _ENCODER.default, _encode_basestring, None, ":", ",", False, False, False)
    try:
        return "".join(encoder(value, 0))
    except BaseException:
        _thread.encoder = None  # a failed encode can leave markers behind
        raise


def clean_text(text: str) -> str:
    """Make free text storable in a Postgres text column (NUL and lone surrogates escaped)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def safe_repr(value, fn=repr) -> str:
    """`fn(value)` (repr or str) for messages; never raises, whatever the object does."""
    try:
        text = fn(value)
        if not isinstance(text, str):
            raise TypeError(f"{fn.__name__}() returned {type(text).__name__}")
        return text
    except BaseException as exc:  # noqa: BLE001 - user objects may raise anything
        try:
            name = type(value).__qualname__
        except BaseException:  # noqa: BLE001
            name = "object"
        return f"<{name} ({fn.__name__}() raised {type(exc).__name__})>"


def encode(value, what: str, limit: int | None = None) -> str:
    """Encode `value` as JSON text; raise SerializationError naming `what` on failure.

    limit: the largest accepted size in bytes (GEN_DURABLE['MAX_PAYLOAD_BYTES']).
    """
    try:
        text = _dumps(value)
        # ASCII text holds no lone surrogate and has as many bytes as characters.
        size = len(text) if text.isascii() else len(text.encode("utf-8"))
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise SerializationError(f"{what} is not JSON-serialisable{_where_unencodable(value)}: {exc}"
                                 f"{_model_hint(value)}") from exc
    except RecursionError:  # a cycle the encoder missed, or nesting deeper than Python recurses
        raise SerializationError(f"{what} is nested too deeply to encode as JSON "
                                 "(keep states and payloads to a few dozen levels)") from None
    if "\\u0000" in text and _NUL.search(text):
        raise SerializationError(f"{what} contains a NUL character (\\x00), which Postgres jsonb cannot store")
    if limit is not None and size > limit:
        raise SerializationError(
            f"{what} is {size} bytes of JSON, over the {limit}-byte limit "
            "(GEN_DURABLE['MAX_PAYLOAD_BYTES']); store large data elsewhere and keep a reference"
        )
    return text


_HINT_DEPTH = 50  # levels the error-path helpers below look into


def _where_unencodable(value, path="", depth=0, seen=None) -> str:
    """" at ['user']": the path of the first value in `value` the encoder refuses, for
    the error message (the error path only; "" when it cannot be told). Follows only the
    failing branch; a cycle is named where it closes."""
    seen = set() if seen is None else seen
    seen.add(id(value))
    if depth >= _HINT_DEPTH:
        return f" inside {path}"  # deeper than we look
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else None
    if items is None:
        return ""
    for key, item in items:
        here = f"{path}[{key!r}]"
        if id(item) in seen and isinstance(item, (dict, list, tuple)):
            return f" at {here} (a circular reference: it contains itself)"
        try:
            _dumps(item)
        except (TypeError, ValueError, RecursionError):
            return _where_unencodable(item, here, depth + 1, seen) or f" at {here}"
        if isinstance(value, dict) and not isinstance(key, (str, int, float, bool)) and key is not None:
            return f" at key {key!r} of {path or 'it'}"
    return ""


def _model_hint(value) -> str:
    """A hint for the most common refusal, a Django model instance (request.user, say),
    anywhere in `value` (each container looked into once, at most 10,000 of them); ""
    when there is none."""
    from django.db.models import Model

    stack, seen = [(value, 0)], set()
    while stack and len(seen) < 10_000:
        item, depth = stack.pop()
        if isinstance(item, Model):
            return (f" (a {type(item).__name__} model instance: store its primary key, .pk, and read the row "
                    "again in the step)")
        if depth < _HINT_DEPTH and isinstance(item, (dict, list, tuple)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend((x, depth + 1) for x in reversed(list(item.values() if isinstance(item, dict) else item)))
    return ""


try:  # CPython's C scanner, called directly: json.loads adds ~1 µs of Python per value
    from json.scanner import c_make_scanner as _c_make_scanner
except ImportError:  # pragma: no cover - a Python without the _json accelerator
    _c_make_scanner = None
_SCAN = _c_make_scanner(json.JSONDecoder()) if _c_make_scanner is not None else None


def loads(value):
    """Decode a jsonb value read through Django's connection (it arrives as text)."""
    if type(value) is str and _SCAN is not None:
        # jsonb's text output has no surrounding whitespace: one scan that ends at the
        # end of the text is the whole value; anything else goes through json.loads.
        try:
            obj, end = _SCAN(value, 0)
        except (StopIteration, ValueError):
            return json.loads(value)
        if end == len(value):
            return obj
        return json.loads(value)
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def encode_state(state, what="state", limit=None, state_type=None) -> str:
    """Encode a state; raise SerializationError naming `what`.

    state_type: the machine's `State` (None: untyped). A state is a dict (None: {}) or a
    dataclass / pydantic instance; anything else would not come back as it went in. A
    set in it is refused unless the machine declares `State` (or the state is such an
    instance): the annotations decode a set field back into a set, a plain dict's would
    come back as a list.
    """
    if state is None:
        state = {}
    typed_value = (dataclasses.is_dataclass(state) and not isinstance(state, type)) or (
        callable(getattr(state, "model_dump", None)) and not isinstance(state, type))
    if not isinstance(state, dict) and not typed_value:
        shape = f"a dict or a {state_type.__name__}" if state_type is not None else "a dict (a JSON object)"
        raise SerializationError(f"{what} must be {shape}, got {type(state).__name__} {safe_repr(state)[:80]}"
                                 + ("" if state_type is not None else
                                    "; declare `State` on the machine (a dataclass or pydantic model) for a typed one"))
    before = getattr(_thread, "sets_ok", True)
    _thread.sets_ok = state_type is not None or typed_value
    try:
        return encode(state, what, limit)
    finally:
        _thread.sets_ok = before


def _is_pydantic(tp) -> bool:
    return isinstance(tp, type) and hasattr(tp, "model_validate")


@lru_cache(maxsize=256)
def _hints(cls):
    return typing.get_type_hints(cls)


def convert(tp, value):
    """Convert decoded JSON `value` to the annotated type `tp` (best effort, exact for the types above)."""
    if value is None or tp is typing.Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return convert(args[0], value) if len(args) == 1 else value
    if origin in (list, tuple, set, frozenset) or tp in (list, tuple, set):
        args = typing.get_args(tp)
        items = [convert(args[0], v) for v in value] if args else list(value)
        return (origin or tp)(items) if (origin or tp) is not list else items
    if origin is dict:
        args = typing.get_args(tp)
        if not args:
            return dict(value)
        # JSON keys are strings: an int, float, UUID, date... key type is parsed back.
        key = (lambda k: int(k)) if args[0] is int else (lambda k: float(k)) if args[0] is float \
            else (lambda k: convert(args[0], k))
        return {key(k): convert(args[1], v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return load_typed(tp, value)
    if _is_pydantic(tp):
        return tp.model_validate(value)
    if tp is dt.datetime and isinstance(value, str):
        return parse_datetime(value)
    if tp is dt.date and isinstance(value, str):
        return parse_date(value)
    if tp is dt.time and isinstance(value, str):
        return parse_time(value)
    if tp is dt.timedelta and isinstance(value, str):
        return parse_duration(value)
    if tp is Decimal:
        return Decimal(str(value))
    if tp is uuid.UUID and isinstance(value, str):
        return uuid.UUID(value)
    return value


def load_typed(cls, data):
    """Build `cls` (a dataclass or pydantic model) from decoded JSON; missing keys take defaults."""
    if data is None:
        data = {}
    if isinstance(data, str):  # legacy rows whose jsonb is a JSON string
        data = json.loads(data)
    if _is_pydantic(cls):
        return cls.model_validate(data)
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    return cls(**{k: convert(hints.get(k, typing.Any), v) for k, v in data.items() if k in names})
