"""Per-caller limits: requests per second (``serve --rate-limit``) and concurrent offset waits.

A caller is its JWT ``sub`` when auth is on, else its client address. Both
limits answer ``429 rate_limited`` with ``Retry-After``: the caller asked for
more than its share, and asking again later is the remedy.

Memory stays bounded however many callers there are: a bucket that has
refilled is indistinguishable from a new one, so when the table of buckets is
full the refilled ones are dropped; should every one still be draining (a
flood of distinct callers), the table starts over — a caller then gets a fresh
burst, never a wrong refusal.

A node with read processes (``serve --processes``) keeps its buckets in a file
every process maps (:class:`SharedTokenBuckets`): a caller whose connections the
kernel spreads over the processes still gets its rate once, not once per process.
"""

from __future__ import annotations

import fcntl
import hashlib
import math
import mmap
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, Metric

from tablecast.query.errors import ApiError

MAX_CALLERS = 100_000


class RateLimit(Protocol):
    refused: int

    def take(self, caller: str, now: float | None = None) -> None: ...


def _refusal(rate: float, tokens: float) -> ApiError:
    wait = math.ceil((1.0 - tokens) / rate)
    return ApiError(
        "rate_limited",
        f"more than {rate:g} requests per second; try again in {wait} s",
        [("retry-after", str(wait))],
    )


def _burst(rate: float, burst: float | None) -> float:
    if rate <= 0:
        raise ValueError("the rate limit is a positive number of requests per second")
    return max(1.0, burst if burst is not None else rate)


class TokenBuckets:
    """A token bucket per caller: `rate` requests per second, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        self.burst = _burst(rate, burst)
        self.rate = rate
        #: caller -> (tokens left, when they were counted)
        self._buckets: dict[str, tuple[float, float]] = {}
        self.refused = 0

    def take(self, caller: str, now: float | None = None) -> None:
        """Spend one token of `caller`'s bucket; 429 with Retry-After when it is empty."""
        now = time.monotonic() if now is None else now
        bucket = self._buckets.get(caller)
        if bucket is None:
            if len(self._buckets) >= MAX_CALLERS:
                self._sweep(now)
            tokens = self.burst
        else:
            tokens = min(self.burst, bucket[0] + (now - bucket[1]) * self.rate)
        if tokens < 1.0:
            self._buckets[caller] = (tokens, now)
            self.refused += 1
            raise _refusal(self.rate, tokens)
        self._buckets[caller] = (tokens - 1.0, now)

    def _sweep(self, now: float) -> None:
        full = self.burst / self.rate  # seconds for an empty bucket to refill
        self._buckets = {c: b for c, b in self._buckets.items() if now - b[1] < full}
        if len(self._buckets) >= MAX_CALLERS:
            self._buckets = {}

    def __len__(self) -> int:
        return len(self._buckets)


#: the shared table's slots (a power of two, above MAX_CALLERS): 3 MiB of (caller hash,
#: tokens, when counted), 8 bytes each
SLOTS = 1 << 17
#: slots looked at from a caller's hash on: its bucket is in one of them or nowhere
PROBES = 8


