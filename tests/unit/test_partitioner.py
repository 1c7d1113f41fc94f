"""murmur2 and the partition function against Kafka's own numbers."""

from __future__ import annotations

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
