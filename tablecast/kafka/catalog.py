"""The catalog topic: which tables an App serves, and how to read them.

One compacted record per table, keyed by the table's name, with a JSON value
(:class:`TableInfo`). The pipeline writes it; serving nodes read it and so need
neither the App file nor a JVM.

Two optional fields of ``extra`` ask the nodes to keep more than the latest
row per key: ``"history_ms": N`` (a positive integer) keeps every
version of every key for N ms of record time, and ``"indexes": ["NAME", ...]``
keeps the secondary indexes whose values the table's records carry in the
header of :mod:`tablecast.kafka.indexes`. Both are for ``kv`` tables only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from tablecast import serde
from tablecast.kafka import batches, indexes
from tablecast.kafka.config import client_conf, producer_conf
from tablecast.kafka.deafness import STATS_MS, DeafCheck, close_in_background, fetching
from tablecast.kafka.partitioner import Partitioner
from tablecast.kafka.topics import COMPACTED, catalog_topic, ensure_topic
from tablecast.store.base import Views

log = logging.getLogger(__name__)

KINDS = ("kv", "window")
STORES = ("rocksdb", "memory")


class BadEntry(ValueError):
    """A catalog record that does not describe a table this version can serve."""


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

    @classmethod
    def checked(cls, name: str, data: bytes) -> TableInfo:
        """The entry recorded under `name`, or :class:`BadEntry` saying what is wrong with it."""
        try:
            fields = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise BadEntry(f"not JSON: {e}") from None
        if not isinstance(fields, dict):
            raise BadEntry("not a JSON object")
        try:
            info = cls(**{k: v for k, v in fields.items() if k in cls.__dataclass_fields__})
        except TypeError as e:
            raise BadEntry(str(e)) from None
        problems = []
        if info.name != name:
            problems.append(f"name {info.name!r} differs from the record key {name!r}")
        if not isinstance(info.topic, str) or not info.topic:
            problems.append(f"topic {info.topic!r} is not a topic name")
        p = info.partitions
        if not isinstance(p, int) or isinstance(p, bool) or p <= 0:
            problems.append(f"partitions {p!r} is not a positive integer")
        if info.kind not in KINDS:
            problems.append(f"kind {info.kind!r} is not one of {KINDS}")
        if info.store not in STORES:
            problems.append(f"store {info.store!r} is not one of {STORES}")
        if not isinstance(info.is_global, bool):
            problems.append("is_global is not a boolean")
        if not isinstance(info.extra, dict):
            problems.append("extra is not an object")
        for side in ("key", "value"):
            spec = getattr(info, side)
            if not isinstance(spec, dict) or not isinstance(spec.get("format"), str):
                problems.append(f"{side} {spec!r} is not a serde spec with a format")
                continue
            try:
                getattr(info, f"{side}_serde")  # built now, once: a spec that cannot is refused
            except Exception as e:  # fastavro raises many kinds on a bad schema
                problems.append(f"{side} serde: {e}")
        if info.kind == "window":
            extra = info.extra if isinstance(info.extra, dict) else {}
            # a session table's windows have no one size: their keys carry start and end
            size = extra.get("session_gap_ms", extra.get("size_ms"))
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                problems.append("a window table needs extra.size_ms or session_gap_ms > 0")
        if isinstance(info.extra, dict):
            problems += _view_problems(info)
        if problems:
            raise BadEntry("; ".join(problems))
        return info

    @cached_property
    def history_ms(self) -> int | None:
        """How long every version of a key is kept (``extra["history_ms"]``); None: not kept."""
        return self.extra.get("history_ms")

    @cached_property
    def indexes(self) -> tuple[str, ...]:
        """The table's secondary indexes (``extra["indexes"]``): what the record header
        :data:`tablecast.kafka.indexes.HEADER` carries values for."""
        return tuple(self.extra.get("indexes", ()))

    @cached_property
    def views(self) -> Views:
        """What a store of this table keeps besides the latest row per key."""
        return Views(self.history_ms, self.indexes)

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
        out = {
            "name": self.name,
            "topic": self.topic,
            "partitions": self.partitions,
            "kind": self.kind,
            "global": self.is_global,
            "key_format": self.key["format"],
            "value_format": self.value["format"],
        }
        if self.history_ms is not None:
            out["history_ms"] = self.history_ms
        if self.indexes:
            out["indexes"] = list(self.indexes)
        return out


def _view_problems(info: TableInfo) -> list[str]:
    """What is wrong with an entry's history and indexes (the contract in docs/table-topics.md)."""
    problems = []
    history = info.extra.get("history_ms")
    if history is not None and (
        not isinstance(history, int) or isinstance(history, bool) or history <= 0
    ):
        problems.append(f"extra.history_ms {history!r} is not a positive integer (ms)")
    names = info.extra.get("indexes")
    if names is not None:
        if not isinstance(names, list) or not all(
            isinstance(n, str) and indexes.NAME.fullmatch(n) for n in names
        ):
            problems.append(
                f"extra.indexes {names!r} is not a list of names (1-64 of A-Z a-z 0-9 _ . -)"
            )
        elif len(set(names)) != len(names):
            problems.append(f"extra.indexes {names!r} names an index twice")
    if (history is not None or names) and info.kind != "kv":
        problems.append("history and indexes are kept for kv tables only")
    return problems


