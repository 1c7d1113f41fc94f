"""Table-topic records for watches: the node's one shared consumer, and private catch-up readers.

The **feed** is one consumer thread per node that reads every table partition
some watch on this node needs, whether or not the node holds a replica of it.
A watch so depends on nothing but the topic: it survives the partition moving
to another node, or its owner dying, and any node can serve any watch. The
feed hands each batch it consumes to the event loop with one
``call_soon_threadsafe`` (not one per record, nor per watcher), and takes the
next batch only when the loop has taken all but a few: a loop that falls
behind slows the feed, never the other way round.

A **catch-up** reader is a private consumer for one watch that must start
below what the feed still holds in memory (a resume with an old token): it
reads from the watch's position until the watch can join the feed, then
closes. At most a few run at once (see the hub).

Records are checked with the table's serdes as the node's ingestion checks
them: a record whose key or value does not decode reads as a delete, exactly
as the stores hold it, and one whose key cannot be shown is not delivered.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from tablecast.cluster.attached_records import BadRecord, Translate
from tablecast.cluster.schema_registry import RegistryUnavailable
from tablecast.kafka import batches
from tablecast.kafka.config import client_conf
from tablecast.kafka.deafness import (
    STATS_MS,
    DeafCheck,
    close_in_background,
    ends_from_a_fresh_client,
    fetching,
)
from tablecast.live.events import Change, Check, Renderer

log = logging.getLogger(__name__)

BATCH = 5_000
#: batches handed to the loop and not yet taken; the feed waits beyond this
IN_FLIGHT = 4

Slot = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class Source:
    """How to turn one table topic's records into changes."""

    topic: str
    renderer: Renderer
    check: Check
    #: how the topic's records become the table's (a Debezium event its row), if they differ
    translate: Translate | None = None


@dataclass
class Batch:
    """What one consume gave, per partition: the changes in offset order and, when the
    partition's end was reached, that end (every record below it has been read)."""

    #: (topic, partition) -> (assignment generation, changes)
    changes: dict[Slot, tuple[int, list[Change]]]
    #: (topic, partition) -> (assignment generation, end offset)
    ends: dict[Slot, tuple[int, int]]


def _conf(bootstrap: str, group: str) -> dict[str, object]:
    return client_conf(
        bootstrap,
        {
            # offsets are never committed: every assignment names its own start
            "group.id": group,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # a fetch answers as soon as one record is there; this only bounds an idle poll
            "fetch.wait.max.ms": 20,
            "reconnect.backoff.max.ms": 1000,
            "log_level": 0,
        },
    )


def convert(
    source: Source,
    partition: int,
    key: bytes | None,
    value: bytes | None,
    offset: int,
    ts: int,
    stopping: Callable[[], bool] = lambda: False,
) -> Change | None:
    """A record as a change, read as the node's stores read it (None: never delivered).
    A change whose writer schema the registry does not give yet waits for it, until
    `stopping` says the feed is stopping."""
    if key is None:
        return None
    while source.translate is not None:
        try:
            key, value, ts = source.translate(key, value, ts)
            break
        except RegistryUnavailable as e:  # the change waits for its schema: never skipped
            if stopping():
                return None
            log.warning("%s; its change waits: trying again in a second", e)
            time.sleep(1.0)
        except BadRecord as e:
            if e.key is None:
                return None  # skipped by the stores too
            key, value = e.key, None
            break
    if source.check(key, value) is not None:
        value = None  # unreadable: stored as a delete, so delivered as one
    change = Change(source.renderer, partition, key, value, offset, ts)
    try:
        change.data  # noqa: B018 - rendered here, off the event loop, and checked once
    except (ValueError, TypeError):
        return None  # a key that cannot be shown (its record is skipped by the stores too)
    return change


