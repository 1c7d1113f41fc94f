"""A replica: one node's copy of one table partition, how far behind the topic it is, and how
fresh (judged by :mod:`tablecast.cluster.freshness`; its states are
:mod:`tablecast.cluster.replica_lifecycle`'s)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from tablecast.cluster.offsetwait import AppliedWaiters
from tablecast.cluster.replica_lifecycle import FAILING, PAUSED, Freshness, Writes, check
from tablecast.contract.table_info import TableInfo
from tablecast.store import PartitionStore, Write

#: tries of a read without the apply lock before it takes the lock
OPTIMISTIC_TRIES = 3
#: how far ahead of this node's clock a record's timestamp may be and still count as newest
FUTURE_TOLERANCE_MS = 60_000

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
    #: the high watermark when restoring began
    restore_target: int = 0
    #: the newest timestamp (epoch ms) of the records applied since it was opened; -1: none
    newest_ms: int = -1
    #: its two state machines (tablecast.cluster.replica_lifecycle): moved by :meth:`move`
    freshness: Freshness = Freshness.WARMING
    writes: Writes = Writes.WRITING
    #: monotonic times: the broker last confirmed end_offset; the replica was last at that end;
    #: it was opened; its store last recorded being in sync
    end_seen_at: float = 0.0
    current_at: float = 0.0
    opened_at: float = 0.0
    synced_at: float = 0.0
    #: since when (monotonic) answers from it are stale; None while it is current
    stale_since: float | None = None
    #: the last failed store write's error, and the offset its batch began at
    error: str = ""
    failed_offset: int = -1
    #: while writes fail: when (monotonic) to try again, and how many tries failed
    retry_at: float = 0.0
    failures: int = 0
    #: whether the store itself refused them (it is reopened before the retry), or they
    #: could not be made (their writer schema did not come: the store is fine)
    store_failed: bool = True
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
    #: caught up, and neither released nor reopening: what a plain read asks, kept by move()
    #: as one attribute for the read path
    serving: bool = field(init=False, default=False)
    #: (table, partition), the key ownership and the ingestor know it by: one tuple for
    #: every reader of it, so a read that checks ownership hashes a tuple already in cache
    slot: tuple[str, int] = field(init=False)

    def __post_init__(self) -> None:
        self.slot = (self.table.name, self.partition)
        self._note_serving()

    def _note_serving(self) -> None:
        self.serving = self.freshness is Freshness.CURRENT and self.writes is not Writes.REOPENING

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
                self._note_newest(writes)
            finally:
                self.version += 1

    def skip_past(self, offset: int) -> None:
        """Move past a record that changes nothing (one counted bad and left out), so that
        its offset counts as applied, as every other record's does once applied."""
        with self.lock:
            if offset < self.position:
                return
            self.store.skip_past(offset)
            self.position = offset + 1
        self.waiters.advanced(offset)

    def _note_newest(self, writes: Sequence[Write]) -> None:
        newest = max(w.timestamp for w in writes)
        if newest <= self.newest_ms:
            return
        # a record stamped ahead of this clock (a producer's skewed clock) would pin its
        # freshness at 0 until the time comes: such timestamps do not count
        bound = int(time.time() * 1000) + FUTURE_TOLERANCE_MS
        if newest > bound:
            newest = max((w.timestamp for w in writes if w.timestamp <= bound), default=-1)
        self.newest_ms = max(self.newest_ms, newest)

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

    def move(self, to: Freshness | Writes) -> None:
        """Take one of its state machines to `to`; IllegalMove if that machine does not
        allow it from where it is."""
        if isinstance(to, Freshness):
            check(self.freshness, to)
            self.freshness = to
        else:
            check(self.writes, to)
            self.writes = to
        self._note_serving()

    def release(self) -> None:
        """Mark it released: readers holding it go elsewhere, waiting ones look again."""
        if self.freshness is not Freshness.RELEASED:
            self.move(Freshness.RELEASED)
            self.move(Writes.RELEASED)
        self.waiters.wake_all()

    # -- what readers, routing and the heartbeat ask of it -----------------------------
    @property
    def caught_up(self) -> bool:
        return self.freshness is Freshness.CURRENT

    @property
    def restored(self) -> bool:
        """It reached its restore target once: what it holds is a whole prefix of the topic."""
        return self.freshness is Freshness.CURRENT or self.freshness is Freshness.BEHIND

    @property
    def closed(self) -> bool:
        """Released: its store is (being) closed and reads must go elsewhere."""
        return self.freshness is Freshness.RELEASED

    @property
    def reopening(self) -> bool:
        """Its store is being closed and opened again (after a failed write)."""
        return self.writes is Writes.REOPENING

    @property
    def paused(self) -> bool:
        """Taken off the consumer (after a failed write) until it is retried."""
        return self.writes in PAUSED

    @property
    def failed(self) -> str | None:
        """The error of its last store write while writes fail; None while they work."""
        return self.error if self.writes in FAILING else None

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - self.position)

    def staleness_ms(self, now: float | None = None) -> int:
        """Milliseconds since this replica was last known caught up with the topic end (0: now)."""
        since = self.stale_since
        if since is None:
            return 0
        return int(((time.monotonic() if now is None else now) - since) * 1000)

    def freshness_ms(self, now_ms: int | None = None) -> int | None:
        """How old the newest record it applied is, by the record's timestamp (the time its
        input was written, when the pipeline stamps it); None before it applied one. On a
        quiet topic this grows while the replica stays caught up: lag and staleness say
        whether it is behind, this how old what it answers is."""
        return age_ms(self.newest_ms, now_ms)

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
        if self.newest_ms >= 0:
            state["newest_ms"] = self.newest_ms
        if self.failed is not None:
            state["error"] = self.failed
        return state


def age_ms(newest_ms: object, now_ms: int | None = None) -> int | None:
    """Milliseconds from a record timestamp (epoch ms) to now, never below 0; None for none
    (or for anything but a timestamp, as a peer's heartbeat might carry)."""
    if not isinstance(newest_ms, int) or newest_ms < 0:
        return None
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return max(0, now - newest_ms)
