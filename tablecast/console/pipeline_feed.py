"""The pipeline as the console shows it: progress from ``<app>.status``, dead letters from
``<app>.dlq``, read from Kafka by one consumer thread per node, started on first use.

The pipeline writes one progress record per query per batch (JSON, keyed by the
query's name; see :mod:`tablecast.pipeline.run.status`) and one dead letter per
bad record, with the reason and the record's source in headers. The feed keeps
the last ``PROGRESS_KEPT`` points per query and the last ``LETTERS_KEPT`` dead
letters, and counts the letters it has read per reason.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, deque
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, TopicPartition

from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import dlq_topic, status_topic

log = logging.getLogger(__name__)

PROGRESS_KEPT = 600
LETTERS_KEPT = 200
#: dead letters counted per reason: those of the topic's last this many records
LETTERS_COUNTED = 100_000
#: progress records read back when the feed starts: the last minutes of every query
PROGRESS_READ_BACK = 5_000
RETRY_S = 5.0


class ConsoleFeed:
    def __init__(self, bootstrap_servers: str, app_id: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.status_topic = status_topic(app_id)
        self.dlq_topic = dlq_topic(app_id)
        self._lock = threading.Lock()
        self._progress: dict[str, deque[dict[str, Any]]] = {}
        self._letters: deque[dict[str, Any]] = deque(maxlen=LETTERS_KEPT)
        self._reasons: Counter[str] = Counter()
        self._letters_seen = 0
        self._assigned: set[str] = set()
        self._started = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tablecast-console", daemon=True)

    def ensure_started(self) -> None:
        """Start reading on first use: a node whose console nobody opens pays nothing."""
        with self._lock:
            if self._started:
                return
            self._started = True
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._started:
            self._thread.join(5)

    # -- what the console asks ----------------------------------------------------
    def progress(self) -> dict[str, Any]:
        with self._lock:
            queries = {name: list(points) for name, points in self._progress.items()}
        return {"topic": self.status_topic, "queries": queries}

    def dead_letters(self) -> dict[str, Any]:
        with self._lock:
            return {
                "topic": self.dlq_topic,
                "items": list(reversed(self._letters)),
                "counts": dict(self._reasons.most_common()),
                "counted": self._letters_seen,
            }

    # -- reading ---------------------------------------------------------------------
    def _run(self) -> None:
        consumer = Consumer(
            client_conf(
                self.bootstrap_servers,
                {
                    # its own group: the feed reads by assignment and commits nothing
                    "group.id": f"tablecast-console-{uuid.uuid4().hex}",
                    "enable.auto.commit": False,
                    "log_level": 0,
                },
            )
        )
        try:
            while not self._stop.is_set():
                if len(self._assigned) < 2:
                    self._assign(consumer)
                for msg in consumer.consume(500, 0.5):
                    if msg.error() is None:
                        self._take(msg.topic(), msg)
        except Exception:  # the console is an aid: it must never take the node down
            log.exception("the console's feed stopped")
        finally:
            consumer.close()

    def _assign(self, consumer: Consumer) -> None:
        """Assign the topics that exist now, from a little before their ends."""
        back = {self.status_topic: PROGRESS_READ_BACK, self.dlq_topic: LETTERS_COUNTED}
        wanted = [t for t in back if t not in self._assigned]
        try:
            md = consumer.list_topics(timeout=5)
            parts = []
            for topic in wanted:
                meta = md.topics.get(topic)
                if meta is None or meta.error is not None:
                    continue
                for p in meta.partitions:
                    lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)
                    parts.append(TopicPartition(topic, p, max(lo, hi - back[topic])))
                self._assigned.add(topic)
        except KafkaException as e:
            log.debug("console feed: topics not readable yet: %s", e)
            self._stop.wait(RETRY_S)
            return
        if parts:
            consumer.incremental_assign(parts)
        elif len(self._assigned) < 2:
            self._stop.wait(RETRY_S)  # the pipeline has not created them yet

    def _take(self, topic: str, msg: Any) -> None:
        if topic == self.status_topic:
            try:
                point = orjson.loads(msg.value() or b"")
            except orjson.JSONDecodeError:
                return
            if not isinstance(point, dict) or not isinstance(point.get("query"), str):
                return
            with self._lock:
                points = self._progress.get(point["query"])
                if points is None:
                    points = self._progress[point["query"]] = deque(maxlen=PROGRESS_KEPT)
                points.append(point)
            return
        letter = dead_letter(msg.key(), msg.value(), msg.headers() or [], msg.timestamp()[1])
        letter["offset"] = msg.offset()
        with self._lock:
            self._letters.append(letter)
            self._reasons[letter["reason"]] += 1
            self._letters_seen += 1


def dead_letter(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]], timestamp: int
) -> dict[str, Any]:
    """One dead letter as the console shows it: where it came from, why, and a preview."""
    h = {k: (v or b"").decode(errors="replace") for k, v in headers}
    error = h.get("tablecast.error", "")
    return {
        "error": error,
        "reason": reason(error),
        "source": {
            "topic": h.get("tablecast.source.topic"),
            "partition": _int(h.get("tablecast.source.partition")),
            "offset": _int(h.get("tablecast.source.offset")),
        },
        "key": _preview(key),
        "value": _preview(value),
        "timestamp": timestamp,
        "seen": int(time.time() * 1000),
    }


def reason(error: str) -> str:
    """The kind of an error message: its first clause (``bad value: not JSON: …`` → ``bad
    value``), so letters group by cause, not by the record's text."""
    head = error.split(":", 1)[0].strip()
    return head[:80] or "unknown"


def _int(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _preview(raw: bytes | None, limit: int = 200) -> str | None:
    if raw is None:
        return None
    text = raw[:limit].decode(errors="replace")
    return text + ("…" if len(raw) > limit else "")
