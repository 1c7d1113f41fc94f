"""Helpers for the pipeline tests: run an App on the session's broker and Spark,
and read a table topic back as the latest value per key."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from tablecast.kafka.partitioner import partition_for
from tablecast.serde import Serde


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tc-tests-ends"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record `topic` holds now, partition by partition, in offset order."""
    ends = end_offsets(bootstrap, topic)
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "tc-tests-read",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    out: list[Any] = []
    try:
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, 0) for p in todo])
        deadline = time.monotonic() + 60
        while todo:
            assert time.monotonic() < deadline, f"{topic}: partitions {todo} not read to the end"
            # consume() waits for its whole batch or the timeout: keep the timeout short
            for m in c.consume(1000, 0.1):
                if m.error() is not None:
                    if m.error().code() == -191:  # _PARTITION_EOF
                        todo.discard(m.partition())
                    continue
                out.append(m)
                if m.offset() >= ends[m.partition()] - 1:
                    todo.discard(m.partition())
    finally:
        c.close()
    return out


def read_table(bootstrap: str, topic: str, key: Serde, value: Serde) -> dict[Any, Any]:
    """The latest value per key of a table topic; checks each key's partition."""
    records = read_topic(bootstrap, topic)
    partitions = len(end_offsets(bootstrap, topic))
    table: dict[Any, Any] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        assert m.key() is not None, f"{topic}: a record without key"
        assert m.partition() == partition_for(m.key(), partitions), f"{topic}: misplaced key"
        k = key.deserialize(m.key())
        if m.value() is None:
            table.pop(k, None)
        else:
            table[k] = value.deserialize(m.value())
    return table
