"""Secondary indexes: the record header the pipeline writes and the node reads, and the
order-preserving encoding of index values. Both sides import this module; it is the contract.

The pipeline computes a table's index values per row (``materialize(name,
indexes={"train": f})``) and sends them with the row, in the header
:data:`HEADER` of the table-topic record: a JSON object (UTF-8) from index name
to the row's value under that index — a value, a list of values, or ``null``
(none)::

    tc-index: {"train": "IC 512", "stops": ["Bern", "Zürich"], "delay": null}

- A value is a string, an integer (within int64) or a finite float; JSON
  ``true``/``false``, objects, nested lists and NaN are refused. Numbers are one
  kind: ``3`` and ``3.0`` are the same value, and every number sorts before
  every string; strings sort by their UTF-8 bytes.
- A record without the header, a tombstone, and a name that is absent or
  ``null`` give the row no value under that index; a list gives the row every
  value in it (duplicates count once).
- Names are the table's ``extra["indexes"]`` in the catalog; a name the
  catalog does not list is ignored (a pipeline may start writing an index
  before the catalog announces it). A header that is not such an object makes
  the node count the record as bad (metric ``tablecast_bad_records``, reason
  ``bad index``) and keep the row with no index values.

:func:`encode_header` builds the header (what the pipeline calls);
:func:`entries` turns it into what a node stores; :func:`encode_value` is the
byte encoding whose order is the values' order (numbers by value, then
strings), so one ordered scan answers both a lookup and a range.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

#: the record header that carries a row's index values
HEADER = "tc-index"
#: index names: what fits a URL path segment unescaped
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: values under one name in one header, and the bytes of a string value, at most
MAX_VALUES = 1000
MAX_STRING_BYTES = 1024
MAX_INT = 2**63 - 1

IndexValue = str | int | float

_NUMBER = b"\x02"
_STRING = b"\x03"
_END = b"\x00\x00"  # ends an escaped byte string: no escaped byte string contains it
_F64 = struct.Struct(">Q")
_I64 = struct.Struct(">Q")
_SIGN = 1 << 63


class BadIndex(ValueError):
    """An index header or value outside the contract."""


def encode_header(values: Mapping[str, Any]) -> bytes:
    """The header value for a row whose index values are `values` ({name: value | [values] |
    None}); :class:`BadIndex` for anything the contract refuses."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise BadIndex(f"index name {name!r} is not 1-64 of A-Z a-z 0-9 _ . -")
        for v in _listed(name, value):
            encode_value(v)  # refuses what a node would refuse
        out[name] = value
    return orjson.dumps(out)


def decode_header(raw: bytes) -> dict[str, list[IndexValue]]:
    """{name: [values]} of a header; :class:`BadIndex` if it is not one."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadIndex(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadIndex("not a JSON object")
    return {name: _listed(name, value) for name, value in doc.items()}


def entries(raw: bytes | None, names: Iterable[str]) -> tuple[bytes, ...]:
    """What a node stores for a record's header: one ``name + encoded value`` per value of
    each of the table's index `names`, sorted and without duplicates."""
    if raw is None:
        return ()
    return _entries(decode_header(raw), names)


def entries_of(values: Mapping[str, Any], names: Iterable[str]) -> tuple[bytes, ...]:
    """:func:`entries` of index values a node computed itself ({name: value | [values] |
    None}, as a header holds them)."""
    return _entries({name: _listed(name, value) for name, value in values.items()}, names)


def _entries(decoded: Mapping[str, list[IndexValue]], names: Iterable[str]) -> tuple[bytes, ...]:
    out = set()
    for name in names:
        prefix = name_prefix(name)
        for v in decoded.get(name, ()):
            out.add(prefix + encode_value(v))
    return tuple(sorted(out))


def _listed(name: str, value: Any) -> list[IndexValue]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if len(items) > MAX_VALUES:
        raise BadIndex(f"{name}: more than {MAX_VALUES} values")
    for v in items:
        _check(name, v)
    return items


def _check(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        raise BadIndex(f"{name}: {v!r} is not a string, integer or float")
    if isinstance(v, int) and not -MAX_INT - 1 <= v <= MAX_INT:
        raise BadIndex(f"{name}: {v} is outside int64")
    if isinstance(v, float) and not math.isfinite(v):
        raise BadIndex(f"{name}: {v} is not finite")
    if isinstance(v, str) and len(v.encode()) > MAX_STRING_BYTES:
        raise BadIndex(f"{name}: a string value is longer than {MAX_STRING_BYTES} bytes")


def name_prefix(name: str) -> bytes:
    """An index's own part of the keyspace: its name, escaped and ended."""
    return escape(name.encode())


def encode_value(v: IndexValue) -> bytes:
    """The value's bytes; their byte order is the values' order.

    A number is its nearest float64 (bits flipped so that bytes sort as the
    numbers do) and the integer remainder that float loses (0 for floats), so
    every int64 and float is placed exactly and ``3 == 3.0``. A string is its
    UTF-8 bytes with 0x00 escaped, ended by 0x00 0x00: no encoding is a prefix of
    another, so a row's key can follow it.
    """
    _check("value", v)
    if isinstance(v, str):
        return _STRING + escape(v.encode())
    f = float(v) + 0.0  # -0.0 is 0.0
    rest = v - int(f) if isinstance(v, int) else 0
    (bits,) = _F64.unpack(struct.pack(">d", f))
    bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits & _SIGN else bits | _SIGN
    return _NUMBER + _F64.pack(bits) + _I64.pack(rest + _SIGN)


def decode_value(data: bytes, at: int = 0) -> tuple[IndexValue, int]:
    """The value encoded at `data[at:]` and where its encoding ends. An integral number
    comes back as an int (3.0 was stored as the same value as 3)."""
    tag = data[at : at + 1]
    if tag == _NUMBER:
        (bits,) = _F64.unpack_from(data, at + 1)
        (rest,) = _I64.unpack_from(data, at + 9)
        bits = bits ^ _SIGN if bits & _SIGN else bits ^ 0xFFFFFFFFFFFFFFFF
        (f,) = struct.unpack(">d", _F64.pack(bits))
        rest -= _SIGN
        value: IndexValue = f
        if rest or (f.is_integer() and abs(f) <= MAX_INT):
            value = int(f) + rest
        return value, at + 17
    if tag == _STRING:
        raw, end = unescape(data, at + 1)
        return raw.decode(), end
    raise BadIndex("not an encoded index value")


def parse_text(text: str) -> IndexValue:
    """An index value as written in a URL: a JSON number or a JSON string ("quoted"), else the
    text as it is (``IC 512``, ``Bern``). To look up the string ``"12"`` write ``"12"``."""
    try:
        v = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    if isinstance(v, bool) or not isinstance(v, str | int | float):
        return text
    return v


def escape(raw: bytes) -> bytes:
    """`raw` in a form whose byte order is raw's and that nothing else starts with."""
    return raw.replace(b"\x00", b"\x00\xff") + _END


def unescape(data: bytes, at: int = 0) -> tuple[bytes, int]:
    """The bytes escaped at `data[at:]` and where the escaped form ends."""
    end = data.find(_END, at)  # escaped content never holds 0x00 0x00
    if end < 0:
        raise BadIndex("an escaped byte string without its end")
    return data[at:end].replace(b"\x00\xff", b"\x00"), end + 2


def split(composite: bytes) -> tuple[IndexValue, bytes]:
    """An index entry's ``encoded value + row key``, taken apart."""
    value, end = decode_value(composite)
    return value, composite[end:]
