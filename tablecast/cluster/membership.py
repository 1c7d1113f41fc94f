"""Membership: heartbeats on ``<app>.members`` plus direct checks between nodes.

No coordination service: each heartbeat is a compacted record keyed by node
id, carrying the node's URL and the state of every replica it holds, with its
incarnation (random per process) and a sequence number in the headers. With
``--cluster-secret`` every record is signed (HMAC over key, value,
incarnation and sequence, header ``tc-sig``); a record without a valid
signature is ignored and counted. Who is alive is decided by
:class:`~tablecast.cluster.liveness.Liveness`: by *receipt* of heartbeats on
this node's monotonic clock and by direct checks over HTTP, never by the
sender's timestamp, and a record admits a peer only once the peer confirms it
directly. A node that stops cleanly writes a (signed) tombstone, so the others
drop it at once.

This node's own connection to Kafka is judged by its heartbeats coming back:
when none has come back for ``KAFKA_SILENT_S``, Kafka is ``unreachable`` for
this node (:attr:`Membership.kafka_reachable`), and the coordinator keeps the
last assignment instead of taking partitions it could not restore.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    Message,
    Producer,
    TopicPartition,
)

from tablecast.cluster.liveness import (
    DEAD_AFTER_S,
    PROBE_EVERY_S,
    PROBE_TIMEOUT_S,
    Answer,
    Heartbeat,
    Liveness,
    Prober,
)
from tablecast.cluster.signing import Signer
from tablecast.kafka import batches
from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import COMPACTED, ensure_topic, members_topic

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
#: no own heartbeat back from Kafka for this long: Kafka is unreachable for this node
KAFKA_SILENT_S = 2.0
#: Kafka takes our heartbeats but none comes back for this long: the reader is stuck, renew it
STUCK_READER_S = 8.0
#: the others' heartbeats come but Kafka has taken none of ours for this long: the writer is
#: stuck, renew it
STUCK_WRITER_S = 8.0
__all__ = ["DEAD_AFTER_S", "HEARTBEAT_S", "Member", "Membership"]

INC, SEQ, SIG = "tc-inc", "tc-seq", "tc-sig"


@dataclass
class Member:
    id: str
    url: str
    #: (table, partition) -> {"caught_up": bool, "offset": int, "lag": int}
    replicas: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    ready: bool = False
    seen: float = 0.0  # monotonic time of the last heartbeat received
    #: stopping: the others assign its partitions without it while it still answers
    leaving: bool = False


def _encode(member: Member) -> bytes:
    return orjson.dumps(
        {
            "id": member.id,
            "url": member.url,
            "ready": member.ready,
            "leaving": member.leaving,
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
    url = raw["url"]
    if not isinstance(raw["id"], str) or not isinstance(url, str):
        raise TypeError("id and url must be strings")
    return Member(
        raw["id"], url, replicas, bool(raw.get("ready")), leaving=bool(raw.get("leaving"))
    )


class Membership:
    def __init__(
        self,
        bootstrap_servers: str,
        app_id: str,
        me: Callable[[], Member],
        node_id: str,
        secret: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        self.topic = members_topic(app_id)
        self.node_id = node_id
        self.incarnation = os.urandom(8).hex()
        self._seq = 0
        self._bootstrap = bootstrap_servers
        self._me = me
        self._signer = Signer(secret)
        self._liveness = Liveness(node_id)
        self._lock = threading.Lock()  # liveness is fed by the loop and the probe threads
        # https:// peers are checked against the cluster's CA, as forwarded calls are
        context = ssl.create_default_context(cafile=tls_ca) if tls_ca else None
        self._prober = Prober(Signer(secret), context)
        #: records refused for want of a valid signature (forged, or another secret)
        self.rejected = 0
        self._rejected_from: set[bytes] = set()
        self._echo = time.monotonic()  # our own last heartbeat read back from Kafka
        self._delivered = 0.0  # the last heartbeat Kafka acknowledged
        self._heard_others = 0.0  # the last live record of another node read
        self._app_id = app_id
        self._kafka_lost_logged = False
        self._producer = self._new_producer()
        self._writer_since = time.monotonic()
        self._consumer = self._new_consumer()
        self._stop = threading.Event()
        self._left = False
        self._thread = threading.Thread(target=self._run, name="tablecast-membership", daemon=True)
        self.on_change: Callable[[], None] = lambda: None

    def _new_producer(self) -> Producer:
        return Producer(
            client_conf(
                self._bootstrap,
                # a heartbeat queued through an outage is stale by the time it could go
                {
                    "linger.ms": 0,
                    "message.timeout.ms": 5000,
                    "reconnect.backoff.max.ms": 1000,
                    "log_level": 0,
                },
            )
        )

    def _new_consumer(self) -> Consumer:
        return Consumer(
            client_conf(
                self._bootstrap,
                {
                    "group.id": f"tablecast-members-{self._app_id}",
                    "enable.auto.commit": False,
                    # back within a second of Kafka, not librdkafka's default 10 s
                    "reconnect.backoff.max.ms": 1000,
                    "log_level": 0,
                },
            )
        )

    def _renew_stuck_writer(self, now: float) -> None:
        """The others' heartbeats come through Kafka but none of ours is acknowledged: Kafka
        works and this node's producer does not (seen after a broker restart): start a
        fresh one."""
        if (
            now - self._heard_others > KAFKA_SILENT_S
            or now - max(self._delivered, self._writer_since) < STUCK_WRITER_S
        ):
            return
        log.warning("membership writer stuck (the others' heartbeats come, ours do not go)")
        old, self._producer = self._producer, self._new_producer()
        self._writer_since = now
        old.purge()  # what it holds is stale; nothing to wait for when it is dropped

    def _renew_stuck_reader(self, now: float) -> None:
        """Kafka acknowledges our heartbeats but we read none back: start a fresh reader.

        Seen after a broker restart: a consumer that never fetched again. Records
        missed in between matter little: heartbeats repeat, and direct checks
        stand in for a tombstone missed.
        """
        if now - self._echo < STUCK_READER_S or now - self._delivered > KAFKA_SILENT_S:
            return
        log.warning("membership reader stuck (heartbeats written but not read back); renewing it")
        old, self._consumer = self._consumer, self._new_consumer()
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_END)])
        self._echo = now - KAFKA_SILENT_S  # one more round before the next renewal
        try:
            old.close()
        except Exception:  # the old reader is broken anyway
            log.debug("closing the stuck membership reader failed", exc_info=True)

    # -- life cycle ------------------------------------------------------------
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
        # history: who may be alive; no record's age is judged, a direct check decides
        self._read_until(end, timeout=5.0)
        self._echo = time.monotonic()
        # live heartbeats for one interval, and the candidates checked directly meanwhile
        self._probe()
        settle = time.monotonic() + max(HEARTBEAT_S * 2, PROBE_TIMEOUT_S + 0.2)
        while time.monotonic() < settle:
            self._consume(timeout=0.1, live=True)
            with self._lock:
                if not self._liveness.candidates:
                    break
        self._thread.start()

    def stop(self) -> None:
        """Leave at once: heartbeats stop, a tombstone goes out, the others drop us now."""
        self.leave()
        self._prober.close()
        self._consumer.close()

    def leave(self) -> None:
        if self._left:
            return
        self._left = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        self._seq += 1
        key = self.node_id.encode()
        self._producer.produce(self.topic, key=key, value=None, headers=self._headers(key, b""))
        left = self._producer.flush(2.0 if self.kafka_reachable else 0.5)
        if left:
            log.warning("could not write the leave record (Kafka unreachable)")

    # -- what the others read --------------------------------------------------
    @property
    def kafka_reachable(self) -> bool:
        return time.monotonic() - self._echo < KAFKA_SILENT_S

    @property
    def kafka_silent_s(self) -> float:
        """Seconds since Kafka last carried one of our heartbeats back (this node's clock)."""
        return max(0.0, time.monotonic() - self._echo)

    def alive(self) -> dict[str, Member]:
        """The live members, this node included (as it is now, not as it last beat)."""
        now = time.monotonic()
        with self._lock:
            peers = self._liveness.peers
            live = {n: peers[n].beat.member for n in self._liveness.alive(now)}
        me = self._me()
        me.seen = now
        live[me.id] = me
        return live

    def describe(self) -> dict[str, dict[str, Any]]:
        """node -> how this node knows it is alive: receipt ages, Kafka state (for /v1/cluster)."""
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for n, p in self._liveness.peers.items():
                heard = None if p.heard is None else round((now - p.heard) * 1000)
                answered = None if p.answered is None else round((now - p.answered) * 1000)
                if p.kafka is not None:
                    kafka = p.kafka  # its own account, from its last direct answer
                else:
                    kafka = "reachable" if heard is not None and heard < 3000 else "unknown"
                out[n] = {
                    "heartbeat_age_ms": heard,
                    "direct_check_age_ms": answered,
                    "kafka": kafka,
                }
        out[self.node_id] = {
            "heartbeat_age_ms": round(self.kafka_silent_s * 1000),
            "direct_check_age_ms": 0,
            "kafka": "reachable" if self.kafka_reachable else "unreachable",
        }
        return out

    # -- the loop ----------------------------------------------------------------
    def _run(self) -> None:
        next_beat = next_probe = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_beat:
                    self._beat()
                    next_beat = now + HEARTBEAT_S
                if now >= next_probe:
                    self._probe()
                    next_probe = now + PROBE_EVERY_S
                self._consume(timeout=0.1, live=True)
                self._prune()
                self._note_kafka()
                self._renew_stuck_reader(time.monotonic())
                self._renew_stuck_writer(time.monotonic())
            except Exception:  # a hiccup talking to Kafka must not end membership
                log.exception("membership loop error; retrying")
                self._stop.wait(0.5)

    def _note_kafka(self) -> None:
        reachable = self.kafka_reachable
        if not reachable and not self._kafka_lost_logged:
            self._kafka_lost_logged = True
            log.warning(
                "Kafka unreachable (no heartbeat back for %.1f s): serving what this node holds, "
                "keeping the assignment",
                self.kafka_silent_s,
            )
        elif reachable and self._kafka_lost_logged:
            self._kafka_lost_logged = False
            log.info("Kafka reachable again")

    def _headers(self, key: bytes, value: bytes) -> list[tuple[str, bytes]]:
        inc, seq = self.incarnation.encode(), str(self._seq).encode()
        headers = [(INC, inc), (SEQ, seq)]
        if self._signer.enabled:
            headers.append((SIG, self._signer.sign(key, value, inc, seq).encode()))
        return headers

    def _beat(self) -> None:
        me = self._me()
        self._seq += 1
        key, value = me.id.encode(), _encode(me)
        self._producer.produce(
            self.topic,
            key=key,
            value=value,
            headers=self._headers(key, value),
            on_delivery=self._on_delivery,
        )
        self._producer.poll(0)

    def _on_delivery(self, err: object, msg: Message) -> None:
        if err is None:
            self._delivered = time.monotonic()

    def _probe(self) -> None:
        with self._lock:
            targets = self._liveness.to_check()
        if targets:
            self._prober.check(targets, self._answered)

    def _answered(self, node: str, url: str, answer: Answer | None) -> None:
        with self._lock:
            admitted = self._liveness.answered(node, url, answer, time.monotonic())
        if admitted:
            log.info("node %s at %s joined (confirmed directly)", node, url)
            self.on_change()

    def _prune(self) -> None:
        with self._lock:
            dead = self._liveness.prune(time.monotonic())
        for n in dead:
            log.info(
                "node %s is dead: no heartbeat and no direct answer for %.0f s", n, DEAD_AFTER_S
            )
        if dead:
            self.on_change()

    def _read_until(self, end: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        tp = TopicPartition(self.topic, 0)
        while time.monotonic() < deadline:
            self._consume(timeout=0.1, live=False)
            if self._consumer.position([tp])[0].offset >= end:
                return

    def _consume(self, timeout: float, live: bool) -> None:
        changed = False
        for msg in batches.take(self._consumer, 1000, timeout):
            if msg.error() is not None or msg.key() is None:
                continue
            try:
                changed |= self._record(msg, live)
            except Exception:  # a bad record must never stop membership
                log.debug("unreadable membership record", exc_info=True)
        if changed:
            self.on_change()

    def _record(self, msg: Message, live: bool) -> bool:
        key: bytes = msg.key()  # type: ignore[assignment]
        value: bytes | None = msg.value()
        headers = dict(msg.headers() or [])
        inc, seq = headers.get(INC), headers.get(SEQ)
        if self._signer.enabled:
            sig = headers.get(SIG)
            if (
                inc is None
                or seq is None
                or sig is None
                or not self._signer.verify(sig.decode("latin-1"), key, value or b"", inc, seq)
            ):
                self._reject(key)
                return False
        node = key.decode()
        incarnation = inc.decode() if inc is not None else None
        now = time.monotonic()
        if node == self.node_id:
            if incarnation == self.incarnation and value is not None:
                self._echo = now  # our heartbeat made the round trip: Kafka works for us
            return False
        if live:
            self._heard_others = now
        if value is None:
            with self._lock:
                gone = self._liveness.left(node, incarnation)
            if gone:
                log.info("node %s left", node)
            return gone
        member = _decode(value)
        if member.id != node:
            return False
        member.seen = now
        beat = Heartbeat(
            node,
            member.url,
            # an unsigned record of an older version has no incarnation: one per URL
            incarnation if incarnation is not None else f"url:{member.url}",
            int(seq) if seq is not None else self._liveness_seq(node),
            member,
        )
        with self._lock:
            news = self._liveness.heard(beat, now, live)
        return news and live

    def _liveness_seq(self, node: str) -> int:
        peer = self._liveness.peers.get(node)
        return peer.beat.seq + 1 if peer is not None else 0

    def _reject(self, key: bytes) -> None:
        self.rejected += 1
        if key not in self._rejected_from and len(self._rejected_from) < 1000:
            self._rejected_from.add(key)
            log.warning(
                "ignored a membership record for %r without a valid signature "
                "(forged, another cluster secret, or older than the tolerance); counting the rest",
                key[:64].decode("utf-8", "replace"),
            )
