"""The Schema Registry wire format, and Avro values decoded to the JSON a table keeps."""

from __future__ import annotations

import datetime
import decimal
import io

import fastavro
import orjson
import pytest

from tablecast.cluster.schema_registry import _avro, _json, _protobuf
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


PLACE = """syntax = "proto3";
package places;
import "geo/point.proto";
message Place { string city = 1; geo.Point at = 2; }
"""
POINT = """syntax = "proto3";
package geo;
message Point { double lat = 1; double lon = 2; }
"""
CARD = """syntax = "proto3";
package cards;
import "google/protobuf/timestamp.proto";
import "places/place.proto";
message Card { int64 points = 1; places.Place home = 2; google.protobuf.Timestamp since = 3; }
"""


def test_proto_text_with_imports_is_compiled_by_one_protoc_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A schema registered as .proto text (Java's serializer) whose imports are other
    subjects' .proto text, one importing another: protoc compiles them all at once."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    from grpc_tools import protoc

    runs: list[list[str]] = []
    real = protoc.main

    def counted(args: list[str]) -> int:
        runs.append(args)
        return real(args)

    monkeypatch.setattr(protoc, "main", counted)
    decode = _protobuf(CARD, 7, {"places/place.proto": PLACE, "geo/point.proto": POINT})
    assert len(runs) == 1

    # a Card as a writer makes it: the same files, compiled apart from the node's
    from google.protobuf import timestamp_pb2

    pool = descriptor_pool.DescriptorPool()
    stamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(stamp)
    pool.Add(stamp)
    for name, text in (("geo/point.proto", POINT), ("places/place.proto", PLACE)):
        pool.Add(_protobuf_file(name, text))
    pool.Add(_protobuf_file("card.proto", CARD))
    card = message_factory.GetMessageClass(pool.FindMessageTypeByName("cards.Card"))()
    card.points = 2**40
    card.home.city = "Lyon"
    card.home.at.lat = 45.75
    card.since.seconds = 1_700_000_000
    answer = orjson.loads(decode(b"\x00" + card.SerializeToString()))
    assert answer == {
        "points": str(2**40),
        "home": {"city": "Lyon", "at": {"lat": 45.75}},
        "since": "2023-11-14T22:13:20Z",
    }


def _protobuf_file(name: str, text: str) -> object:
    """`text` compiled alone (its imports beside it) as the FileDescriptorProto `name`."""
    from tablecast.cluster.schema_registry import _compiled

    others = {"geo/point.proto": POINT, "places/place.proto": PLACE}
    return _compiled(text, 0, {n: t for n, t in others.items() if n != name}, name)[name]
