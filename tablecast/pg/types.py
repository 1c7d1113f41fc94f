"""The PostgreSQL types a table's columns come as, each with its OID and its text and
binary forms (what a client asks for per column at Bind)."""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import orjson

_EPOCH_2000_MS = 946_684_800_000


@dataclass(frozen=True)
class PgType:
    name: str
    oid: int
    #: the type's size in bytes, -1 when variable
    size: int
    text: Callable[[Any], bytes]
    binary: Callable[[Any], bytes]


def _text_of_text(v: Any) -> bytes:
    return str(v).encode()


def _json(v: Any) -> bytes:
    return orjson.dumps(v)


def _bool_text(v: Any) -> bytes:
    return b"t" if v else b"f"


def _timestamp_text(ms: Any) -> bytes:
    t = dt.datetime.fromtimestamp(int(ms) / 1000, tz=dt.UTC)
    return (t.strftime("%Y-%m-%d %H:%M:%S") + f".{t.microsecond // 1000:03d}+00").encode()


def _timestamp_binary(ms: Any) -> bytes:
    return struct.pack(">q", (int(ms) - _EPOCH_2000_MS) * 1000)


def _float_text(v: Any) -> bytes:
    f = float(v)
    if f != f:
        return b"NaN"
    if f in (float("inf"), float("-inf")):
        return b"Infinity" if f > 0 else b"-Infinity"
    return repr(f).encode()


def _numeric_text(v: Any) -> bytes:
    d = v if isinstance(v, Decimal) else Decimal(str(v))
    return (format(d, "f") if d.is_finite() else "NaN").encode()


def _numeric_binary(v: Any) -> bytes:
    """NUMERIC's binary form: base-10000 digits, weight, sign and display scale."""
    d = v if isinstance(v, Decimal) else Decimal(str(v))
    if not d.is_finite():
        return struct.pack(">hhHh", 0, 0, 0xC000, 0)
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    scale = max(0, -exp)
    text = "".join(map(str, digits))
    # split the integer and fraction parts into groups of four decimal digits
    if exp >= 0:
        whole, frac = text + "0" * exp, ""
    else:
        whole, frac = text[:exp] or "0", text[exp:].rjust(-exp, "0")
    whole = whole.lstrip("0")
    whole = "0" * (-len(whole) % 4) + whole
    frac = frac + "0" * (-len(frac) % 4)
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    fgroups = [int(frac[i : i + 4]) for i in range(0, len(frac), 4)]
    weight = len(groups) - 1
    allg = groups + fgroups
    while allg and allg[0] == 0:  # leading zero groups move the weight down
        allg.pop(0)
        weight -= 1
    while allg and allg[-1] == 0:
        allg.pop()
    if not allg:
        weight = 0
    head = struct.pack(">hhHh", len(allg), weight, 0x4000 if sign else 0, scale)
    return head + b"".join(struct.pack(">H", g) for g in allg)


TEXT = PgType("text", 25, -1, _text_of_text, _text_of_text)
INT8 = PgType("bigint", 20, 8, _text_of_text, lambda v: struct.pack(">q", int(v)))
INT4 = PgType("integer", 23, 4, _text_of_text, lambda v: struct.pack(">i", int(v)))
FLOAT8 = PgType("double precision", 701, 8, _float_text, lambda v: struct.pack(">d", float(v)))
BOOL = PgType("boolean", 16, 1, _bool_text, lambda v: b"\x01" if v else b"\x00")
NUMERIC = PgType("numeric", 1700, -1, _numeric_text, _numeric_binary)
JSONB = PgType("jsonb", 3802, -1, _json, lambda v: b"\x01" + _json(v))
TIMESTAMPTZ = PgType("timestamp with time zone", 1184, 8, _timestamp_text, _timestamp_binary)

#: what a cast names -> the type it makes (sqlglot's names of PostgreSQL's types)
CASTS: dict[str, PgType] = {
    "TEXT": TEXT,
    "VARCHAR": TEXT,
    "CHAR": TEXT,
    "BIGINT": INT8,
    "INT": INT4,
    "SMALLINT": INT4,
    "DOUBLE": FLOAT8,
    "FLOAT": FLOAT8,
    "DECIMAL": NUMERIC,
    "BOOLEAN": BOOL,
    "JSONB": JSONB,
    "JSON": JSONB,
}


def plain(value: Any) -> Any:
    """A JSON value as Python's own types: the read core hands stored JSON over unparsed
    (an ``orjson.Fragment``) where it only passes it on."""
    if isinstance(value, orjson.Fragment):
        return orjson.loads(orjson.dumps(value))
    return value


class CastFailed(ValueError):
    """A value that the cast's type cannot hold (SQLSTATE 22P02)."""


def cast(value: Any, to: PgType) -> Any:
    """`value` (a JSON value, or text) as `to` holds it; None stays None."""
    if value is None:
        return None
    value = plain(value)
    try:
        if to is TEXT:
            return value if isinstance(value, str) else orjson.dumps(value).decode()
        if to is JSONB:
            return orjson.loads(value) if isinstance(value, str) else value
        if to in (INT8, INT4):
            if isinstance(value, bool):
                raise CastFailed(f"invalid input syntax for type {to.name}: {value!r}")
            n = int(value) if isinstance(value, int) else int(str(value).strip())
            if to is INT4 and not -(2**31) <= n < 2**31:
                raise CastFailed(f"value {n} is out of range for type integer")
            return n
        if to is FLOAT8:
            return float(value)
        if to is NUMERIC:
            return Decimal(str(value))
        if to is BOOL:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("t", "true", "yes", "on", "1"):
                return True
            if text in ("f", "false", "no", "off", "0"):
                return False
            raise CastFailed(f"invalid input syntax for type boolean: {value!r}")
    except (ValueError, InvalidOperation, orjson.JSONDecodeError) as e:
        if isinstance(e, CastFailed):
            raise
        raise CastFailed(f"invalid input syntax for type {to.name}: {value!r}") from None
    raise CastFailed(f"no cast to {to.name}")


def encode(value: Any, t: PgType, binary: bool) -> bytes | None:
    if value is None:
        return None
    return t.binary(value) if binary else t.text(value)


def decode_parameter(data: bytes | None, oid: int, binary: bool) -> Any:
    """A Bind parameter's value: text as it came (the statement's context types it), or a
    binary one of the integer, text, float and bool types."""
    if data is None:
        return None
    if not binary:
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise CastFailed("a text parameter that is not UTF-8") from None
    if oid == 20 and len(data) == 8:
        return struct.unpack(">q", data)[0]
    if oid == 23 and len(data) == 4:
        return struct.unpack(">i", data)[0]
    if oid == 21 and len(data) == 2:
        return struct.unpack(">h", data)[0]
    if oid == 701 and len(data) == 8:
        return struct.unpack(">d", data)[0]
    if oid == 16 and len(data) == 1:
        return data != b"\x00"
    if oid in (0, 25, 1043, 19, 18):
        try:
            return data.decode()
        except UnicodeDecodeError:
            raise CastFailed("a text parameter that is not UTF-8") from None
    if oid in (1114, 1184) and len(data) == 8:  # microseconds since 2000-01-01 UTC
        return struct.unpack(">q", data)[0] // 1000 + _EPOCH_2000_MS
    if oid == 3802 and data[:1] == b"\x01":
        return data[1:].decode()
    raise CastFailed(f"a binary parameter of type {oid} is not supported")
