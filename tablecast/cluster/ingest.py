"""Ingestion: one consumer thread per node keeps the node's replicas current.

It follows the catalog for tables (:mod:`tablecast.cluster.catalog_follow`),
holds exactly the partitions the coordinator puts in :attr:`Ingestor.desired`
(restoring new ones from their store's applied offset, dropping released ones),
reads them in batches (``consume(n)`` is tens of times faster than one ``poll``
per record), applies each partition's slice of a batch to its store in one
call, and judges each replica's freshness (:mod:`tablecast.cluster.freshness`):
caught up once it reaches the end of its partition.

What can go wrong is contained per partition:

- a record that its table's serdes cannot read is counted, logged with its
  coordinates and stored as a tombstone (see :mod:`tablecast.cluster.validate`);
  one whose index header (:mod:`tablecast.contract.index_codec`) breaks the contract is
  counted and logged alike, and its row kept with no index values;
- a store write that fails (disk full, an I/O error) stops that partition at the
  failed batch: it is taken off the consumer, keeps answering from what it
  holds, and is retried with backoff (a RocksDB store is reopened once the disk
  has room), so it resumes with no gap when the cause clears
  (:mod:`tablecast.cluster.write_recovery`);
- a catalog entry whose topic is missing or has another partition count is
  left out until it is right, and a partition that cannot be opened is retried;
- a replica behind a topic end the broker keeps confirming stops counting as
  caught up; one cut off from Kafka keeps serving and reports its staleness;
- a released partition's store is deleted after a grace period, and a store
  reopened after longer than the topic keeps tombstones restores from scratch.

``tables`` and ``replicas`` are replaced, never mutated, so HTTP handlers on
another thread can iterate them safely.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from tablecast.cluster import freshness, write_recovery
from tablecast.cluster.attached_records import BadRecord, Translate, translation
from tablecast.cluster.catalog_follow import CatalogFollower
from tablecast.cluster.fetchwatch import FetchWatch
from tablecast.cluster.replica import Replica
from tablecast.cluster.schema_registry import RegistryUnavailable
from tablecast.cluster.topicinfo import TopicInfo
from tablecast.cluster.validate import Check, checker
from tablecast.contract import index_codec
from tablecast.contract.index_codec import HEADER
from tablecast.contract.table_info import TableInfo
from tablecast.kafka import batches
from tablecast.kafka.catalog import CatalogReader
from tablecast.kafka.config import client_conf
from tablecast.kafka.deafness import DeafCheck, close_in_background
from tablecast.store import PartitionStore, Write

log = logging.getLogger(__name__)

Slot = tuple[str, int]
#: Write(...) without the named tuple's Python-level __new__: a restore makes one per
#: record, and the call was about 7 % of the ingest thread's samples
_write = partial(tuple.__new__, Write)

#: records taken from the consumer at a time: a restore of a thousand at a time runs in the
#: processor's caches (the messages, their writes and the memory freed after each batch, reused
#: by the next), where ten thousand at a time did not
BATCH = 1_000
CATALOG_EVERY_S = 1.0
ASSESS_EVERY_S = 0.1
FAILED_ENDS_EVERY_S = 1.0
PROGRESS_EVERY_S = 5.0
#: how long a partition end below a store's offset must persist before the store is wiped
SHORT_END_CONFIRM_S = 15.0
#: bad records logged line by line per table; later ones are only counted
BAD_LOGGED_PER_TABLE = 100
OPEN_RETRY_S = 2.0


class Ingestor:
    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        node_id: str,
        new_replica: Callable[[TableInfo, int, bool], Replica],
        drop_store: Callable[[str, int], None] | None = None,
        stored_slots: Callable[[], Iterable[Slot]] | None = None,
        drop_released_after_s: float = 600.0,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._new_replica = new_replica
        self._drop_store = drop_store
        self._stored_slots = stored_slots
        self.drop_released_after_s = drop_released_after_s
        self.tables: dict[str, TableInfo] = {}
        self.replicas: dict[Slot, Replica] = {}
        #: what the coordinator wants held; None until it has decided once
        self.desired: set[Slot] | None = None
        self._by_topic: dict[str, TableInfo] = {}
        self._checks: dict[str, Check] = {}
        self._translations: dict[str, Translate] = {}
        self._index_paths: dict[str, TableInfo] = {}
        #: topic -> the table's index names, for tables that have indexes
        self._indexed: dict[str, tuple[str, ...]] = {}
        self._topics = TopicInfo(bootstrap_servers)
        self.follower = CatalogFollower(CatalogReader(bootstrap_servers, app_id), self._topics)
        self._group = f"tablecast-node-{app_id}-{node_id}"
        self._consumer = self._new_consumer()
        self._fetches = FetchWatch()
        self._witness = freshness.EndWitness()
        #: replaces the consumer if it goes deaf (after a broker restart)
        self.deafness = DeafCheck(bootstrap_servers)
        self.consumers_renewed = 0
        self.records_applied = 0
        #: counters for /metrics
        self.bad_records: dict[tuple[str, str], int] = defaultdict(int)
        self.write_failures = 0
        self.stores_dropped = 0
        self.restored_from_scratch = 0
        self._bad_logged: dict[str, int] = defaultdict(int)
        self._pending_drop: dict[Slot, float] = {}
        self._open_retry: dict[Slot, float] = {}
        self._disk_checked = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tablecast-ingest", daemon=True)

    def _new_consumer(self) -> Consumer:
        return Consumer(
            client_conf(
                self.bootstrap_servers,
                {
                    "group.id": self._group,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "fetch.wait.max.ms": 50,
                    "queued.max.messages.kbytes": 262144,
                    # after a broker outage, reconnect within a second (librdkafka's default
                    # backoff grows to 10 s): until then the replica's known end is stale
                    "reconnect.backoff.max.ms": 1000,
                    "log_level": 0,
                    # the freshest word on each partition's end and on the brokers' state,
                    # without a request per partition
                    "statistics.interval.ms": 1000,
                    "stats_cb": self._on_stats,
                },
            )
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.deafness.close()
        self._consumer.close()
        self.catalog.close()
        for replica in self.replicas.values():
            replica.release()
            replica.store.close()

    def _run(self) -> None:
        next_catalog = next_assess = next_failed = next_note = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            try:
                if now >= next_catalog:
                    self._follow_catalog()
                    self._drop_released(now)
                    next_catalog = now + CATALOG_EVERY_S
                self._reconcile()
                if any(not r.paused for r in self.replicas.values()):
                    self._ingest_batch()
                    self._fetch_stuck_again()
                else:
                    self._stop.wait(0.1)
                now = time.monotonic()
                if now >= next_failed:
                    self._retry_failed(now)
                    self._renew_if_deaf(now)  # a question of seconds: not at every assess
                    next_failed = now + FAILED_ENDS_EVERY_S
                if now >= next_assess:
                    self._assess(now)
                    next_assess = now + ASSESS_EVERY_S
                if now >= next_note:
                    self._note_progress()
                    next_note = now + PROGRESS_EVERY_S
            except Exception:  # keep ingesting: one bad poll must not stop the node
                log.exception("ingest loop error; retrying")
                self._stop.wait(1.0)

    # -- tables ----------------------------------------------------------------
    def _follow_catalog(self) -> None:
        usable = self.follower.usable(self.tables)
        if usable is None:
            return
        self._checks = {i.topic: checker(i) for i in usable.values()}
        self._translations = {
            i.topic: t for i in usable.values() if (t := translation(i)) is not None
        }
        self._by_topic = {t.topic: t for t in usable.values()}
        # indexes whose values come in a header, and those a node takes from the row itself
        self._indexed = {
            i.topic: i.indexes for i in usable.values() if i.indexes and not i.index_paths
        }
        self._index_paths = {i.topic: i for i in usable.values() if i.index_paths}
        self._restart_changed_views(usable)
        self.tables = usable

    @property
    def catalog(self) -> CatalogReader:
        return self.follower.catalog

    @property
    def left_out(self) -> dict[str, str]:
        """Catalog entries left out, with why (tablecast.cluster.catalog_follow)."""
        return self.follower.left_out

    def _restart_changed_views(self, usable: dict[str, TableInfo]) -> None:
        """A table whose history or indexes the catalog changed is restored from its topic:
        its held partitions are let go here and opened again (and started over, as their
        stores held other views) by the next reconcile."""
        changed = {
            name
            for name, info in usable.items()
            if name in self.tables and self.tables[name].views != info.views
        }
        if not changed:
            return
        replicas = dict(self.replicas)
        gone = [replicas.pop(slot) for slot in list(replicas) if slot[0] in changed]
        assigned = [r for r in gone if not r.paused]
        if assigned:
            self._consumer.incremental_unassign(
                [TopicPartition(r.table.topic, r.partition) for r in assigned]
            )
        for r in gone:
            r.release()
            r.store.close()
        self.replicas = replicas
        log.info("tables %s keep other views now: restoring them", ", ".join(sorted(changed)))

    # -- holding partitions ------------------------------------------------------
    def _reconcile(self) -> None:
        desired = self.desired
        if desired is None:
            return
        desired = {slot for slot in desired if slot[0] in self.tables}
        now = time.monotonic()
        if not self._disk_checked and self.catalog.loaded:
            self._disk_checked = True
            self._schedule_unused_drops(desired, now)
        held = self.replicas.keys()
        if desired == held:
            return
        replicas = dict(self.replicas)
        gone = [replicas.pop(slot) for slot in held - desired]
        if gone:
            assigned = [r for r in gone if not r.paused]
            if assigned:
                self._consumer.incremental_unassign(
                    [TopicPartition(r.table.topic, r.partition) for r in assigned]
                )
            for r in gone:
                r.release()  # readers holding it go elsewhere from now on
                r.store.close()
                self._fetches.forget((r.table.name, r.partition))
                self._witness.forget((r.table.name, r.partition))
                self._pending_drop[(r.table.name, r.partition)] = now + self.drop_released_after_s
            log.info("released %d partition(s): %s", len(gone), _slots(gone))
        fresh = []
        for slot in sorted(desired - held):
            if self._open_retry.get(slot, 0.0) > now:
                continue
            try:
                fresh.append(self._open(slot))
                self._open_retry.pop(slot, None)
            except Exception as e:  # one partition that cannot open must not hold up the rest
                if slot not in self._open_retry:
                    log.warning("table %r partition %d cannot be opened yet: %s", *slot, e)
                self._open_retry[slot] = now + OPEN_RETRY_S
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
        tp = TopicPartition(info.topic, p)
        lo, hi = self._consumer.get_watermark_offsets(tp, timeout=10)
        self._pending_drop.pop(slot, None)
        replica = self._new_replica(info, p, False)
        if replica.store.applied_offset + 1 > hi:
            lo, hi = self._confirmed_end(tp, replica.store.applied_offset + 1, lo, hi)
        why = self._outdated(replica, lo, hi)
        if why is not None:
            log.warning("table %r partition %d: %s; restoring it from scratch", info.name, p, why)
            replica.store.close()
            replica = self._new_replica(info, p, True)
            self.restored_from_scratch += 1
        if replica.store.applied_offset < 0:
            # everything an empty store will hold is read from now on, so a tombstone after
            # anything it reads outlives compaction until at least now + delete.retention.ms:
            # a node killed while restoring may resume until then, not start over
            replica.store.mark_synced(int(time.time() * 1000))
        start = replica.store.applied_offset + 1
        replica.end_offset = replica.restore_target = hi
        replica.position = max(start, lo)
        replica.end_seen_at = replica.opened_at = time.monotonic()
        replica.stale_since = replica.opened_at
        return replica

    def _confirmed_end(
        self, tp: TopicPartition, expected: int, lo: int, hi: int
    ) -> tuple[int, int]:
        """The partition's watermarks, asked again while its end reads below `expected`.

        A broker that has just restarted can report a high watermark below what
        it held before for a few seconds. Taken at its word, that looks like a
        topic recreated under the store, which would be wiped and restored from
        a short topic: reads would miss keys while claiming no lag. So a store
        is judged ahead of its topic only if the end stays short for a while.
        """
        deadline = time.monotonic() + SHORT_END_CONFIRM_S
        while hi < expected and time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(0.5)
            try:
                lo, hi = self._consumer.get_watermark_offsets(tp, timeout=5)
            except KafkaException:
                continue
        return lo, hi

    def _outdated(self, replica: Replica, lo: int, hi: int) -> str | None:
        """Why the store cannot resume from its applied offset (None: it can)."""
        applied = replica.store.applied_offset
        if applied < 0:
            return None
        if applied + 1 > hi:
            # the topic was recreated under it: what the store holds belongs to another life
            return f"the store is at offset {applied} but the topic ends at {hi}"
        if applied + 1 < lo:
            return f"the store is at offset {applied} but the topic now starts at {lo}"
        topic = replica.table.topic
        retention = self._topics.delete_retention_ms(topic)
        away_ms = int(time.time() * 1000) - replica.store.synced_ms
        if away_ms > retention:
            # compaction may have removed tombstones of keys the store still holds
            setting = (
                "cannot be read, so it is taken as 0 ms"
                if topic in self._topics.unreadable
                else f"is {retention} ms"
            )
            return (
                f"the store was last in sync {away_ms / 1000:.0f} s ago, and the topic's "
                f"delete.retention.ms {setting}"
            )
        return None

    def _schedule_unused_drops(self, desired: set[Slot], now: float) -> None:
        """Stores a previous run left on disk for partitions not held now are dropped in time."""
        if self._stored_slots is None:
            return
        for slot in self._stored_slots():
            if slot not in desired:
                self._pending_drop.setdefault(slot, now + self.drop_released_after_s)

    def _drop_released(self, now: float) -> None:
        for slot, at in list(self._pending_drop.items()):
            if at > now:
                continue
            del self._pending_drop[slot]
            if slot in self.replicas or self._drop_store is None:
                continue
            try:
                self._drop_store(*slot)
                self.stores_dropped += 1
                log.info("dropped the store of released partition %s/%d", *slot)
            except Exception as e:
                log.warning("could not drop the store of %s/%d: %s", *slot, e)

    # -- reading -----------------------------------------------------------------
    def _ingest_batch(self) -> None:
        msgs = batches.take(self._consumer, BATCH, 0.1)
        if not msgs:
            return
        slices: dict[tuple[str, int], list[Write]] = defaultdict(list)
        # ends reached are taken in after the records before them are applied: a replica's
        # position must never run ahead of its store
        ends: list[tuple[str, int, int]] = []
        checks = self._checks
        translations = self._translations
        index_paths = self._index_paths
        indexed = self._indexed
        #: partitions stopped at a record whose writer schema the registry did not give
        waiting: dict[tuple[str, int], tuple[Write, Exception]] = {}
        #: each partition's last record left out (no key, or a bad one)
        skipped: dict[tuple[str, int], int] = {}
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ends.append((m.topic(), m.partition(), m.offset()))
                else:
                    log.warning("consume error: %s", err)
                continue
            key = m.key()
            topic = m.topic()
            if key is None:
                self._bad(topic, m.partition(), m.offset(), "bad key: none")
                skipped[(topic, m.partition())] = m.offset()
                continue  # a table record needs a key; the pipeline never writes one without
            value = m.value()
            timestamp = m.timestamp()[1]
            translate = translations.get(topic) if translations else None
            if translate is not None:
                slot = (topic, m.partition())
                if slot in waiting:
                    continue  # behind a record that waits for its schema: taken again with it
                try:
                    key, value, timestamp = translate(key, value, timestamp)
                except RegistryUnavailable as e:
                    waiting[slot] = (_write((key, value, m.offset(), timestamp, ())), e)
                    continue
                except BadRecord as e:
                    self._bad(topic, m.partition(), m.offset(), str(e))
                    if e.key is None:
                        skipped[slot] = m.offset()
                        continue
                    key, value = e.key, None
            check = checks.get(topic)
            if check is not None:
                why = check(key, value)
                if why is not None:
                    self._bad(topic, m.partition(), m.offset(), why)
                    value = None  # unreadable: the key reads as absent, not as an older value
            names = indexed.get(topic) if value is not None else None
            index = self._index_entries(m, names) if names else ()
            by_path = index_paths.get(topic) if index_paths and value is not None else None
            if by_path is not None:
                index = self._index_entries_of_row(m, by_path, value)  # type: ignore[arg-type]
            slices[(topic, m.partition())].append(
                _write((key, value, m.offset(), timestamp, index))
            )
        for (topic, partition), writes in slices.items():
            replica = self._replica(topic, partition)
            if replica is None or replica.paused:
                continue  # released, or stopped at a failed write, while its records were in flight
            try:
                replica.apply(writes)
            except Exception as e:
                self._write_failed(replica, writes, e)
                continue
            if replica.failed is not None:
                write_recovery.recovered(replica)
            replica.end_offset = max(replica.end_offset, replica.position)
            self.records_applied += len(writes)
            # waiters count in offsets applied: everything below the position is
            replica.waiters.advanced(replica.position - 1)
        for slot, offset in skipped.items():
            replica = self._replica(*slot)
            # behind a waiting record nothing is applied yet; a failed write stops the rest
            if slot not in waiting and replica is not None and not replica.paused:
                try:
                    replica.skip_past(offset)
                except Exception as e:  # the next record's write moves past it as well
                    log.warning("table %r partition %d: offset %d: %s", *slot, offset, e)
                    continue
                if replica.failed is not None:  # retried past the record it had stopped at
                    write_recovery.recovered(replica)
        for (topic, partition), (write, error) in waiting.items():
            replica = self._replica(topic, partition)
            if replica is not None and not replica.paused:
                self._stop_at(replica, [write], error, "reading the writer schema of")
        for topic, partition, offset in ends:
            if (topic, partition) not in waiting:
                self._reached_end(topic, partition, offset)

    def _fetch_stuck_again(self) -> None:
        """Restart the fetch of partitions the statistics show stuck (see fetchwatch)."""
        for slot, why in self._fetches.taken().items():
            replica = self.replicas.get(slot)
            if replica is None or replica.paused:
                continue
            log.warning(
                "table %r partition %d: %s: fetching again from offset %d",
                *slot,
                why,
                replica.position,
            )
            at = replica.position or OFFSET_BEGINNING  # as when it was assigned
            tp = TopicPartition(replica.table.topic, replica.partition, at)
            try:
                self._consumer.seek(tp)
            except Exception as e:  # the next statistics find it stuck again and retry
                log.warning("table %r partition %d: fetching again failed: %s", *slot, e)

    def _renew_if_deaf(self, now: float) -> None:
        """Replace the consumer when it has confirmed nothing of a held partition for a
        while though the broker answers a fresh client about it (see deafness)."""
        assigned = [r for r in self.replicas.values() if not r.paused]
        # the statistics confirm a partition's end every second while its leader is up
        heard = {(r.table.topic, r.partition): r.end_seen_at for r in assigned}
        deaf = self.deafness.confirmed(now, heard)
        if not deaf:
            return
        log.warning(
            "the table consumer has confirmed nothing of %s for %.0f s while the broker "
            "answers a fresh client; replacing it (each partition fetched again from its "
            "replica's position)",
            ", ".join(f"{t}/{p}" for t, p in deaf),
            self.deafness.deaf_s,
        )
        old, self._consumer = self._consumer, self._new_consumer()
        self._fetches = FetchWatch()
        self._witness = freshness.EndWitness()
        self.consumers_renewed += 1
        self.deafness.replaced(now)
        if assigned:
            self._consumer.incremental_assign(
                [
                    TopicPartition(r.table.topic, r.partition, r.position or OFFSET_BEGINNING)
                    for r in assigned
                ]
            )
        close_in_background(old)

    def _index_entries(self, m: Message, names: tuple[str, ...]) -> tuple[bytes, ...]:
        """The record's index entries from its header; none, counted as a bad record, when
        the header breaks the contract (the row itself is kept)."""
        headers = m.headers()
        raw = None
        for name, value in headers or ():
            if name == HEADER:
                raw = value
        try:
            return index_codec.entries(raw, names)
        except index_codec.BadIndex as e:
            self._bad(m.topic(), m.partition(), m.offset(), f"bad index: {e}")
            return ()

    def _index_entries_of_row(self, m: Message, info: TableInfo, value: bytes) -> tuple[bytes, ...]:
        """The row's index entries by the table's paths; none, counted as a bad record, for
        a value a path selects that the index contract refuses (the row itself is kept)."""
        try:
            row = orjson.loads(value)
            values = {}
            for name, path in info.index_paths.items():
                found: list[Any] = []
                for v in path.values(row):
                    if isinstance(v, list):
                        found.extend(v)
                    elif v is not None:
                        found.append(v)
                values[name] = found
            return index_codec.entries_of(values, info.indexes)
        except (index_codec.BadIndex, orjson.JSONDecodeError) as e:
            self._bad(m.topic(), m.partition(), m.offset(), f"bad index: {e}")
            return ()

    def _replica(self, topic: str, partition: int) -> Replica | None:
        info = self._by_topic.get(topic)
        return self.replicas.get((info.name, partition)) if info else None

    def _bad(self, topic: str, partition: int, offset: int, why: str) -> None:
        info = self._by_topic.get(topic)
        table = info.name if info else topic
        self.bad_records[(table, why.split(":", 1)[0])] += 1
        logged = self._bad_logged[table]
        if logged < BAD_LOGGED_PER_TABLE:
            self._bad_logged[table] = logged + 1
            log.warning(
                "table %r partition %d offset %d: %s; kept out of answers",
                table,
                partition,
                offset,
                why,
            )
            if logged + 1 == BAD_LOGGED_PER_TABLE:
                log.warning("table %r: further bad records are only counted (metrics)", table)

    def _reached_end(self, topic: str, partition: int, offset: int) -> None:
        replica = self._replica(topic, partition)
        if replica is not None and not replica.paused:
            freshness.reached_end(replica, offset, time.monotonic())

    def _on_stats(self, text: str) -> None:
        """librdkafka's statistics (on this thread, inside consume)."""
        freshness.note_statistics(
            text, self._by_topic, self.replicas, self._fetches, self._witness, time.monotonic()
        )

    # -- freshness -----------------------------------------------------------------
    def _assess(self, now: float) -> None:
        """Staleness and caught-up state of every replica, from what the broker last confirmed."""
        wall_ms = time.time() * 1000
        for replica in list(self.replicas.values()):
            freshness.judge(replica, now, wall_ms)

    # -- failed writes (tablecast.cluster.write_recovery) ---------------------------
    def _write_failed(self, replica: Replica, writes: list[Write], error: Exception) -> None:
        self.write_failures += 1
        self._stop_at(replica, writes, error, write_recovery.STORE_WRITE)

    def _stop_at(self, replica: Replica, writes: list[Write], error: Exception, doing: str) -> None:
        write_recovery.failed(replica, writes, error, doing)
        # off the consumer: what it had fetched beyond the failed batch is dropped, and
        # the partition is assigned again at the failed batch when it is retried
        self._consumer.incremental_unassign(
            [TopicPartition(replica.table.topic, replica.partition)]
        )

    def _retry_failed(self, now: float) -> None:
        for replica in list(self.replicas.values()):
            if not replica.paused:
                continue
            tp = TopicPartition(replica.table.topic, replica.partition)
            try:  # the partition is off the consumer: ask the broker for its end directly
                _, hi = self._consumer.get_watermark_offsets(tp, timeout=1.0)
                replica.end_offset = max(replica.end_offset, hi)
                replica.end_seen_at = now
            except Exception as e:
                log.debug("end of %s/%d unknown: %s", *_slot(replica), e)
            reopen = partial(self._reopened_store, replica)
            if write_recovery.retry(replica, now, reopen):
                self._consumer.incremental_assign(
                    [TopicPartition(replica.table.topic, replica.partition, replica.position)]
                )

    def _reopened_store(self, replica: Replica) -> PartitionStore:
        return self._new_replica(replica.table, replica.partition, False).store

    def _note_progress(self) -> None:
        restoring = [r for r in self.replicas.values() if not r.restored]
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


def _slot(replica: Replica) -> Slot:
    return replica.table.name, replica.partition


def _slots(replicas: list[Replica]) -> str:
    shown = ", ".join(f"{r.table.name}/{r.partition}" for r in replicas[:8])
    return shown + (f" and {len(replicas) - 8} more" if len(replicas) > 8 else "")
