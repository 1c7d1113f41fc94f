from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tablecast import serde
from tablecast.serde import SerdeError

SCHEMA = {
    "type": "record",
    "name": "Invoice",
    "fields": [{"name": "store", "type": "string"}, {"name": "total", "type": "double"}],
}


@given(st.text())
def test_string_round_trip(s: str) -> None:
    sd = serde.string()
    assert sd.deserialize(sd.serialize(s)) == s
    assert sd.parse_text(s) == s


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_long_is_java_big_endian(n: int) -> None:
    sd = serde.long()
    data = sd.serialize(n)
    assert data == n.to_bytes(8, "big", signed=True)
    assert sd.deserialize(data) == n
    assert sd.parse_text(str(n)) == n


def test_long_rejects_bad_input() -> None:
    with pytest.raises(SerdeError):
        serde.long().parse_text("12a")
    with pytest.raises(SerdeError):
        serde.long().deserialize(b"\x00\x01")
    with pytest.raises(SerdeError):
        serde.long().serialize(2**63)


def test_json() -> None:
    sd = serde.json()
    assert sd.deserialize(sd.serialize({"a": [1, 2.5, None]})) == {"a": [1, 2.5, None]}
    assert sd.parse_text('{"id": 3}') == {"id": 3}
    with pytest.raises(SerdeError):
        sd.deserialize(b"{not json")


def test_bytes() -> None:
    sd = serde.bytes()
    assert sd.serialize(b"\x00\xff") == b"\x00\xff"
    assert sd.to_json(b"\xe9") == "é"


@pytest.mark.parametrize("confluent", [False, True])
def test_avro_round_trip_and_wire_format(confluent: bool) -> None:
    sd = serde.avro(SCHEMA, confluent=confluent, schema_id=42)
    data = sd.serialize({"store": "s1", "total": 9.5})
    if confluent:
        assert data[:5] == b"\x00\x00\x00\x00\x2a"
    assert sd.deserialize(data) == {"store": "s1", "total": 9.5}
    with pytest.raises(SerdeError):
        sd.deserialize(b"\x01\x02")


@pytest.mark.parametrize(
    "sd",
    [
        serde.string(),
        serde.json(),
        serde.json("a INT"),
        serde.long(),
        serde.bytes(),
        serde.avro(SCHEMA, confluent=True, schema_id=3),
    ],
)
def test_spec_round_trip(sd: serde.Serde) -> None:
    assert serde.from_spec(sd.spec()) == sd


def test_unknown_spec() -> None:
    with pytest.raises(SerdeError):
        serde.from_spec({"format": "protobuf"})
