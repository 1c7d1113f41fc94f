"""What the ingestor asks the broker about table topics: partitions, how long deletes stay."""

from __future__ import annotations

import logging

from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from tablecast.kafka.config import client_conf

log = logging.getLogger(__name__)

#: Kafka's default delete.retention.ms, assumed when a topic's config cannot be read
DEFAULT_DELETE_RETENTION_MS = 86_400_000


class TopicInfo:
    def __init__(self, bootstrap_servers: str) -> None:
        self._admin = AdminClient(client_conf(bootstrap_servers, {"log_level": 0}))
        self._retention: dict[str, int] = {}

    def partitions(self, topics: list[str], timeout: float = 5.0) -> dict[str, int | None]:
        """Each topic's partition count, None for one that does not exist."""
        md = self._admin.list_topics(timeout=timeout)
        out: dict[str, int | None] = {}
        for topic in topics:
            info = md.topics.get(topic)
            out[topic] = None if info is None or info.error is not None else len(info.partitions)
        return out

    def delete_retention_ms(self, topic: str, timeout: float = 5.0) -> int:
        """How long the topic keeps tombstones once compacted (cached per topic)."""
        known = self._retention.get(topic)
        if known is not None:
            return known
        try:
            resource = ConfigResource(ResourceType.TOPIC, topic)
            configs = self._admin.describe_configs([resource])[resource].result(timeout)
            value = int(configs["delete.retention.ms"].value)
        except Exception as e:  # unknown: assume Kafka's default rather than trusting the store
            log.warning("cannot read delete.retention.ms of %s (%s); assuming 1 day", topic, e)
            return DEFAULT_DELETE_RETENTION_MS
        self._retention[topic] = value
        return value
