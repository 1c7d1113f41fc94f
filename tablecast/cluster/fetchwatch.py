"""Noticing a partition whose fetch has stopped while its broker is up, so it is restarted.

After a broker comes back, librdkafka normally resumes fetching every assigned
partition by itself. A CI run once saw a node's reads stay at the pre-outage
value for 150 s after the broker returned, while the node's own heartbeats
came back through the same broker: that node's table consumer fetched nothing.
The consumer's statistics (every second) say, per partition, whether its
leader's connection is up, its fetch state and the broker's high watermark;
this watch turns them into "fetch again from the replica's position" when, with
the leader up, the fetch has not been ``active`` for ``STUCK_S``, or has been
active while the broker holds records past the position and none arrived.
Seeking to the position the replica has applied up to loses and repeats
nothing: the next record applied is the next offset. A consumer deaf as a whole
(no statistics with its leader up, so nothing here fires) is replaced instead:
see :mod:`tablecast.kafka.deafness`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Slot = tuple[str, int]  # (table, partition)

#: how long a partition may sit without fetching (leader up) before it is restarted
STUCK_S = 10.0


@dataclass
class _Seen:
    since: float  # when this state (or this position) was first seen
    state: str
    position: int


@dataclass
class FetchWatch:
    """Per held partition: since when its fetch made no headway with its leader up."""

    stuck_s: float = STUCK_S
    _seen: dict[Slot, _Seen] = field(default_factory=dict)
    #: partitions to fetch again, with why, until taken()
    _due: dict[Slot, str] = field(default_factory=dict)

    def observe(
        self, slot: Slot, now: float, leader_up: bool, state: str, hi: int, position: int
    ) -> None:
        """One statistics sample of a held, unpaused partition."""
        idle = state != "active" or (hi > position >= 0)
        if not leader_up or not idle:
            self._seen.pop(slot, None)  # nothing to fetch from, or all fetched
            return
        seen = self._seen.get(slot)
        if seen is None or seen.state != state or seen.position != position:
            self._seen[slot] = _Seen(now, state, position)  # headway, or a new state
            return
        if now - seen.since >= self.stuck_s:
            why = (
                f"fetch state {state!r}"
                if state != "active"
                else f"no record past offset {position} while the broker holds {hi}"
            )
            self._due[slot] = f"{why} for {now - seen.since:.0f} s with its leader up"
            del self._seen[slot]

    def taken(self) -> dict[Slot, str]:
        """The partitions to fetch again (each once), with why."""
        due, self._due = self._due, {}
        return due

    def forget(self, slot: Slot) -> None:
        self._seen.pop(slot, None)
        self._due.pop(slot, None)
