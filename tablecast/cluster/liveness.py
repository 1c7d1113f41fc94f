"""Who is alive, from two signals that never compare the clocks of two machines.

A peer is alive while either signal is fresh on *this* node's monotonic clock:

- **heard**: a valid heartbeat of its current incarnation arrived through
  ``<app>.members`` less than ``DEAD_AFTER_S`` ago (receipt time, not the
  record's timestamp, which is the sender's clock);
- **answered**: it answered a direct check (``GET <url>/healthz`` with a
  challenge, signed with the cluster secret when there is one) less than
  ``DEAD_AFTER_S`` ago, naming its node id.

So a silent Kafka alone never kills a peer that answers, and a peer is dead
only when Kafka is silent about it *and* it does not answer (or it left with a
tombstone). A record only ever *admits* a peer after a direct check confirms
it: a record from an incarnation not yet confirmed (one read from history at
start, a new process, or a replay of an old record) is a *candidate* until the
node at its URL answers with that same node id and incarnation. A replayed
record of a stopped node therefore finds nobody to confirm it, and within one
incarnation sequence numbers must grow, so an old record is never believed
over a newer one. A tombstone ends its incarnation for good.

:class:`Liveness` is the bookkeeping alone (the clock is passed in, so it is
tested without waiting); :class:`Prober` runs the direct checks.
"""

from __future__ import annotations

import http.client
import logging
import os
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from tablecast.cluster.signing import Signer

log = logging.getLogger(__name__)

DEAD_AFTER_S = 3.0
#: a candidate no direct check confirmed within this long is forgotten
CANDIDATE_TTL_S = 5.0
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 1.0
CHALLENGE_HEADER = "x-tablecast-challenge"
SIGNATURE_HEADER = "x-tablecast-signature"


@dataclass
class Heartbeat:
    """One membership record, its signature already checked."""

    node: str
    url: str
    incarnation: str
    seq: int
    member: Any  # the decoded Member (kept opaque here: this module knows no replicas)


@dataclass
class Peer:
    beat: Heartbeat
    heard: float | None  # receipt of its last heartbeat through Kafka (None: none live yet)
    answered: float | None  # last good direct answer
    #: the peer's own account of its Kafka connection, from its last direct answer
    kafka: str | None = None


@dataclass
class Answer:
    """What a direct check learned: the node at the URL, its incarnation, its Kafka state."""

    node: str
    incarnation: str
    kafka: str | None = None


class Liveness:
    """Peers and candidates of one node; every method takes `now` from ``time.monotonic()``."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.peers: dict[str, Peer] = {}
        #: node -> (heartbeat, receipt time, whether it arrived live) awaiting a direct check
        self.candidates: dict[str, tuple[Heartbeat, float, bool]] = {}
        #: (node, incarnation) -> highest sequence number seen; a record at or below is stale
        self._high: dict[tuple[str, str], int] = {}
        #: incarnations that left with a tombstone: nothing of theirs is believed again
        self._gone: set[tuple[str, str]] = set()

    def heard(self, beat: Heartbeat, now: float, live: bool = True) -> bool:
        """A heartbeat arrived (`live`: after the start-up read of history); True if news."""
        if beat.node == self.me:
            return False
        ident = (beat.node, beat.incarnation)
        if ident in self._gone or beat.seq <= self._high.get(ident, -1):
            return False  # a replay, a duplicate, or an incarnation that has left
        self._high[ident] = beat.seq
        peer = self.peers.get(beat.node)
        if peer is not None and peer.beat.incarnation == beat.incarnation:
            peer.beat = beat
            if live:
                peer.heard = now
            return True
        # unconfirmed: a new node, a restarted one, history, or a replay; a check decides
        self.candidates[beat.node] = (beat, now, live)
        return False

    def left(self, node: str, incarnation: str | None) -> bool:
        """A tombstone: the incarnation (or, unsigned and without one, the node) is gone."""
        peer = self.peers.get(node)
        if incarnation is None:
            incarnation = peer.beat.incarnation if peer else None
        if incarnation is not None:
            self._gone.add((node, incarnation))
        cand = self.candidates.get(node)
        if cand is not None and cand[0].incarnation == incarnation:
            del self.candidates[node]
        if peer is not None and peer.beat.incarnation == incarnation:
            del self.peers[node]
            return True
        return False

    def answered(self, node: str, url: str, answer: Answer | None, now: float) -> bool:
        """The outcome of a direct check of `node` at `url`; True if a candidate got admitted."""
        if answer is None or answer.node != node:
            return False  # no answer, or somebody else lives at that address now
        peer = self.peers.get(node)
        if peer is not None and peer.beat.url == url:
            if answer.incarnation == peer.beat.incarnation:
                peer.answered = now
                peer.kafka = answer.kafka
            elif (node, answer.incarnation) not in self._gone:
                # restarted while Kafka could not tell us: the node is up, so it lives;
                # what it holds is known once its new heartbeats arrive
                peer.answered = now
                peer.kafka = answer.kafka
        cand = self.candidates.get(node)
        if cand is None or cand[0].url != url or cand[0].incarnation != answer.incarnation:
            return False
        beat, received, live = cand
        del self.candidates[node]
        self.peers[node] = Peer(beat, received if live else None, now, answer.kafka)
        return True

    def alive(self, now: float) -> set[str]:
        """Peers with a fresh signal of either kind (this node excluded)."""
        return {
            n
            for n, p in self.peers.items()
            if (p.heard is not None and now - p.heard < DEAD_AFTER_S)
            or (p.answered is not None and now - p.answered < DEAD_AFTER_S)
        }

    def prune(self, now: float) -> list[str]:
        """Forget the dead and the candidates nobody confirmed; the dead peers' ids."""
        alive = self.alive(now)
        dead = [n for n in self.peers if n not in alive]
        for n in dead:
            del self.peers[n]
        for n, (_, received, _) in list(self.candidates.items()):
            if now - received > CANDIDATE_TTL_S:
                del self.candidates[n]
        return dead

    def to_check(self) -> dict[str, str]:
        """node -> URL of everyone worth a direct check: peers and candidates."""
        out = {n: c[0].url for n, c in self.candidates.items()}
        out.update((n, p.beat.url) for n, p in self.peers.items())
        return out


