"""Signatures with the cluster secret (``--cluster-secret``): who may speak as a node.

Kafka write access alone must not let anyone impersonate a node, and a user
token must not open the internal routes. Nodes sharing the cluster secret sign
what they send each other — membership records and internal HTTP calls — with
HMAC-SHA256 over the bytes plus a timestamp and a random nonce, and the
receiver verifies before it believes anything. A signature is the token
``t=<ms>,n=<nonce>,s=<hex>``; the receiver keeps the nonces it has accepted for
the tolerance window, so a replayed token is refused too.

Timestamps only bound how long a nonce must be remembered: they are compared
with generous tolerance (clocks of different hosts disagree), never used to
judge whether a peer is alive.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections import OrderedDict

#: how far a signer's clock may be from ours before its signatures are refused
TOLERANCE_S = 300.0
MAX_NONCES = 200_000


class Signer:
    """Signs and verifies with one shared secret; without a secret, everything is accepted."""

    def __init__(self, secret: str | bytes | None) -> None:
        if isinstance(secret, str):
            secret = secret.encode()
        self._key = secret or None
        self._nonces: OrderedDict[str, float] = OrderedDict()

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
        try:
            fields = dict(item.split("=", 1) for item in token.split(","))
            t, n, s = fields["t"], fields["n"], fields["s"]
            at = int(t) / 1000
        except (ValueError, KeyError):
            return False
        if not hmac.compare_digest(s, self._mac(t, n, parts)):
            return False
        now = time.time()
        if abs(now - at) > TOLERANCE_S:
            return False
        if replay_check:
            self._forget(now)
            if n in self._nonces:
                return False
            self._nonces[n] = now
        return True

    def _mac(self, t: str, n: str, parts: tuple[bytes, ...]) -> str:
        assert self._key is not None
        mac = hmac.new(self._key, f"{t}\x00{n}".encode(), hashlib.sha256)
        for part in parts:
            mac.update(b"\x00")
            mac.update(part)
        return mac.hexdigest()

    def _forget(self, now: float) -> None:
        nonces = self._nonces
        while nonces and (
            len(nonces) > MAX_NONCES or next(iter(nonces.values())) < now - 2 * TOLERANCE_S
        ):
            nonces.popitem(last=False)
