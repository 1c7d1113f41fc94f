"""Per-caller limits: requests per second (``serve --rate-limit``) and concurrent offset waits.

A caller is its JWT ``sub`` when auth is on, else its client address. Both
limits answer ``429 rate_limited`` with ``Retry-After``: the caller asked for
more than its share, and asking again later is the remedy.

Memory stays bounded however many callers there are: a bucket that has
refilled is indistinguishable from a new one, so when the table of buckets is
full the refilled ones are dropped; should every one still be draining (a
flood of distinct callers), the table starts over — a caller then gets a fresh
burst, never a wrong refusal.
"""

from __future__ import annotations

import math
import time

from tablecast.server.errors import ApiError

MAX_CALLERS = 100_000


class TokenBuckets:
    """A token bucket per caller: `rate` requests per second, bursts of up to `burst`."""

    def __init__(self, rate: float, burst: float | None = None) -> None:
        if rate <= 0:
            raise ValueError("the rate limit is a positive number of requests per second")
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
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
            wait = math.ceil((1.0 - tokens) / self.rate)
            raise ApiError(
                "rate_limited",
                f"more than {self.rate:g} requests per second; try again in {wait} s",
                [("retry-after", str(wait))],
            )
        self._buckets[caller] = (tokens - 1.0, now)

    def _sweep(self, now: float) -> None:
        full = self.burst / self.rate  # seconds for an empty bucket to refill
        self._buckets = {c: b for c, b in self._buckets.items() if now - b[1] < full}
        if len(self._buckets) >= MAX_CALLERS:
            self._buckets = {}

    def __len__(self) -> int:
        return len(self._buckets)


class WaitSlots:
    """At most `per_caller` reads of one caller waiting for an offset at once."""

    def __init__(self, per_caller: int) -> None:
        self.per_caller = per_caller
        self._waiting: dict[str, int] = {}
        self.refused = 0

    def enter(self, caller: str) -> None:
        n = self._waiting.get(caller, 0)
        if n >= self.per_caller:
            self.refused += 1
            raise ApiError(
                "rate_limited",
                f"{n} reads of this caller already wait for an offset (at most "
                f"{self.per_caller}); try again when one has answered",
                [("retry-after", "1")],
            )
        self._waiting[caller] = n + 1

    def leave(self, caller: str) -> None:
        n = self._waiting.get(caller, 0) - 1
        if n > 0:
            self._waiting[caller] = n
        else:  # nobody of this caller waits: no entry, so the table holds only waiting callers
            self._waiting.pop(caller, None)
