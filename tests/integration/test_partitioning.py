"""Records written by Spark's Kafka sink and by confluent-kafka (murmur2_random)
land in the partition that tablecast's partition function predicts."""

from __future__ import annotations

import pytest

from tablecast.contract.partitioner import partition_for
from tablecast.kafka.topics import ensure_topic

from .kafka_io import produce, read_all

pytestmark = pytest.mark.integration

PARTITIONS = 7
KEYS = [f"key-{i}".encode() for i in range(200)] + ["ключ-é".encode(), b"", b"\x00\xff"]


def test_confluent_kafka_with_murmur2_random(bootstrap: str, unique: str) -> None:
    topic = f"{unique}-py"
    ensure_topic(bootstrap, topic, PARTITIONS)
    produce(bootstrap, topic, [(k, b"v") for k in KEYS])
    for m in read_all(bootstrap, topic, len(KEYS)):
        assert m.partition() == partition_for(m.key(), PARTITIONS), m.key()


def test_spark_kafka_sink(bootstrap: str, unique: str, spark) -> None:  # type: ignore[no-untyped-def]
    topic = f"{unique}-spark"
    ensure_topic(bootstrap, topic, PARTITIONS)
    df = spark.createDataFrame([(k, b"v") for k in KEYS], "key binary, value binary")
    df.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option(
        "topic", topic
    ).save()
    got = read_all(bootstrap, topic, len(KEYS))
    assert sorted(m.key() for m in got) == sorted(KEYS)
    for m in got:
        assert m.partition() == partition_for(m.key(), PARTITIONS), m.key()
