"""The catalog topic: which tables an App serves, and how to read them.

One compacted record per table, keyed by the table's name, with a JSON value
(:class:`TableInfo`). The pipeline writes it; serving nodes read it and so need
neither the App file nor a JVM.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from tablecast import serde
from tablecast.kafka.config import client_conf, producer_conf
from tablecast.kafka.partitioner import Partitioner
from tablecast.kafka.topics import COMPACTED, catalog_topic, ensure_topic


@dataclass(frozen=True)
class TableInfo:
    name: str
    topic: str
    partitions: int
    key: dict[str, Any]
    value: dict[str, Any]
    kind: Literal["kv", "window"] = "kv"
    is_global: bool = False
    store: Literal["rocksdb", "memory"] = "rocksdb"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> TableInfo:
        fields = orjson.loads(data)
        known = {k: v for k, v in fields.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    # rebuilt once per table, not per request: an Avro schema is costly to parse
    @cached_property
    def key_serde(self) -> serde.Serde:
        return serde.from_spec(self.key)

    @cached_property
    def value_serde(self) -> serde.Serde:
        return serde.from_spec(self.value)

    @cached_property
    def partition_of(self) -> Partitioner:
        """serialized key -> partition, as Kafka's Java producer picks it."""
        return Partitioner(self.partitions)

    def public(self) -> dict[str, Any]:
        """The table as `GET /v1/tables` lists it."""
        return {
            "name": self.name,
            "topic": self.topic,
            "partitions": self.partitions,
            "kind": self.kind,
            "global": self.is_global,
            "key_format": self.key["format"],
            "value_format": self.value["format"],
        }


def publish(bootstrap_servers: str, app_id: str, tables: list[TableInfo]) -> None:
    topic = catalog_topic(app_id)
    ensure_topic(bootstrap_servers, topic, 1, COMPACTED)
    producer = Producer(producer_conf(bootstrap_servers))
    for info in tables:
        producer.produce(topic, key=info.name.encode(), value=info.to_json())
    if producer.flush(30) != 0:
        raise RuntimeError(f"could not write the catalog to {topic}")


class CatalogReader:
    """Follows the catalog topic; `poll()` returns the tables known so far.

    ``loaded`` turns true once everything the topic held when the reader
    started has been read, so a node does not call itself ready on half a catalog.
    """

    def __init__(self, bootstrap_servers: str, app_id: str) -> None:
        self.topic = catalog_topic(app_id)
        self._consumer = Consumer(
            client_conf(
                bootstrap_servers,
                {
                    "group.id": f"tablecast-catalog-{app_id}",
                    "enable.auto.commit": False,
                    "log_level": 0,
                },
            )
        )
        self._tp = TopicPartition(self.topic, 0)
        self._initial_end: int | None = None
        self.loaded = False
        self.tables: dict[str, TableInfo] = {}

    def poll(self, timeout: float = 0.0) -> dict[str, TableInfo]:
        if self._initial_end is None:
            md = self._consumer.list_topics(self.topic, timeout=5)
            if self.topic not in md.topics or md.topics[self.topic].error is not None:
                return self.tables
            try:
                _, self._initial_end = self._consumer.get_watermark_offsets(self._tp, timeout=5)
            except KafkaException:
                return self.tables  # just created: not in this client's metadata yet
            self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while True:
            msgs = self._consumer.consume(500, max(0.0, deadline - time.monotonic()))
            for msg in msgs:
                if msg.error() is None and msg.key() is not None:
                    self._apply(msg.key().decode(), msg.value())
            if not self.loaded:
                position = self._consumer.position([self._tp])[0].offset
                self.loaded = self._initial_end == 0 or position >= self._initial_end
            if (self.loaded and not msgs) or time.monotonic() >= deadline:
                return self.tables

    def _apply(self, name: str, value: bytes | None) -> None:
        if value is None:
            self.tables.pop(name, None)
            return
        # a record this version cannot read is skipped: the rest keeps serving
        with contextlib.suppress(orjson.JSONDecodeError, TypeError, serde.SerdeError):
            self.tables[name] = TableInfo.from_json(value)

    def close(self) -> None:
        self._consumer.close()
