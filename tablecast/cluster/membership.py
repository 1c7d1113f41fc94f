"""Membership through Kafka: every node heartbeats on ``<app>.members`` and reads everyone's.

No coordination service: each heartbeat is a compacted record keyed by node
id, carrying the node's URL and the state of every replica it holds. A node
is alive while its heartbeats keep arriving; one silent for ``DEAD_AFTER_S``
is dead. A node that stops cleanly writes a tombstone, so the others notice at
once. At start the topic is read to its end, so a new node sees the live
members before it decides what to hold.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import COMPACTED, ensure_topic, members_topic

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
DEAD_AFTER_S = 3.0


@dataclass
class Member:
    id: str
    url: str
    #: (table, partition) -> {"caught_up": bool, "offset": int, "lag": int}
    replicas: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    ready: bool = False
    seen: float = 0.0  # monotonic time of the last heartbeat received


def _encode(member: Member) -> bytes:
    return orjson.dumps(
        {
            "id": member.id,
            "url": member.url,
            "ready": member.ready,
            "replicas": [
                {"table": t, "partition": p, **state} for (t, p), state in member.replicas.items()
            ],
        }
    )


def _decode(data: bytes) -> Member:
    raw = orjson.loads(data)
    replicas = {
        (r["table"], r["partition"]): {
            k: v for k, v in r.items() if k not in ("table", "partition")
        }
        for r in raw.get("replicas", [])
    }
    return Member(raw["id"], raw["url"], replicas, bool(raw.get("ready")))


class Membership:
    def __init__(self, bootstrap_servers: str, app_id: str, me: Callable[[], Member]) -> None:
        self.topic = members_topic(app_id)
        self._bootstrap = bootstrap_servers
        self._me = me
        self._members: dict[str, Member] = {}
        self._producer = Producer(client_conf(bootstrap_servers, {"linger.ms": 0}))
        self._consumer = Consumer(
            client_conf(
                bootstrap_servers,
                {
                    "group.id": f"tablecast-members-{app_id}",
                    "enable.auto.commit": False,
                    "log_level": 0,
                },
            )
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tablecast-membership", daemon=True)
        self.on_change: Callable[[], None] = lambda: None

    def start(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        tp = TopicPartition(self.topic, 0)
        while True:
            try:
                ensure_topic(self._bootstrap, self.topic, 1, COMPACTED | {"segment.ms": "600000"})
                # a topic another node just created may not be in our metadata yet
                _, end = self._consumer.get_watermark_offsets(tp, timeout=10)
                break
            except Exception as e:  # the broker may still be starting: wait for it
                if time.monotonic() > deadline:
                    raise
                log.info("waiting for Kafka at %s: %s", self._bootstrap, e)
                time.sleep(0.5)
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._beat()
        self._read_until(end, timeout=5.0)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        me = self._me()
        # a tombstone: the others drop this node now instead of after DEAD_AFTER_S
        self._producer.produce(self.topic, key=me.id.encode(), value=None)
        self._producer.flush(5)
        self._consumer.close()

    def alive(self) -> dict[str, Member]:
        """The live members, this node included (as it is now, not as it last beat)."""
        now = time.monotonic()
        me = self._me()
        live = {m.id: m for m in list(self._members.values()) if now - m.seen < DEAD_AFTER_S}
        me.seen = now
        live[me.id] = me
        return live

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_beat:
                    self._beat()
                    next_beat = time.monotonic() + HEARTBEAT_S
                self._consume(timeout=0.1)
            except Exception:  # a hiccup talking to Kafka must not end membership
                log.exception("membership loop error; retrying")
                self._stop.wait(0.5)

    def _beat(self) -> None:
        me = self._me()
        self._producer.produce(self.topic, key=me.id.encode(), value=_encode(me))
        self._producer.poll(0)

    def _read_until(self, end: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        tp = TopicPartition(self.topic, 0)
        while time.monotonic() < deadline:
            self._consume(timeout=0.1)
            if self._consumer.position([tp])[0].offset >= end:
                return

    def _consume(self, timeout: float) -> None:
        changed = False
        now_ms = time.time() * 1000
        for msg in self._consumer.consume(1000, timeout):
            if msg.error() is not None or msg.key() is None:
                continue
            node_id = msg.key().decode()
            if msg.value() is None:
                changed |= self._members.pop(node_id, None) is not None
                continue
            # history read at start: only heartbeats recent enough to be alive count
            age_s = (now_ms - msg.timestamp()[1]) / 1000
            if age_s > DEAD_AFTER_S:
                continue
            try:
                member = _decode(msg.value())
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
            member.seen = time.monotonic() - max(age_s, 0.0)
            changed |= node_id not in self._members
            self._members[node_id] = member
        if changed:
            self.on_change()
