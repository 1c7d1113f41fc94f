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


def test_an_unknown_partitioner_places_no_key() -> None:
    from tablecast.contract.partitioner import Unplaced
    from tablecast.contract.table_info import BadEntry, TableInfo

    info = TableInfo("t", "t", 4, {"format": "string"}, {"format": "json"}, partitioner="unknown")
    entry = TableInfo.checked("t", info.to_json())
    assert not entry.placed and entry.public()["partitioner"] == "unknown"
    assert entry.partitions_for(b"k") == (0, 1, 2, 3)
    with pytest.raises(Unplaced):
        entry.partition_of(b"k")
    placed = TableInfo("t", "t", 4, {"format": "string"}, {"format": "json"})
    assert placed.placed and placed.partitions_for(b"abc") == (placed.partition_of(b"abc"),)
    # a window table's keys are looked up by their windows: a Kafka Streams store whose
    # inner keys a registry serializer wrote, say
    window = orjson.loads(info.to_json())
    registry = {"format": "confluent-avro", "registry": "http://registry:8081"}
    window.update(
        kind="window",
        extra={"size_ms": 1000},
        attached=True,
        key={**registry, "changelog": "kafka-streams-window"},
    )
    assert not TableInfo.checked("t", orjson.dumps(window)).placed
    # such keys are never computed: a partitioner that would is refused
    window["partitioner"] = "murmur2"
    with pytest.raises(BadEntry, match="looked up"):
        TableInfo.checked("t", orjson.dumps(window))


def test_what_a_node_learns_of_unplaced_keys_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from tablecast.contract.table_info import TableInfo
    from tablecast.query import locate

    monkeypatch.setattr(locate, "MAX_LEARNED", 3)
    router = SimpleNamespace(local=None, routing=None, rpc=None)
    locator = locate.Locator(router)  # type: ignore[arg-type]
    info = TableInfo("t", "t", 4, {"format": "string"}, {"format": "json"}, partitioner="unknown")
    for i, key in enumerate([b"a", b"b", b"c"]):
        locator.learn(info, key, i)
    locator.learn(info, b"a", 3)  # learned again: moved, not one more
    assert [locator.learned(info, k) for k in (b"a", b"b", b"c")] == [3, 1, 2]
    locator.forget(info, b"b")
    assert locator.learned(info, b"b") is None
    locator.learn(info, b"d", 0)
    locator.learn(info, b"e", 0)  # past the bound: starts over
    assert locator.learned(info, b"a") is None and locator.learned(info, b"e") == 0
    # the same table described anew (re-attached) learns anew
    again = TableInfo("t", "t", 4, {"format": "string"}, {"format": "json"}, partitioner="unknown")
    assert locator.learned(again, b"e") is None


def test_keys_asked_of_a_peer_go_in_asks_of_bounded_size() -> None:
    from tablecast.query.locate import ASK_KEY_CHARS, _chunks

    raws = [bytes(100)] * 100
    chunks = _chunks(list(range(100)), raws)
    assert [i for c in chunks for i in c] == list(range(100))
    assert all(sum(2 * len(raws[i]) + 1 for i in c) <= ASK_KEY_CHARS for c in chunks)
    assert len(chunks) > 1
    assert _chunks([0], [bytes(10_000)]) == [[0]]  # one key larger than an ask still goes
