"""A replica's life as two state machines, the moves each allows written here as data.

Freshness: how its store stands against the table's topic::

    WARMING ──> CURRENT <──> BEHIND

``WARMING``: restoring, what it holds is not yet a whole prefix of the topic (it
answers only when no replica anywhere can). ``CURRENT``: caught up with the
topic's end. ``BEHIND``: it was, and has fallen behind an end the broker keeps
confirming (routing prefers a fresher replica; one cut off from Kafka stays
``CURRENT``, and its staleness grows instead).

Writes: whether its store takes the topic's records::

    WRITING ──> FAILED ──> REOPENING ──> RETRYING ──> WRITING
    (FAILED ──> RETRYING; RETRYING ──> FAILED)

``FAILED``: a write failed; the partition is off the consumer until its retry
time. ``REOPENING``: its store is being closed and opened again (a RocksDB
store takes no writes after a failed one; reads go elsewhere meanwhile); a
reopen that fails stays here, its store closed, and is tried again.
``RETRYING``: back on the consumer at the failed batch, whose next write
decides. A memory store goes from ``FAILED`` to ``RETRYING`` directly.

Both end in ``RELEASED``, when the node lets the partition go: reads holding it
go elsewhere. :meth:`tablecast.cluster.replica.Replica.move` takes a replica
from one state to the next and refuses any move not listed here.
"""

from __future__ import annotations

from enum import Enum


class Freshness(Enum):
    WARMING = "warming"
    CURRENT = "current"
    BEHIND = "behind"
    RELEASED = "released"


class Writes(Enum):
    WRITING = "writing"
    FAILED = "failed"
    REOPENING = "reopening"
    RETRYING = "retrying"
    RELEASED = "released"


class IllegalMove(RuntimeError):
    """A move its state machine does not allow: a bug in whoever asked for it."""


MOVES: dict[Freshness | Writes, frozenset[Freshness | Writes]] = {
    Freshness.WARMING: frozenset({Freshness.CURRENT, Freshness.RELEASED}),
    Freshness.CURRENT: frozenset({Freshness.BEHIND, Freshness.RELEASED}),
    Freshness.BEHIND: frozenset({Freshness.CURRENT, Freshness.RELEASED}),
    Freshness.RELEASED: frozenset(),
    Writes.WRITING: frozenset({Writes.FAILED, Writes.RELEASED}),
    Writes.FAILED: frozenset({Writes.REOPENING, Writes.RETRYING, Writes.RELEASED}),
    Writes.REOPENING: frozenset({Writes.RETRYING, Writes.RELEASED}),
    Writes.RETRYING: frozenset({Writes.WRITING, Writes.FAILED, Writes.RELEASED}),
    Writes.RELEASED: frozenset(),
}

#: the write states in which the store's last write failed (and none has worked since)
FAILING = frozenset({Writes.FAILED, Writes.REOPENING, Writes.RETRYING})
#: the write states in which the partition is off the consumer
PAUSED = frozenset({Writes.FAILED, Writes.REOPENING})


def check(now: Freshness | Writes, to: Freshness | Writes) -> None:
    """Raise IllegalMove unless `to` may follow `now`."""
    if to not in MOVES[now]:
        raise IllegalMove(f"{now.name} -> {to.name}")
