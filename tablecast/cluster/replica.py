"""A replica: one node's copy of one table partition, how far behind the topic it is, and how fresh.

Freshness is judged against what the broker last said the topic's end was:
``end_seen_at`` is when the broker last confirmed ``end_offset`` (a fetch
reaching the end, or the consumer's statistics), ``current_at`` the time of the
latest such confirmation at which the replica had applied everything up to it.
So a replica cut off from Kafka keeps its ``caught_up`` (it answers from what
it holds) while its staleness grows, whereas one whose own writes fail falls
behind a topic end the broker keeps confirming, and stops counting as caught up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tablecast.cluster.offsetwait import AppliedWaiters
from tablecast.contract.table_info import TableInfo
from tablecast.store import PartitionStore, Write

#: an end confirmed by the broker this recently is fresh (statistics come every second)
FRESH_S = 2.5
#: a caught-up replica behind a fresh topic end for this long stops counting as caught up
STALL_S = 5.0
#: tries of a read without the apply lock before it takes the lock
OPTIMISTIC_TRIES = 3

T = TypeVar("T")


@dataclass(eq=False)
class Replica:
    table: TableInfo
    partition: int
    store: PartitionStore
    #: next offset to read from the topic (an EOF moves it past compacted gaps)
    position: int = 0
    #: the topic's high watermark as last seen
    end_offset: int = 0
    #: the high watermark when restoring began, and whether it has been reached
    restore_target: int = 0
    caught_up: bool = False
    #: reached its restore target once: what it holds is a whole prefix of the topic
    restored: bool = False
    #: monotonic times: the broker last confirmed end_offset; the replica was last at that end;
    #: it was opened; its store last recorded being in sync
    end_seen_at: float = 0.0
    current_at: float = 0.0
    opened_at: float = 0.0
    synced_at: float = 0.0
    #: since when (monotonic) answers from it are stale; None while it is current
    stale_since: float | None = None
    #: the last store write failed with this error (cleared by the next write that succeeds)
    failed: str | None = None
    failed_offset: int = -1
    #: the partition is taken off the consumer until `retry_at` (monotonic)
    paused: bool = False
    retry_at: float = 0.0
    failures: int = 0
    #: released: its store is (being) closed and reads must go elsewhere
    closed: bool = False
    #: its store is being closed and opened again (after a failed write): reads go elsewhere
    reopening: bool = False
    #: reads waiting for an offset to be applied (``min_offset``), woken by the ingest thread
    waiters: AppliedWaiters = field(default_factory=AppliedWaiters)
    #: a seqlock over (store contents, position): odd while a batch is being applied.
    #: A reader that sees the same even version before and after its read read the
    #: store exactly as of `position` (see :meth:`read`)
    version: int = 0
    #: the keys of the batch being applied while `version` is odd
    applying: frozenset[bytes] = frozenset()
    #: the last X-Tablecast-Position header made for this replica, with its position
    position_header: tuple[int, tuple[str, str]] | None = None
    #: held while a batch is applied: the fallback of a read that keeps meeting applies
    lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, writes: Sequence[Write]) -> None:
        """Apply a batch of the topic's next records to the store and move the position past
        them, as one step for readers (the seqlock's odd phase); a failed write raises and
        leaves both as they were."""
        with self.lock:
            self.applying = frozenset(w.key for w in writes)
            self.version += 1
            try:
                self.store.apply(writes)
                self.position = writes[-1].offset + 1
            finally:
                self.version += 1

    def read(self, read: Callable[[], T], key: bytes | None = None) -> tuple[T, int]:
        """`read()` of the store and the position it is exact at: every record below the
        position applied, none above it. A read that overlapped an apply is done again;
        one of a single `key` that the batch being applied does not touch is exact
        either way. A read that keeps meeting applies waits for the current one to end
        (a long restore batch, or applies back to back) and reads under its lock."""
        for _ in range(OPTIMISTIC_TRIES):
            version = self.version
            position = self.position
            result = read()
            if version == self.version and (
                not version & 1 or (key is not None and key not in self.applying)
            ):
                return result, position
        with self.lock:
            return read(), self.position

    def release(self) -> None:
        """Mark it released: readers holding it go elsewhere, waiting ones look again."""
        self.closed = True
        self.waiters.wake_all()

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - self.position)

    def staleness_ms(self, now: float | None = None) -> int:
        """Milliseconds since this replica was last known caught up with the topic end (0: now)."""
        since = self.stale_since
        if since is None:
            return 0
        return int(((time.monotonic() if now is None else now) - since) * 1000)

    @property
    def status(self) -> str:
        if self.failed is not None:
            return "failed"
        if not self.restored:
            return "warming"
        return "serving" if self.caught_up else "stale"

    def state(self) -> dict[str, object]:
        """What heartbeats carry about this replica."""
        state: dict[str, object] = {
            "caught_up": self.caught_up,
            "offset": self.store.applied_offset,
            "lag": self.lag,
            "state": self.status,
            "staleness_ms": self.staleness_ms(),
        }
        if self.failed is not None:
            state["error"] = self.failed
        return state
