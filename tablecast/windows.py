"""Time windows for ``grouped_stream.windowed_by(...)``, as in Kafka Streams.

``tumbling(size)``: back-to-back windows [n*size, (n+1)*size).
``hopping(size, advance)``: windows of `size` starting every `advance`, so a
record belongs to every window [start, start + size) that contains its
timestamp (size / advance of them). ``session(gap)``: per key, records less
than `gap` apart (end inclusive) share a session, which grows and merges as
records arrive (Kafka Streams' SessionWindows). Sizes are ``datetime.timedelta`` or Spark
interval strings ("1 minute", "30 seconds", "1 hour 30 minutes").

``join(before, after, grace)``: the window of a stream-stream join (Kafka Streams'
JoinWindows.ofTimeDifferenceAndGrace, before()/after()): a record of this stream meets
records of the other with the same key and ``this.ts - before <= other.ts <= this.ts +
after`` (JoinWindows' ``stream1.ts - before <= stream2.ts <= stream1.ts + after``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

__all__ = [
    "JoinWindows",
    "SessionWindows",
    "Windows",
    "hopping",
    "join",
    "session",
    "to_ms",
    "tumbling",
]

_UNITS = {
    "ms": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
    "w": 604_800_000,
    "week": 604_800_000,
    "weeks": 604_800_000,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*")


def to_ms(duration: timedelta | str) -> int:
    """A timedelta or a Spark interval string as whole milliseconds."""
    if isinstance(duration, timedelta):
        return int(duration / timedelta(milliseconds=1))
    if not isinstance(duration, str):
        raise TypeError(
            f"expected a timedelta or an interval string, not {type(duration).__name__}"
        )
    text = duration.strip().lower()
    text = text.removeprefix("interval").strip()
    pos, total = 0, 0.0
    while pos < len(text):
        m = _PART.match(text, pos)
        if m is None or m.group(2) not in _UNITS:
            raise ValueError(f"not an interval: {duration!r} (e.g. '1 minute', '30 seconds')")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos == 0:
        raise ValueError(f"not an interval: {duration!r}")
    return int(total)


@dataclass(frozen=True)
class Windows:
    size_ms: int
    advance_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise ValueError("a window's size must be positive")
        if not 0 < self.advance_ms <= self.size_ms:
            raise ValueError("a hopping window's advance must be positive and at most its size")

    @property
    def tumbling(self) -> bool:
        return self.advance_ms == self.size_ms

    def starts(self, ts: int) -> list[int]:
        """The start of every window containing `ts` (Kafka Streams' TimeWindows.windowsFor)."""
        first = max(0, ts - self.size_ms + self.advance_ms)
        start = first - first % self.advance_ms
        out = []
        while start <= ts:
            out.append(start)
            start += self.advance_ms
        return out

    def describe(self) -> str:
        if self.tumbling:
            return f"tumbling({self.size_ms} ms)"
        return f"hopping({self.size_ms} ms, advance {self.advance_ms} ms)"


def tumbling(size: timedelta | str) -> Windows:
    ms = to_ms(size)
    return Windows(ms, ms)


def hopping(size: timedelta | str, advance: timedelta | str) -> Windows:
    return Windows(to_ms(size), to_ms(advance))


@dataclass(frozen=True)
class JoinWindows:
    """A stream-stream join's window, in ms: a left record at `ts` meets the right records
    in [ts - before, ts + after] (so a right one at `ts` the left ones in [ts - after,
    ts + before]); a record is taken while stream time is at most its window's end
    (ts + after for a left record, ts + before for a right one) + grace."""

    before_ms: int
    after_ms: int
    grace_ms: int = 0

    def __post_init__(self) -> None:
        if self.before_ms < 0 or self.after_ms < 0 or self.grace_ms < 0:
            raise ValueError("a join window's before, after and grace must not be negative")

    @property
    def retention_ms(self) -> int:
        """How long a record can still meet a record that is not late (Kafka Streams'
        join window store retention: window size + grace)."""
        return self.before_ms + self.after_ms + self.grace_ms

    def describe(self) -> str:
        b, a, g = self.before_ms, self.after_ms, self.grace_ms
        return f"join(before {b} ms, after {a} ms, grace {g} ms)"


def join(
    before: timedelta | str | None = None,
    after: timedelta | str | None = None,
    grace: timedelta | str = timedelta(0),
) -> JoinWindows:
    """The window of ``stream.join(other_stream, joiner, window=...)``. Give one of before
    and after for a symmetric window (Kafka Streams' JoinWindows.of), both for an
    asymmetric one (its before()/after())."""
    if before is None and after is None:
        raise ValueError("windows.join: give before=, after= or both")
    before_ms = to_ms(before if before is not None else after)  # type: ignore[arg-type]
    after_ms = to_ms(after if after is not None else before)  # type: ignore[arg-type]
    return JoinWindows(before_ms, after_ms, to_ms(grace))


# -- session windows ----------------------------------------------------------
@dataclass(frozen=True)
class SessionWindows:
    """Kafka Streams' SessionWindows.ofInactivityGap: a session [start, end] (both
    inclusive) takes a record at ts when start - gap <= ts <= end + gap, and a record that
    bridges two sessions merges them."""

    gap_ms: int

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise ValueError("a session window's inactivity gap must be positive")

    def describe(self) -> str:
        return f"session(gap {self.gap_ms} ms)"


def session(gap: timedelta | str) -> SessionWindows:
    return SessionWindows(to_ms(gap))