def split(
    msgs: list,  # type: ignore[type-arg]
    sources: dict[str, Source],
    generation: Callable[[Slot], int],
    stopping: Callable[[], bool] = lambda: False,
) -> Batch:
    grouped: dict[Slot, list[Change]] = defaultdict(list)
    #: how far each partition was read beyond its changes (its end, or records not delivered)
    read_to: dict[Slot, int] = {}
    for m in msgs:
        err = m.error()
        slot = (m.topic(), m.partition())
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                read_to[slot] = max(read_to.get(slot, 0), m.offset())
            else:
                log.debug("watch feed: %s", err)
            continue
        source = sources.get(slot[0])
        if source is None:
            continue
        ts = m.timestamp()[1]
        change = convert(source, slot[1], m.key(), m.value(), m.offset(), ts, stopping)
        if change is not None:
            grouped[slot].append(change)
        else:
            # nothing to deliver, but the position moves past it all the same
            read_to[slot] = max(read_to.get(slot, 0), m.offset() + 1)
    return Batch(
        {slot: (generation(slot), items) for slot, items in grouped.items()},
        {slot: (generation(slot), end) for slot, end in read_to.items()},
    )


class Feed:
    """The shared consumer. `deliver(batch)` runs on the feed thread and must hand the batch
    to the loop; the loop calls :meth:`taken` once it has dispatched it."""

    def __init__(self, bootstrap: str, group: str, deliver: Callable[[Batch], None]) -> None:
        self._bootstrap = bootstrap
        # statistics say which partitions are fetched from a connected leader: heard of,
        # so a quiet feed does not ask the broker whether it has gone deaf
        self._conf = {
            **_conf(bootstrap, group),
            "statistics.interval.ms": STATS_MS,
            "stats_cb": self._on_stats,
        }
        self._consumer = Consumer(self._conf)
        self._deliver = deliver
        self._sources: dict[str, Source] = {}
        self._generation: dict[Slot, int] = {}
        self._controls: list[tuple[str, Slot, int, Source | None]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._room = threading.Semaphore(IN_FLIGHT)
        self._assigned: set[Slot] = set()
        #: per assigned partition: the next offset to read, and when it was last heard of
        #: (a record or its end); the consumer is replaced if it goes deaf (see deafness)
        self._next: dict[Slot, int] = {}
        self._heard: dict[Slot, float] = {}
        self.deafness = DeafCheck(bootstrap)
        self.consumers_renewed = 0
        self._thread = threading.Thread(target=self._run, name="tablecast-watch-feed", daemon=True)
        self._started = False
        self.records = 0

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._room.release()
        if self._started:
            self._thread.join(10)
        self.deafness.close()
        self._consumer.close()

    def assign(self, source: Source, partition: int, offset: int, generation: int) -> None:
        """Read `partition` of `source.topic` from `offset` on; batches carry `generation`, so
        records of an earlier assignment of the same partition are told apart."""
        with self._lock:
            self._controls.append(("assign", (source.topic, partition), offset, source))
            self._generation[(source.topic, partition)] = generation
        self._wake.set()

    def unassign(self, topic: str, partition: int) -> None:
        with self._lock:
            self._controls.append(("unassign", (topic, partition), 0, None))
        self._wake.set()

    def end_offset(self, topic: str, partition: int) -> int:
        """The partition's high watermark as the broker says it now (blocking: off the loop).

        Not through the feed's consumer: confluent-kafka lets one thread at a time into a
        client, and a call from another thread while the feed thread consumes waited 52 s
        for its turn."""
        return ends_from_a_fresh_client(self._bootstrap, [(topic, partition)])[(topic, partition)]

    def taken(self) -> None:
        """The loop dispatched a batch: room for the next."""
        self._room.release()

    def _apply_controls(self) -> None:
        with self._lock:
            controls, self._controls = self._controls, []
        for op, slot, offset, source in controls:
            tp = TopicPartition(slot[0], slot[1], offset)
            if op == "assign":
                assert source is not None
                self._sources[source.topic] = source
                if slot in self._assigned:
                    self._consumer.incremental_unassign([TopicPartition(*slot)])
                self._consumer.incremental_assign([tp])
                self._assigned.add(slot)
                self._next[slot] = offset
                self._heard[slot] = time.monotonic()
            elif slot in self._assigned:
                self._consumer.incremental_unassign([TopicPartition(*slot)])
                self._assigned.discard(slot)
                self._next.pop(slot, None)
                self._heard.pop(slot, None)

    def _heard_of(self, msgs: list[Message]) -> None:
        now = time.monotonic()
        for m in msgs:
            slot = (m.topic(), m.partition())
            if slot not in self._assigned:
                continue
            err = m.error()
            if err is None:
                self._next[slot] = m.offset() + 1
            elif err.code() == KafkaError._PARTITION_EOF:
                self._next[slot] = max(self._next[slot], m.offset())
            else:
                continue
            self._heard[slot] = now

    def _on_stats(self, text: str) -> None:
        """On the feed thread, inside a consume."""
        now = time.monotonic()
        for slot in fetching(text):
            if slot in self._heard:
                self._heard[slot] = now

    def _renew_if_deaf(self) -> None:
        """Replace the consumer when partitions it has heard nothing of for a while have
        records the broker (asked through a fresh client) says it has not read."""
        now = time.monotonic()
        ends = self.deafness.confirmed(now, self._heard)
        behind = [slot for slot, end in ends.items() if end > self._next.get(slot, end)]
        if not behind:
            return
        log.warning(
            "the watch feed has read nothing of %s for %.0f s though the broker holds more; "
            "replacing its consumer (each partition read on from where it was)",
            ", ".join(f"{t}/{p}" for t, p in behind),
            self.deafness.deaf_s,
        )
        old, self._consumer = self._consumer, Consumer(self._conf)
        self.consumers_renewed += 1
        self.deafness.replaced(now)
        self._consumer.incremental_assign(
            [TopicPartition(t, p, self._next[(t, p)]) for t, p in self._assigned]
        )
        close_in_background(old)

    def _run(self) -> None:
        generation = self._generation.get
        while not self._stop.is_set():
            try:
                self._apply_controls()
                if not self._assigned:
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                msgs = batches.take(self._consumer, BATCH, 0.05)
                self._heard_of(msgs)
                self._renew_if_deaf()
                if not msgs:
                    continue
                batch = split(
                    msgs, self._sources, lambda slot: generation(slot, 0), self._stop.is_set
                )
                self.records += len(msgs)
                while not self._room.acquire(timeout=0.5):
                    if self._stop.is_set():
                        return
                if self._stop.is_set():
                    return
                self._deliver(batch)
            except Exception:  # the feed must outlive one bad poll
                log.exception("watch feed error; retrying")
                self._stop.wait(1.0)


class CatchUp:
    """A private reader of some partitions of one topic, from given offsets: for one watch whose
    position is older than what the feed holds. `on_batch(batch)` runs on this reader's thread;
    `wanted()` says which partitions are still needed (the reader stops when none are)."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        source: Source,
        starts: dict[int, int],
        on_batch: Callable[[Batch], None],
        wanted: Callable[[], set[int]],
    ) -> None:
        self.source = source
        self._starts = starts
        self._on_batch = on_batch
        self._wanted = wanted
        self._conf = _conf(bootstrap, group)
        self.cancelled = threading.Event()

    def run(self) -> None:
        """Read until no partition is wanted any more (run it on a worker thread)."""
        consumer = Consumer(self._conf)
        topic = self.source.topic
        try:
            consumer.assign([TopicPartition(topic, p, o) for p, o in self._starts.items()])
            held = set(self._starts)
            sources = {topic: self.source}
            while not self.cancelled.is_set():
                wanted = self._wanted()
                gone = held - wanted
                if gone:
                    consumer.incremental_unassign([TopicPartition(topic, p) for p in gone])
                    held -= gone
                if not held:
                    return
                msgs = consumer.consume(BATCH, 0.2)
                if msgs:
                    self._on_batch(split(msgs, sources, lambda slot: 0, self.cancelled.is_set))
        finally:
            consumer.close()
