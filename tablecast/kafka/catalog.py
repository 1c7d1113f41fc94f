"""The catalog topic: which tables an App serves, and how to read them.

One compacted record per table, keyed by the table's name, with a JSON value (a
:class:`~tablecast.contract.table_info.TableInfo`). The pipeline writes it; serving
nodes read it and so need neither the App file nor a JVM.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from tablecast.contract.table_info import TableInfo
from tablecast.kafka import batches
from tablecast.kafka.config import client_conf, producer_conf
from tablecast.kafka.deafness import STATS_MS, DeafCheck, close_in_background, fetching
from tablecast.kafka.topics import COMPACTED, catalog_topic, ensure_topic

log = logging.getLogger(__name__)


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
        except Exception as e:  # BadEntry, or a check this version did not foresee
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
