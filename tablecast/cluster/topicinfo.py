"""What the ingestor asks the broker about table topics: partitions, how long deletes stay."""

from __future__ import annotations

import logging

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tablecast.kafka.config import client_conf

log = logging.getLogger(__name__)

#: delete.retention.ms assumed when a topic's config cannot be read: the topic may keep
#: tombstones for less than any default, so a store away for any time is rebuilt from it
#: rather than resumed without deletes compaction has since dropped
UNKNOWN_DELETE_RETENTION_MS = 0
#: how long a question about a topic's config waits for the broker's answer
DESCRIBE_TIMEOUT_S = 5.0


class TopicInfo:
    def __init__(self, bootstrap_servers: str) -> None:
        self._admin = AdminClient(client_conf(bootstrap_servers, {"log_level": 0}))
        self._retention: dict[str, int] = {}
        #: topics whose delete.retention.ms could not be read (each warned about once)
        self.unreadable: set[str] = set()

    def partitions(self, topics: list[str], timeout: float = 5.0) -> dict[str, int | None]:
        """Each topic's partition count, None for one that does not exist."""
        md = self._admin.list_topics(timeout=timeout)
        out: dict[str, int | None] = {}
        for topic in topics:
            info = md.topics.get(topic)
            out[topic] = None if info is None or info.error is not None else len(info.partitions)
        return out

    def delete_retention_ms(self, topic: str, timeout: float | None = None) -> int:
        """How long the topic keeps tombstones once compacted (cached per topic);
        UNKNOWN_DELETE_RETENTION_MS when it cannot be read (asked again next time)."""
        known = self._retention.get(topic)
        if known is not None:
            return known
        try:
            resource = ConfigResource(ResourceType.TOPIC, topic)
            configs = self._admin.describe_configs([resource])[resource].result(
                DESCRIBE_TIMEOUT_S if timeout is None else timeout
            )
            value = int(configs["delete.retention.ms"].value)
        except Exception as e:  # unknown: a guess too long would resume stores missing deletes
            if topic not in self.unreadable:
                self.unreadable.add(topic)
                log.warning(
                    "cannot read delete.retention.ms of topic %s (%s): the Kafka principal "
                    "probably lacks the DescribeConfigs permission on it. Stores of this topic "
                    "that were away for any time are rebuilt from the topic instead of resumed, "
                    "since deletes they missed may be gone from it",
                    topic,
                    repr(e),
                )
            return UNKNOWN_DELETE_RETENTION_MS
        self.unreadable.discard(topic)
        self._retention[topic] = value
        return value
