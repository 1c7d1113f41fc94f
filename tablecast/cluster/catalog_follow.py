"""Which of the catalog's tables a node serves.

The catalog (:class:`~tablecast.kafka.catalog.CatalogReader`) says which tables
an app has; an entry is served once its topic is checked: it exists, with the
partition count the entry gives. Until then the table is left out, with why
(logged once per reason, shown in ``/readyz`` and the metrics), and checked
again at every look. A table served already is checked again every
RECHECK_S: a topic that gained partitions places its keys anew (the writer's
hash modulo the new count), so its table is left out, loudly, rather than
answering from the wrong partitions.
"""

from __future__ import annotations

import logging
import time

from tablecast.cluster.topicinfo import TopicInfo
from tablecast.contract.table_info import TableInfo
from tablecast.kafka.catalog import CatalogReader

log = logging.getLogger(__name__)

#: how often the partition counts of tables served already are checked again
RECHECK_S = 30.0


class CatalogFollower:
    def __init__(self, catalog: CatalogReader, topics: TopicInfo) -> None:
        self.catalog = catalog
        self._topics = topics
        #: catalog entries left out, with why
        self.left_out: dict[str, str] = {}
        self._seen: dict[str, TableInfo] = {}
        self._rechecked = time.monotonic()

    def usable(self, serving: dict[str, TableInfo]) -> dict[str, TableInfo] | None:
        """The tables to serve from now on, when they are not `serving` (None: keep those)."""
        known = self.catalog.poll(timeout=0.0 if self.catalog.loaded else 1.0)
        recheck = time.monotonic() - self._rechecked >= RECHECK_S
        if known == self._seen and not self.left_out and not recheck:
            return None
        if recheck:
            self._rechecked = time.monotonic()
        unverified = [i for n, i in known.items() if recheck or serving.get(n) != i]
        counts: dict[str, int | None] = {}
        if unverified:
            try:
                counts = self._topics.partitions([i.topic for i in unverified])
            except Exception as e:  # Kafka unreachable: keep what is known, ask again later
                log.debug("cannot list topics: %s", e)
                return None
        usable: dict[str, TableInfo] = {}
        left_out: dict[str, str] = {}
        for name, info in known.items():
            count = counts.get(info.topic)
            if serving.get(name) == info and (count is None or count == info.partitions):
                # served: a topic missing from one answer (a broker restarting) is no reason
                usable[name] = info
                continue
            if count is None:
                left_out[name] = f"its topic {info.topic} does not exist"
            elif count != info.partitions:
                left_out[name] = (
                    f"the catalog says {info.partitions} partitions, topic {info.topic} has {count}"
                )
            else:
                usable[name] = info
        # a node reads a topic for one table: of two entries on one topic, the one served
        # already (else the first by name) stays
        first_on: dict[str, str] = {}
        for name in sorted(usable, key=lambda n: (n not in serving, n)):
            topic = usable[name].topic
            if first_on.setdefault(topic, name) != name:
                left_out[name] = f"table {first_on[topic]!r} is served from topic {topic}"
        for name in left_out.keys() & usable.keys():
            del usable[name]
        for name, why in left_out.items():
            if self.left_out.get(name) != why:
                log.warning("table %r is left out until fixed: %s", name, why)
        for name in self.left_out.keys() - left_out.keys():
            if name in usable:
                log.info("table %r is usable now", name)
        self.left_out = left_out
        self._seen = dict(known)
        if usable == serving:
            return None
        for name in usable.keys() - serving.keys():
            info = usable[name]
            log.info("table %r (%d partitions) from %s", name, info.partitions, info.topic)
        return usable