class SharedTokenBuckets:
    """:class:`TokenBuckets` in a file that every process of a node maps, each bucket counted
    under a lock on the file, so that no two processes spend the same token.

    A caller's bucket is in one of the :data:`PROBES` slots from its hash on (open
    addressing). A slot never empties again once used, so the first empty slot ends the
    search; a bucket that has refilled is indistinguishable from a new one, so its slot is
    given to the next new caller that needs one. A new caller that finds every slot it may
    use held by a draining bucket is let through uncounted: a fresh burst, never a wrong
    refusal (as :class:`TokenBuckets` starting over).
    """

    def __init__(
        self, path: str | Path, rate: float, burst: float | None = None, create: bool = False
    ) -> None:
        """`create`: start the table empty (the node, before it starts its read processes);
        else map the one the node made."""
        self.burst = _burst(rate, burst)
        self.rate = rate
        self.path = Path(path)
        self._fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o600)
        if create:
            os.ftruncate(self._fd, 0)  # a table left by an earlier run: counted afresh
            os.ftruncate(self._fd, SLOTS * 24)
        self._map = mmap.mmap(self._fd, SLOTS * 24)
        # slot i: hash in word 3i, tokens in real 3i + 1, when counted in real 3i + 2
        self._words = memoryview(self._map).cast("Q")
        self._reals = memoryview(self._map).cast("d")
        self._hashes: dict[str, int] = {}
        # the file lock is the process's: its own threads take turns under this one
        self._lock = threading.Lock()
        self.refused = 0

    def take(self, caller: str, now: float | None = None) -> None:
        """Spend one token of `caller`'s bucket; 429 with Retry-After when it is empty."""
        # CLOCK_MONOTONIC is the machine's, the same in every process
        now = time.monotonic() if now is None else now
        h = self._hashes.get(caller) or self._hash(caller)
        words, reals, mask = self._words, self._reals, SLOTS - 1
        refilled_after = self.burst / self.rate
        with self._lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                found = free = -1
                for i in range(PROBES):
                    at = ((h + i) & mask) * 3
                    held = words[at]
                    if held == h:
                        found = at
                        break
                    if free < 0 and (held == 0 or now - reals[at + 2] >= refilled_after):
                        free = at
                    if held == 0:
                        break
                if found >= 0:
                    tokens = min(
                        self.burst, reals[found + 1] + (now - reals[found + 2]) * self.rate
                    )
                elif free >= 0:
                    found, tokens = free, self.burst
                    words[found] = h
                else:
                    return
                reals[found + 1] = tokens if tokens < 1.0 else tokens - 1.0
                reals[found + 2] = now
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        if tokens < 1.0:
            self.refused += 1
            raise _refusal(self.rate, tokens)

    def _hash(self, caller: str) -> int:
        """A caller's hash, the same in every process (never 0: that marks an empty slot)."""
        if len(self._hashes) >= MAX_CALLERS:
            self._hashes = {}
        digest = hashlib.blake2b(caller.encode(), digest_size=8).digest()
        h = self._hashes[caller] = int.from_bytes(digest, "little") or 1
        return h

    def close(self) -> None:
        self._words.release()
        self._reals.release()
        self._map.close()
        os.close(self._fd)


class CallerSlots:
    """At most `per_caller` things of one caller under way at once (429 beyond)."""

    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self._held: dict[str, int] = {}
        self.refused = 0

    def refusal(self, n: int) -> str:
        return f"this caller has {n} under way (at most {self.per_caller})"

    def enter(self, caller: str) -> None:
        n = self._held.get(caller, 0)
        if n >= self.per_caller:
            self.refused += 1
            raise ApiError("rate_limited", self.refusal(n), [("retry-after", "1")])
        self._held[caller] = n + 1

    def leave(self, caller: str) -> None:
        n = self._held.get(caller, 0) - 1
        if n > 0:
            self._held[caller] = n
        else:  # nothing of this caller held: no entry, so the table holds only callers under way
            self._held.pop(caller, None)


class WaitSlots(CallerSlots):
    """At most `per_caller` reads of one caller waiting for an offset at once."""

    def refusal(self, n: int) -> str:
        return (
            f"{n} reads of this caller already wait for an offset (at most "
            f"{self.per_caller}); try again when one has answered"
        )


class Refusals:
    """The requests both limits refused, for ``/metrics`` (a prometheus-client collector)."""

    def __init__(self, rate: RateLimit | None, waits: WaitSlots | None) -> None:
        self.rate, self.waits = rate, waits

    def collect(self) -> Iterator[Metric]:
        limited = CounterMetricFamily(
            "tablecast_rate_limited",
            "requests refused with 429: over --rate-limit, or too many offset waits of one caller",
            labels=["limit"],
        )
        limited.add_metric(["rate"], self.rate.refused if self.rate else 0)
        limited.add_metric(["waits"], self.waits.refused if self.waits else 0)
        yield limited
