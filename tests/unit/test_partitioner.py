"""murmur2 and the partition function against Kafka's own numbers."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tablecast.contract.partitioner import murmur2, partition_for

# Kafka's UtilsTest.testMurmur2 vectors (clients/src/test/.../utils/UtilsTest.java)
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_is_positive_hash_mod_partitions() -> None:
    # -790332482 & 0x7fffffff = 1357151166; mod 30 = 6
    assert partition_for(b"foobar", 30) == 1357151166 % 30
    assert partition_for(b"foobar", 1) == 0
    with pytest.raises(ValueError):
        partition_for(b"x", 0)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=1, max_value=1000))
def test_partition_in_range(data: bytes, partitions: int) -> None:
    assert 0 <= partition_for(data, partitions) < partitions


def test_consistent_random_is_crc32_mod_partitions() -> None:
    # CRC-32 (ISO-HDLC) of "123456789" is 0xCBF43926, librdkafka's rd_crc32 check value
    assert partition_for(b"123456789", 1000, "consistent_random") == 0xCBF43926 % 1000
    assert partition_for(b"foobar", 30, "consistent_random") != partition_for(b"foobar", 30)


def test_a_catalog_entry_names_a_known_partitioner() -> None:
    from tablecast.contract.table_info import BadEntry, TableInfo

    info = TableInfo("t", "t", 4, {"format": "string"}, {"format": "json"})
    assert info.partitioner == "murmur2" and info.public()["partitioner"] == "murmur2"
    crc = TableInfo.checked("t", info.to_json().replace(b'"murmur2"', b'"consistent_random"'))
    assert crc.partition_of(b"123456789") == 0xCBF43926 % 4
    with pytest.raises(BadEntry, match="partitioner 'fnv'"):
        TableInfo.checked("t", info.to_json().replace(b'"murmur2"', b'"fnv"'))
    # an entry of a version before partitioners is Java's
    old = orjson.loads(info.to_json())
    del old["partitioner"], old["attached"]
    assert TableInfo.checked("t", orjson.dumps(old)).partitioner == "murmur2"
