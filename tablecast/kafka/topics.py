"""The topics an App owns, and creating them with the right settings.

Every topic an App owns is prefixed by its id: ``<app>.catalog`` lists its
tables, ``<app>.table.<name>`` is a table's changelog, ``<app>.dlq`` takes bad
records, and serving nodes announce themselves on ``<app>.members``.
"""

from __future__ import annotations

import logging
import os
import time

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from tablecast.kafka.config import client_conf

log = logging.getLogger(__name__)

COMPACTED = {"cleanup.policy": "compact"}
REPLICATION_ENV = "TABLECAST_REPLICATION_FACTOR"

#: Table topics (``<app>.table.<name>`` and table changelogs): compacted, with the settings
#: serving nodes rely on spelled out rather than left to broker defaults.
#: - delete.retention.ms, 1 day: how long a tombstone outlives compaction. A node whose
#:   store was last in sync longer ago than this restores the partition from scratch
#:   (it may have missed deletes that are gone from the topic); it reads the value from
#:   the topic, so raising it here or on the topic lets nodes be away longer.
#: - min.cleanable.dirty.ratio, 0.5: compact once half a log is superseded records
#:   (Kafka's default; lower trades broker I/O for a faster restore).
#: - segment.ms, 1 hour: the active segment is never compacted, so roll it hourly
#:   rather than weekly, or a busy table's updates pile up for days before compaction.
TABLE_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "delete.retention.ms": "86400000",
    "min.cleanable.dirty.ratio": "0.5",
    "segment.ms": "3600000",
}


def catalog_topic(app_id: str) -> str:
    return f"{app_id}.catalog"


def table_topic(app_id: str, table: str) -> str:
    return f"{app_id}.table.{table}"


def dlq_topic(app_id: str) -> str:
    return f"{app_id}.dlq"


def status_topic(app_id: str) -> str:
    """Where the pipeline publishes each query's progress, every batch (the console reads it)."""
    return f"{app_id}.status"


#: progress points are worth minutes, not a history: an hour is kept
STATUS_CONFIG = {"cleanup.policy": "delete", "retention.ms": str(3600 * 1000)}


def members_topic(app_id: str) -> str:
    return f"{app_id}.members"


def admin(bootstrap_servers: str) -> AdminClient:
    # an admin client is a producer to librdkafka, whose metadata requests would have a
    # broker with auto.create.topics.enable (Kafka's default) create a topic only asked about
    return AdminClient(client_conf(bootstrap_servers, {"allow.auto.create.topics": False}))


#: errors that mean the brokers are away for now (restarting, partitioned), not that the
#: request or the settings are wrong
_AWAY = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._RESOLVE,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NOT_CONTROLLER,
    KafkaError.BROKER_NOT_AVAILABLE,
}


def kafka_away(error: BaseException) -> bool:
    """Whether `error` says the Kafka cluster is unreachable for now (worth waiting out)."""
    if not isinstance(error, KafkaException) or not error.args:
        return False
    err = error.args[0]
    return isinstance(err, KafkaError) and (err.code() in _AWAY or err.retriable())


def partition_count(bootstrap_servers: str, topic: str, timeout: float = 10.0) -> int | None:
    """How many partitions `topic` has, or None if it does not exist."""
    md = admin(bootstrap_servers).list_topics(topic, timeout=timeout)
    info = md.topics.get(topic)
    if info is None or info.error is not None:
        return None
    return len(info.partitions)


def ensure_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    config: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> int:
    """Create `topic` unless it exists; return its partition count (which may differ)."""
    existing = partition_count(bootstrap_servers, topic)
    if existing is not None:
        return existing
    client = admin(bootstrap_servers)  # must outlive its futures
    rf = replication_factor(client)
    # acks=all then waits for 2 copies: one broker down loses no acknowledged record
    settings = {"min.insync.replicas": str(min(2, rf)), **(config or {})}
    futures = client.create_topics(
        [NewTopic(topic, partitions, rf, config=settings)], operation_timeout=timeout
    )
    try:
        futures[topic].result(timeout)
        log.info("created topic %s (%d partitions)", topic, partitions)
    except KafkaException as e:
        # another process may have created it between the check and the create
        if "TOPIC_ALREADY_EXISTS" not in str(e):
            raise
    # a new topic reaches the broker's metadata a moment after it is created
    deadline = time.monotonic() + timeout
    while (count := partition_count(bootstrap_servers, topic)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic} was created but does not show in the metadata")
        time.sleep(0.1)
    return count


def replication_factor(client: AdminClient) -> int:
    """``--replication-factor`` (``TABLECAST_REPLICATION_FACTOR``), else min(3, brokers)."""
    chosen = os.environ.get(REPLICATION_ENV)
    if chosen:
        return int(chosen)
    return max(1, min(3, len(client.list_topics(timeout=10).brokers)))


def end_offsets(bootstrap_servers: str, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """The next offset to be written, per partition of `topic` (empty if it does not exist).

    A partition without a leader yet, or with its leader epoch in flux (a topic just
    created), is asked again until `timeout`.
    """
    return EndOffsets(bootstrap_servers).of([topic], timeout).get(topic, {})


class EndOffsets:
    """Ends of topics asked through one admin client: one connection for a loop that asks
    again and again, and one request for every partition of the topics asked together
    (no consumer group, so no coordinator lookup)."""

    def __init__(self, bootstrap_servers: str) -> None:
        self._admin = admin(bootstrap_servers)

    def of(self, topics: list[str], timeout: float = 10.0) -> dict[str, dict[int, int]]:
        """The next offset to be written per partition, for each of `topics` that exists."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        # a partition whose leader is not known yet (a topic just created), or whose leader
        # epoch the client and broker do not agree on yet (its metadata moving), is asked again
        leaderless = {
            KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.UNKNOWN_LEADER_EPOCH,
            KafkaError.FENCED_LEADER_EPOCH,
            KafkaError._TIMED_OUT,
        }
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        wanted: list[TopicPartition] = []
        for topic in dict.fromkeys(topics):
            info = self._admin.list_topics(topic, timeout=left()).topics.get(topic)
            if info is not None and info.error is None:
                wanted += [TopicPartition(topic, p) for p in info.partitions]
        ends: dict[str, dict[int, int]] = {}
        while wanted:
            futures = self._admin.list_offsets(
                {tp: OffsetSpec.latest() for tp in wanted}, request_timeout=left()
            )
            again: list[TopicPartition] = []
            for tp, future in futures.items():
                try:
                    ends.setdefault(tp.topic, {})[tp.partition] = future.result().offset
                except KafkaException as e:
                    if e.args[0].code() not in leaderless or time.monotonic() > deadline:
                        raise
                    again.append(tp)
            if again:
                time.sleep(0.1)
            wanted = again
        return ends