# -- the direct check --------------------------------------------------------------------


def health_body(node: str, incarnation: str, kafka: str) -> bytes:
    return orjson.dumps({"status": "ok", "node": node, "incarnation": incarnation, "kafka": kafka})


def signed_health(
    signer: Signer, node: str, incarnation: str, kafka: str, challenge: str | None
) -> tuple[bytes, list[tuple[str, str]]]:
    """The /healthz answer: signed over its body and the caller's challenge when asked."""
    body = health_body(node, incarnation, kafka)
    if not challenge or not signer.enabled or len(challenge) > 64:
        return body, []
    return body, [(SIGNATURE_HEADER, signer.sign(body, challenge.encode()))]


def parse_health(signer: Signer, challenge: str, body: bytes, signature: str | None) -> Answer:
    """A peer's /healthz answer, believed only when its signature holds (with a secret)."""
    if signer.enabled and not signer.verify(signature, body, challenge.encode()):
        raise ValueError("no valid signature")
    raw = orjson.loads(body)
    node, inc = raw.get("node"), raw.get("incarnation")
    if not isinstance(node, str) or not isinstance(inc, str):
        raise ValueError("no node id")
    kafka = raw.get("kafka")
    return Answer(node, inc, kafka if isinstance(kafka, str) else None)


class Prober:
    """Checks peers directly, each at most once at a time, on a few threads."""

    def __init__(self, signer: Signer, ssl_context: ssl.SSLContext | None = None) -> None:
        self._signer = signer
        self._ssl = ssl_context
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="tablecast-probe")
        self._inflight: dict[tuple[str, str], Future[Answer | None]] = {}
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._lock = threading.Lock()

    def check(
        self, targets: dict[str, str], done: Callable[[str, str, Answer | None], None]
    ) -> None:
        """Start a check of every (node -> URL) not already being checked; `done` gets each."""
        for node, url in targets.items():
            key = (node, url)
            if key in self._inflight:
                continue
            fut = self._pool.submit(self._probe, url)
            self._inflight[key] = fut
            fut.add_done_callback(lambda f, k=key: self._finished(k, f, done))

    def _finished(
        self,
        key: tuple[str, str],
        fut: Future[Answer | None],
        done: Callable[[str, str, Answer | None], None],
    ) -> None:
        self._inflight.pop(key, None)
        try:
            done(key[0], key[1], fut.result())
        except Exception:  # a callback bug must not stop later checks
            log.exception("direct check callback failed")

    def _probe(self, url: str) -> Answer | None:
        challenge = os.urandom(12).hex()
        with self._lock:
            conn = self._conns.pop(url, None)
        try:
            if conn is None:
                conn = self._connect(url)
            conn.request("GET", "/healthz", headers={CHALLENGE_HEADER: challenge})
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 200:
                raise ValueError(f"status {resp.status}")
            answer = parse_health(self._signer, challenge, body, resp.getheader(SIGNATURE_HEADER))
        except (OSError, http.client.HTTPException, ValueError) as e:
            if conn is not None:
                conn.close()
            log.debug("direct check of %s failed: %s", url, e)
            return None
        with self._lock:
            old = self._conns.pop(url, None)
            self._conns[url] = conn  # keep-alive: the next check reuses it
        if old is not None:
            old.close()
        return answer

    def _connect(self, url: str) -> http.client.HTTPConnection:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        if parts.scheme == "https":
            return http.client.HTTPSConnection(
                host, parts.port or 443, timeout=PROBE_TIMEOUT_S, context=self._ssl
            )
        return http.client.HTTPConnection(host, parts.port or 80, timeout=PROBE_TIMEOUT_S)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()
