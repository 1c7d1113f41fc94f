"""A long-lived consumer gone deaf: noticed, confirmed through a fresh client, then replaced.

librdkafka's consumer of assigned partitions can stay cut off after a broker
restart: it fetches nothing and its statistics show no leader, for minutes, until
the consumer is replaced (librdkafka's issue #5153 on GitHub; a chaos soak saw a
node's table consumer, and the soak's own reference reader, stay so while the
node's other clients were back). Silence alone proves nothing (an idle topic, an outage), so
a consumer loop tells :class:`DeafCheck` when it last heard of each partition; the
check asks the broker about the silent ones through a client made for the
question, off the loop's thread, and hands back what the broker said. The loop
replaces its consumer when the broker answered and the consumer has still heard
nothing, assigning each partition at the next offset it would have read:
nothing is lost or read twice.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import orjson
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tablecast.kafka.config import client_conf

log = logging.getLogger(__name__)

#: no word of an assigned partition for this long: ask the broker through a fresh client
DEAF_S = 15.0
#: a consumer's statistics interval (statistics.interval.ms) where they count as word of
#: its partitions: one fetched from a connected leader is heard of, however quiet
STATS_MS = 1000

TopicSlot = tuple[str, int]  # (topic, partition)


def ends_from_a_fresh_client(
    bootstrap_servers: str, slots: list[TopicSlot], timeout: float = 5.0
) -> dict[TopicSlot, int]:
    """Each partition's end, asked through a client made for the question."""
    admin = AdminClient(client_conf(bootstrap_servers, {"log_level": 0}))
    asked = {TopicPartition(t, p): OffsetSpec.latest() for t, p in slots}
    futures = admin.list_offsets(asked, request_timeout=timeout)
    return {(tp.topic, tp.partition): f.result(timeout).offset for tp, f in futures.items()}


def fetching(stats_json: str) -> list[TopicSlot]:
    """The partitions librdkafka's statistics show fetched from a leader it is connected
    to: the consumer is not deaf to them, however quiet they are (unreadable: none)."""
    try:
        stats = orjson.loads(stats_json)
        up = {b.get("nodeid") for b in stats["brokers"].values() if b.get("state") == "UP"}
        return [
            (topic, part["partition"])
            for topic, t in stats["topics"].items()
            for part in t["partitions"].values()
            if part.get("partition", -1) >= 0
            and part.get("leader") in up
            and part.get("fetch_state") == "active"
        ]
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        return []


class DeafCheck:
    """One consumer's deafness check; :meth:`confirmed` is called from its loop."""

    def __init__(self, bootstrap_servers: str, deaf_s: float = DEAF_S) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.deaf_s = deaf_s
        self._question: Future[dict[TopicSlot, int]] | None = None
        self._asked = self._replaced = float("-inf")
        self._pool: ThreadPoolExecutor | None = None
        #: questions asked so far
        self.questions = 0

    def confirmed(self, now: float, last_heard: dict[TopicSlot, float]) -> dict[TopicSlot, int]:
        """The broker's ends of the partitions not heard of for `deaf_s` (by `last_heard`,
        monotonic times) once a fresh client has been answered about them; empty while
        nothing is silent that long, the question is out, or nobody reaches the broker."""
        # a consumer replaced a moment ago has heard nothing yet: its silence counts from then
        since = self._replaced
        silent = [slot for slot, at in last_heard.items() if now - max(at, since) >= self.deaf_s]
        question = self._question
        if question is not None:
            if not question.done():
                return {}
            self._question = None
            try:
                ends = question.result()
            except Exception as e:  # an outage for every client, not a deaf consumer
                log.debug("a fresh client cannot reach Kafka either: %s", e)
                return {}
            return {slot: ends[slot] for slot in silent if slot in ends}
        if silent and now - self._asked >= self.deaf_s:
            self._asked = now
            self.questions += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="tablecast-deaf-check")
            self._question = self._pool.submit(
                ends_from_a_fresh_client, self.bootstrap_servers, silent
            )
        return {}

    def replaced(self, now: float) -> None:
        """The consumer was replaced: its successor gets `deaf_s` to be heard from."""
        self._replaced = now

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def close_in_background(consumer: Consumer) -> None:
    """Close a replaced consumer without waiting: closing a deaf client may wait on its
    broker."""

    def close() -> None:
        try:
            consumer.close()
        except Exception:  # it is being dropped anyway
            log.debug("closing a replaced consumer failed", exc_info=True)

    threading.Thread(target=close, name="tablecast-close-consumer", daemon=True).start()
