"""Signatures with the cluster secret (``--cluster-secret``): who may speak as a node.

Kafka write access alone must not let anyone impersonate a node, and a user
token must not open the internal routes. Nodes sharing the cluster secret sign
what they send each other — membership records and internal HTTP calls — with
HMAC-SHA256 over the bytes plus a timestamp and a random nonce, and the
receiver verifies before it believes anything. A signature is the token
``t=<ms>,n=<nonce>,s=<hex>``; the receiver keeps the nonces it has accepted for
the tolerance window, so a replayed token is refused too. Memory for them is
bounded: when more arrive within the window than can be kept, the oldest are
forgotten and every token signed no later than the newest of those is refused
from then on, so a token is never accepted twice.

Timestamps only bound how long a nonce must be remembered: they are compared
with generous tolerance (clocks of different hosts disagree), never used to
judge whether a peer is alive.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import os
import threading
import time

#: how far a signer's clock may be from ours before its signatures are refused
TOLERANCE_S = 300.0
MAX_NONCES = 200_000


class Signer:
    """Signs and verifies with one shared secret; without a secret, everything is accepted."""

    def __init__(self, secret: str | bytes | None) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        self._key = secret or None
        #: nonces of the accepted signatures still remembered
        self._nonces: set[str] = set()
        #: the same, as (signing time in ms, nonce) in a heap: the oldest is forgotten first
        self._by_time: list[tuple[int, str]] = []
        #: the newest signing time forgotten so far: a token signed then or before may be a
        #: replay of one no longer remembered, so it is refused
        self.floor_ms = -(2**63)
        # verify runs on the event loop and on Kafka threads: check-and-remember is one step
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def sign(self, *parts: bytes) -> str:
        assert self._key is not None
        t = str(int(time.time() * 1000))
        n = os.urandom(12).hex()
        return f"t={t},n={n},s={self._mac(t, n, parts)}"

    def verify(self, token: str | None, *parts: bytes, replay_check: bool = True) -> bool:
        """Whether `token` is a valid, fresh, never-seen signature of `parts`."""
        if self._key is None:
            return True
        if not token:
            return False
        if not isinstance(token, str) or not token.isascii():
            # what a signature can hold is ASCII: anything else is a forgery, and would make
            # compare_digest raise (a 500) instead of refusing
            return False
        try:
            fields = dict(item.split("=", 1) for item in token.split(","))
            t, n, s = fields["t"], fields["n"], fields["s"]
            at_ms = int(t)
        except (ValueError, KeyError):
            return False
        if not hmac.compare_digest(s, self._mac(t, n, parts)):
            return False
        now = time.time()
        if abs(now - at_ms / 1000) > TOLERANCE_S:
            return False
        if replay_check:
            with self._lock:
                self._forget(int(now * 1000) - int(TOLERANCE_S * 1000))
                if at_ms <= self.floor_ms or n in self._nonces:
                    return False
                self._nonces.add(n)
                heapq.heappush(self._by_time, (at_ms, n))
                if len(self._nonces) > MAX_NONCES:
                    self._forget_oldest()
        return True

    def _mac(self, t: str, n: str, parts: tuple[bytes, ...]) -> str:
        assert self._key is not None
        mac = hmac.new(self._key, f"{t}\x00{n}".encode(), hashlib.sha256)
        for part in parts:
            mac.update(b"\x00")
            mac.update(part)
        return mac.hexdigest()

    def _forget(self, before_ms: int) -> None:
        """Forget the nonces of tokens signed before `before_ms`: the tolerance refuses them."""
        by_time = self._by_time
        while by_time and by_time[0][0] < before_ms:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        # the floor rises with every nonce forgotten, also one within the window (more
        # signatures than MAX_NONCES): its replay, signed at or before the floor, is refused
        at_ms, n = heapq.heappop(self._by_time)
        self._nonces.discard(n)
        self.floor_ms = max(self.floor_ms, at_ms)
