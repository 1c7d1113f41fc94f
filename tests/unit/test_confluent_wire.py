"""The Schema Registry wire format, and Avro values decoded to the JSON a table keeps."""

from __future__ import annotations

import datetime
import decimal
import io

import fastavro
import orjson
import pytest

from tablecast.cluster.schema_registry import _avro, _json
from tablecast.contract import confluent_wire


def test_the_head_is_a_zero_and_a_big_endian_id() -> None:
    data = confluent_wire.join(258, b"payload")
    assert data[:5] == b"\x00\x00\x00\x01\x02"
    assert confluent_wire.split(data) == (258, b"payload")
    for bad in (b"", b"\x00\x00\x01", b"\x01\x00\x00\x00\x01x", b"{}"):
        with pytest.raises(ValueError):
            confluent_wire.split(bad)


def test_avro_values_answer_as_json() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {"name": "n", "type": "long"},
            {"name": "raw", "type": "bytes"},
            {
                "name": "amount",
                "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
            },
            {"name": "day", "type": {"type": "int", "logicalType": "date"}},
            {"name": "opt", "type": ["null", "string"], "default": None},
        ],
    }
    row = {
        "n": 2**53 + 1,
        "raw": b"\x00\xff",
        "amount": decimal.Decimal("12.30"),
        "day": datetime.date(2026, 12, 1),
        "opt": None,
    }
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), row)
    decode = _avro(orjson.dumps(schema).decode())
    assert orjson.loads(decode(buf.getvalue())) == {
        "n": 2**53 + 1,
        "raw": "\x00\xff",
        "amount": "12.30",
        "day": "2026-12-01",
        "opt": None,
    }
    with pytest.raises(ValueError, match="not Avro"):
        decode(b"\x02")
    with pytest.raises(ValueError, match="after the Avro record"):
        decode(buf.getvalue() + b"\x00")


def test_json_schema_values_are_their_json() -> None:
    assert _json(b'{"a":1}') == b'{"a":1}'
    with pytest.raises(ValueError, match="not JSON"):
        _json(b"{")


def test_protobuf_message_indexes_are_zigzag_varints() -> None:
    assert confluent_wire.message_indexes(b"\x00msg") == ([0], b"msg")
    assert confluent_wire.message_indexes(b"\x04\x02\x00msg") == ([1, 0], b"msg")
    # an index past 63 takes two varint bytes
    assert confluent_wire.message_indexes(b"\x02\x80\x01msg") == ([64], b"msg")
    for bad in (b"", b"\x04\x02", b"\x01", b"\x02\x01"):  # short; a negative count or index
        with pytest.raises(ValueError):
            confluent_wire.message_indexes(bad)
