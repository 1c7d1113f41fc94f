"""A key read answered on the node itself becomes gRPC's Row straight from the record, and
says what the HTTP body of the same read says; so do the rows of a batch or a range."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from tablecast import serde
from tablecast.grpc.service import found_response, json_text, row_of, row_of_entry
from tablecast.proto import tables_pb2 as pb
from tablecast.query.local import entry
from tablecast.store import Record
from tests.support.nodes import PLAIN_INFO

POINT = {"type": "record", "name": "Point", "fields": [{"name": "x", "type": "long"}]}
CASES = [
    # (key serde, value serde, key bytes, stored value)
    (serde.string(), serde.json(), b"card 7", b'{"points": 12,  "tier": ["gold"]}'),
    (serde.long(), serde.json(), serde.long().serialize(42), b"[1, 2.5, null]"),
    (serde.string(), serde.avro(POINT), b"p", serde.avro(POINT).serialize({"x": -3})),
    (serde.string(), serde.string(), b"k", "caf\u00e9".encode()),
]


@pytest.mark.parametrize(("key", "value", "raw", "stored"), CASES)
def test_a_row_says_what_the_http_body_says(
    key: serde.Serde, value: serde.Serde, raw: bytes, stored: bytes
) -> None:
    info = dataclasses.replace(PLAIN_INFO, key=key.spec(), value=value.spec())
    record = Record(stored, 17, 1_700_000_000_000)
    # a forwarded read's Row is made of the peer's HTTP body, parsed
    forwarded = row_of_entry(orjson.loads(entry(info, raw, 0, record)))
    assert pb.Row.FromString(row_of(info, raw, 0, record)) == forwarded


def test_a_json_value_comes_compact() -> None:
    row = pb.Row.FromString(row_of(PLAIN_INFO, b"k", 0, Record(b'{ "a" : [1,  2] }', 3, 4)))
    assert (row.key, row.value, row.offset, row.timestamp) == ("k", '{"a":[1,2]}', 3, 4)


@pytest.mark.parametrize(
    "stored", [b'{ "a" : [1,  2], "b": "caf\xc3\xa9" }', b"[1, 2.5, null]", b'"x"', b"17"]
)
def test_a_many_row_value_says_the_same_read_here_or_by_a_peer(stored: bytes) -> None:
    """A batch's or a range's value read here comes as stored (a JSON table's bytes), one a
    peer answered comes parsed from its HTTP body: both give one compact text."""
    here = serde.json().to_json(stored)
    by_peer = orjson.loads(orjson.dumps({"value": here}))["value"]
    assert json_text(here) == json_text(by_peer) == orjson.dumps(orjson.loads(stored)).decode()


def test_a_found_answer_made_of_row_bytes_is_the_message() -> None:
    row = row_of(PLAIN_INFO, b"k", 3, Record(b'{"a": 1}', 9, 10))
    headers = [
        ("x-tablecast-position", "3:10"),
        ("x-tablecast-node", "n1"),
        ("x-tablecast-lag", "2"),
    ]
    got = pb.GetResponse.FromString(found_response(row, headers))
    assert got == pb.GetResponse(
        found=True, row=pb.Row.FromString(row), position="3:10", node="n1", lag=2
    )
