"""The JSON check of table records (cluster/validate.py): simdjson first, orjson for what it
refuses, together exactly orjson's verdict, on tricky values and on mutated JSON."""

from __future__ import annotations

import json
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tablecast import serde
from tablecast.cluster.validate import NOT_JSON, checker
from tablecast.contract.table_info import TableInfo
from tablecast.serde import json_check

check = json_check(NOT_JSON)


def orjson_accepts(value: bytes) -> bool:
    try:
        orjson.loads(value)
    except orjson.JSONDecodeError:
        return False
    return True


@pytest.mark.parametrize(
    "value",
    [
        b'{"a": 1}',
        b" [1, 2.5e-3, null, true] \n",
        b'"\xc3\xa9\xf0\x9f\x98\x80"',
        b"\xef\xbb\xbf{}",  # a byte-order mark: simdjson skips it, orjson refuses
        b"99999999999999999999999",  # beyond 64 bits: simdjson refuses, orjson takes it
        b"-9223372036854775809",
        b"1e400",
        b"1e-400",
        b'"\\ud800"',
        b'"\\ud83d\\ude00"',
        b'"\xed\xa0\x80"',
        b'"\xff"',
        b'"\x1f"',
        b"[" * 1024 + b"]" * 1024,
        b"[" * 1025 + b"]" * 1025,
        b'{"a":' * 1024 + b"1" + b"}" * 1024,
        b"",
        b"1 2",
        b'{"a":1}\x00',
        b"NaN",
    ],
)
def test_the_check_is_orjson_s_verdict(value: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (check(value) is None) == orjson_accepts(value)
    # a Spark worker without pysimdjson: orjson alone, the same verdict and reason
    monkeypatch.setitem(sys.modules, "simdjson", None)  # import raises ImportError
    assert json_check(NOT_JSON)(value) == check(value)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
PIECES = [bytes([b]) for b in b'{}[]":,\\ue01.-+E tn\x00\x1f\x7f\x80\xc3\xed\xf0\xff'] + [
    b"\\ud800",
    b"\\udc00",
    b"1e400",
    b"\xef\xbb\xbf",
    b"\xf4\x90\x80\x80",
    b"\xc0\xaf",
]


@settings(max_examples=400, deadline=None)
@given(
    JSON,
    st.booleans(),
    st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([None, *PIECES])), max_size=3),
)
def test_the_check_agrees_with_orjson_on_mutated_json(
    doc: object, ascii_only: bool, edits: list[tuple[int, bytes | None]]
) -> None:
    value = bytearray(json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
    for at, piece in edits:
        at %= len(value) + 1
        if piece is None:
            del value[at : at + 1]
        else:
            value[at:at] = piece
    raw = bytes(value)
    got = check(raw)
    assert (got is None) == orjson_accepts(raw), raw
    if got is not None:
        assert got.startswith("bad value: not JSON: ")


def test_a_string_json_table_checks_keys_and_values() -> None:
    info = TableInfo("kv", "t", 1, serde.string().spec(), serde.json().spec())
    check_record = checker(info)
    assert check_record(b"k", b'{"a": 1}') is None
    assert check_record("é".encode(), None) is None  # a delete: nothing to check
    assert (check_record(b"\xff", b"1") or "").startswith("bad key: not UTF-8")
    assert (check_record(b"k", b"{") or "").startswith("bad value: not JSON")
