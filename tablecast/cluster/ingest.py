"""Ingestion: one consumer thread per node keeps the node's replicas current.

It follows the catalog for tables, holds exactly the partitions the
coordinator puts in :attr:`Ingestor.desired` (restoring new ones from their
store's applied offset, dropping released ones), reads them in batches
(``consume(n)`` is tens of times faster than one ``poll`` per record), applies
each partition's slice of a batch to its store in one call, and marks a
replica caught up when it reaches the end of its partition.

``tables`` and ``replicas`` are replaced, never mutated, so HTTP handlers on
another thread can iterate them safely.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from tablecast.cluster.replica import Replica
from tablecast.kafka.catalog import CatalogReader, TableInfo
from tablecast.kafka.config import client_conf
from tablecast.store import Write

log = logging.getLogger(__name__)

Slot = tuple[str, int]

BATCH = 10_000
CATALOG_EVERY_S = 1.0
WATERMARKS_EVERY_S = 1.0
PROGRESS_EVERY_S = 5.0


class Ingestor:
    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        node_id: str,
        new_replica: Callable[[TableInfo, int, bool], Replica],
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.catalog = CatalogReader(bootstrap_servers, app_id)
        self._new_replica = new_replica
        self.tables: dict[str, TableInfo] = {}
        self.replicas: dict[Slot, Replica] = {}
        #: what the coordinator wants held; None until it has decided once
        self.desired: set[Slot] | None = None
        self._by_topic: dict[str, TableInfo] = {}
        self._consumer = Consumer(
            client_conf(
                bootstrap_servers,
                {
                    "group.id": f"tablecast-node-{app_id}-{node_id}",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "fetch.wait.max.ms": 50,
                    "queued.max.messages.kbytes": 262144,
                    "log_level": 0,
                },
            )
        )
        self.records_applied = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tablecast-ingest", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()
        self.catalog.close()
        for replica in self.replicas.values():
            replica.store.close()

    def _run(self) -> None:
        next_catalog = next_marks = next_note = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_catalog:
                    self._follow_catalog()
                    next_catalog = now + CATALOG_EVERY_S
                self._reconcile()
                if self.replicas:
                    self._ingest_batch()
                else:
                    self._stop.wait(0.1)
                if now >= next_marks:
                    self._refresh_end_offsets()
                    next_marks = now + WATERMARKS_EVERY_S
                if now >= next_note:
                    self._note_progress()
                    next_note = now + PROGRESS_EVERY_S
            except Exception:  # keep ingesting: one bad poll must not stop the node
                log.exception("ingest loop error; retrying")
                self._stop.wait(1.0)

    def _follow_catalog(self) -> None:
        known = self.catalog.poll(timeout=0.0 if self.catalog.loaded else 1.0)
        if known.keys() != self.tables.keys():
            for name in known.keys() - self.tables.keys():
                info = known[name]
                log.info("table %r (%d partitions) from %s", name, info.partitions, info.topic)
            self.tables = dict(known)
            self._by_topic = {t.topic: t for t in known.values()}

    def _reconcile(self) -> None:
        desired = self.desired
        if desired is None:
            return
        desired = {slot for slot in desired if slot[0] in self.tables}
        held = self.replicas.keys()
        if desired == held:
            return
        replicas = dict(self.replicas)
        gone = [replicas.pop(slot) for slot in held - desired]
        if gone:
            self._consumer.incremental_unassign(
                [TopicPartition(r.table.topic, r.partition) for r in gone]
            )
            for r in gone:
                r.store.close()
            log.info("released %d partition(s): %s", len(gone), _slots(gone))
        fresh = [self._open(slot) for slot in sorted(desired - held)]
        for replica in fresh:
            replicas[(replica.table.name, replica.partition)] = replica
        self.replicas = replicas
        if fresh:
            self._consumer.incremental_assign(
                [
                    TopicPartition(r.table.topic, r.partition, r.position or OFFSET_BEGINNING)
                    for r in fresh
                ]
            )
            log.info("restoring %d partition(s): %s", len(fresh), _slots(fresh))

    def _open(self, slot: Slot) -> Replica:
        info, p = self.tables[slot[0]], slot[1]
        lo, hi = self._consumer.get_watermark_offsets(TopicPartition(info.topic, p), timeout=10)
        replica = self._new_replica(info, p, False)
        start = replica.store.applied_offset + 1
        if start > hi:
            # the store is ahead of its topic: the topic was recreated under it,
            # so what the store holds belongs to another life
            log.warning(
                "table %r partition %d: store at offset %d but topic ends at %d; rebuilding it",
                info.name,
                p,
                start - 1,
                hi,
            )
            replica.store.close()
            replica = self._new_replica(info, p, True)
            start = 0
        replica.end_offset = replica.restore_target = hi
        replica.position = max(start, lo)
        return replica

    def _ingest_batch(self) -> None:
        # consume(n, timeout) waits for a full batch or the timeout, which would
        # hold a lone record back: take what is here, else wait for one record only
        msgs = self._consumer.consume(BATCH, 0)
        if not msgs:
            msgs = self._consumer.consume(1, 0.1)
            if not msgs:
                return
            msgs += self._consumer.consume(BATCH - 1, 0)
        slices: dict[tuple[str, int], list[Write]] = defaultdict(list)
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self._reached_end(m.topic(), m.partition(), m.offset())
                else:
                    log.warning("consume error: %s", err)
                continue
            key = m.key()
            if key is None:
                continue  # a table record needs a key; the pipeline never writes one without
            slices[(m.topic(), m.partition())].append(
                Write(key, m.value(), m.offset(), m.timestamp()[1])
            )
        for (topic, partition), writes in slices.items():
            replica = self._replica(topic, partition)
            if replica is None:
                continue  # released while its records were in flight
            replica.store.apply(writes)
            replica.position = writes[-1].offset + 1
            replica.end_offset = max(replica.end_offset, replica.position)
            self.records_applied += len(writes)

    def _replica(self, topic: str, partition: int) -> Replica | None:
        info = self._by_topic.get(topic)
        return self.replicas.get((info.name, partition)) if info else None

    def _reached_end(self, topic: str, partition: int, offset: int) -> None:
        replica = self._replica(topic, partition)
        if replica is None:
            return
        replica.position = max(replica.position, offset)
        replica.end_offset = max(replica.end_offset, offset)
        if not replica.caught_up and replica.position >= replica.restore_target:
            replica.caught_up = True
            log.info(
                "table %r partition %d caught up at offset %d",
                replica.table.name,
                partition,
                offset,
            )

    def _refresh_end_offsets(self) -> None:
        for replica in self.replicas.values():
            tp = TopicPartition(replica.table.topic, replica.partition)
            _, hi = self._consumer.get_watermark_offsets(tp, cached=True)
            if hi is not None and hi >= 0:
                replica.end_offset = max(replica.end_offset, hi)

    def _note_progress(self) -> None:
        restoring = [r for r in self.replicas.values() if not r.caught_up]
        if not restoring:
            return
        done = sum(r.position for r in restoring)
        total = sum(r.restore_target for r in restoring)
        log.info(
            "restoring %d partition(s): %d of %d records (%.0f%%)",
            len(restoring),
            done,
            total,
            100.0 * done / max(total, 1),
        )


def _slots(replicas: list[Replica]) -> str:
    shown = ", ".join(f"{r.table.name}/{r.partition}" for r in replicas[:8])
    return shown + (f" and {len(replicas) - 8} more" if len(replicas) > 8 else "")