def publish(bootstrap_servers: str, app_id: str, tables: list[TableInfo]) -> None:
    topic = catalog_topic(app_id)
    ensure_topic(bootstrap_servers, topic, 1, COMPACTED)
    producer = Producer(producer_conf(bootstrap_servers))
    for info in tables:
        producer.produce(topic, key=info.name.encode(), value=info.to_json())
    if producer.flush(30) != 0:
        # a KafkaException like any other outage: a starting pipeline waits it out
        raise KafkaException(
            KafkaError(KafkaError._MSG_TIMED_OUT, f"could not write the catalog to {topic} in 30 s")
        )


class CatalogReader:
    """Follows the catalog topic; `poll()` returns the tables known so far.

    ``loaded`` turns true once everything the topic held when the reader
    started has been read, so a node does not call itself ready on half a catalog.
    """

    def __init__(self, bootstrap_servers: str, app_id: str) -> None:
        self.topic = catalog_topic(app_id)
        self._conf = client_conf(
            bootstrap_servers,
            {
                "group.id": f"tablecast-catalog-{app_id}",
                "enable.auto.commit": False,
                "log_level": 0,
                # which partitions are fetched from a connected leader: see deafness
                "statistics.interval.ms": STATS_MS,
                "stats_cb": self._on_stats,
            },
        )
        self._consumer = Consumer(self._conf)
        #: the next offset to read, when a record last came, and the check that replaces a
        #: consumer gone deaf after a broker restart
        self._next = 0
        self._heard = time.monotonic()
        self.deafness = DeafCheck(bootstrap_servers)
        self.consumers_renewed = 0
        self._tp = TopicPartition(self.topic, 0)
        self._initial_end: int | None = None
        self.loaded = False
        self.tables: dict[str, TableInfo] = {}
        #: entries refused, by table name, with why (each logged once); and how many were
        self.bad: dict[str, str] = {}
        self.bad_entries = 0

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
            self.loaded = self._initial_end == 0
        deadline = time.monotonic() + timeout
        while True:
            # waits only while the catalog is not loaded, and only for its first record
            # (consume(500, timeout) waits for 500 records or the whole timeout: a catalog
            # of a few tables kept every node's start waiting that second)
            wait = 0.0 if self.loaded else max(0.0, deadline - time.monotonic())
            msgs = batches.take(self._consumer, 500, wait)
            for msg in msgs:
                if msg.error() is None:
                    self._apply(msg.key(), msg.value(), msg.offset())
                    self._next, self._heard = msg.offset() + 1, time.monotonic()
            self._renew_if_deaf()
            if not self.loaded:
                position = self._consumer.position([self._tp])[0].offset
                self.loaded = position >= self._initial_end
            if (self.loaded and not msgs) or time.monotonic() >= deadline:
                return self.tables

    def _on_stats(self, text: str) -> None:
        if (self.topic, 0) in fetching(text):
            self._heard = time.monotonic()

    def _renew_if_deaf(self) -> None:
        now = time.monotonic()
        end = self.deafness.confirmed(now, {(self.topic, 0): self._heard}).get((self.topic, 0))
        if end is None or end <= self._next:
            return
        log.warning(
            "the catalog reader has read nothing for %.0f s though %s holds more; replacing it",
            self.deafness.deaf_s,
            self.topic,
        )
        old, self._consumer = self._consumer, Consumer(self._conf)
        self._consumer.assign([TopicPartition(self.topic, 0, self._next or OFFSET_BEGINNING)])
        self.consumers_renewed += 1
        self.deafness.replaced(now)
        close_in_background(old)

    def _apply(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        try:
            name = key.decode() if key is not None else None
        except UnicodeDecodeError:
            name = None
        if name is None:
            self._refuse(repr(key), offset, "the record key is not a table name")
            return
        if value is None:
            self.tables.pop(name, None)
            self.bad.pop(name, None)
            return
        # an entry this version cannot serve is left out: the rest keeps serving
        try:
            info = TableInfo.checked(name, value)
        except BadEntry as e:
            self.tables.pop(name, None)
            self._refuse(name, offset, str(e))
            return
        self.bad.pop(name, None)
        self.tables[name] = info

    def _refuse(self, name: str, offset: int, why: str) -> None:
        self.bad_entries += 1
        if self.bad.get(name) != why:
            log.warning(
                "catalog %s offset %d: table %s left out: %s", self.topic, offset, name, why
            )
        self.bad[name] = why

    def close(self) -> None:
        self.deafness.close()
        self._consumer.close()
