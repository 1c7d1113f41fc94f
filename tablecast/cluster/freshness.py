"""How fresh a replica is, judged against what the broker last said its topic's end was.

``end_seen_at`` is when the broker last confirmed ``end_offset`` (a fetch
reaching the end, or the consumer's statistics), ``current_at`` the time of the
latest such confirmation at which the replica had applied everything up to it.
So a replica cut off from Kafka stays current (it answers from what it holds)
while its staleness grows, whereas one whose own writes fail falls behind a
topic end the broker keeps confirming, and stops counting as caught up
(:class:`~tablecast.cluster.replica_lifecycle.Freshness`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from tablecast.cluster.fetchwatch import FetchWatch, Slot
from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Freshness
from tablecast.contract.table_info import TableInfo

log = logging.getLogger(__name__)

#: an end confirmed by the broker this recently is fresh (statistics come every second)
FRESH_S = 2.5
#: a caught-up replica behind a fresh topic end for this long stops counting as caught up
STALL_S = 5.0
#: a store's in-sync time is written at most this often while it is current
SYNC_EVERY_S = 30.0
#: how long a leader's connection must have been up for its partitions' high watermarks in
#: the statistics to be newer than the connection (the statistics' interval: one report)
SETTLED_US = 1_000_000


@dataclass
class EndWitness:
    """The partitions whose statistics may confirm their end: those that were fetching from
    a leader connected since before the report before.

    A high watermark in librdkafka's statistics is the one of the partition's last fetch
    response. Right after its leader's connection comes back (a broker outage), or its
    fetch starts again, the report still carries the end from before, and taking that as
    confirmed now would have a replica claim to be current while the broker holds more.
    One report later the fetch (which waits 50 ms at most) has brought the end as it is."""

    fetching: set[Slot] = field(default_factory=set)

    def forget(self, slot: Slot) -> None:
        self.fetching.discard(slot)


def reached_end(replica: Replica, offset: int, now: float) -> None:
    """The consumer reached the end of the replica's partition at `offset`: it is current,
    and caught up if that was its restore target."""
    replica.position = max(replica.position, offset)
    replica.end_offset = max(replica.end_offset, offset)
    replica.end_seen_at = replica.current_at = now
    replica.stale_since = None
    # the end may lie past the last record (compacted away): reads waiting for it are due
    replica.waiters.advanced(replica.position - 1)
    if replica.freshness is Freshness.WARMING and replica.position >= replica.restore_target:
        replica.move(Freshness.CURRENT)
        log.info(
            "table %r partition %d caught up at offset %d",
            replica.table.name,
            replica.partition,
            offset,
        )


def judge(replica: Replica, now: float, wall_ms: float) -> None:
    """Its staleness and whether it counts as caught up, from what the broker last
    confirmed; and, while it is current, the store's record of being in sync."""
    r = replica
    fresh = now - r.end_seen_at <= FRESH_S
    at_end = r.position >= r.end_offset
    if at_end and r.end_seen_at > r.current_at:
        r.current_at = r.end_seen_at
    r.stale_since = None if (at_end and fresh) else (r.current_at or r.opened_at)
    if not r.restored:
        return
    if r.caught_up:
        # behind an end the broker keeps confirming: this replica is falling behind
        # (an unreachable broker confirms nothing, so an outage keeps it serving)
        if fresh and not at_end and now - r.current_at > STALL_S:
            r.move(Freshness.BEHIND)
            log.warning(
                "table %r partition %d is falling behind (lag %d%s); "
                "it no longer counts as caught up",
                r.table.name,
                r.partition,
                r.lag,
                f", store writes failing: {r.failed}" if r.failed else "",
            )
    elif at_end and fresh and r.failed is None:
        r.move(Freshness.CURRENT)
        log.info("table %r partition %d is caught up again", r.table.name, r.partition)
    if r.stale_since is None and now - r.synced_at >= SYNC_EVERY_S and r.failed is None:
        try:
            r.store.mark_synced(int(wall_ms - (now - r.current_at) * 1000))
            r.synced_at = now
        except Exception as e:  # a store that cannot write says so on its next apply
            log.debug("cannot record the sync time of %s/%d: %s", r.table.name, r.partition, e)


def note_statistics(
    text: str,
    by_topic: Mapping[str, TableInfo],
    replicas: Mapping[tuple[str, int], Replica],
    fetches: FetchWatch,
    witness: EndWitness,
    now: float,
) -> None:
    """librdkafka's statistics: each partition's high watermark as of the last fetch,
    trusted once its leader's connection and its fetch have lasted a report (`witness`);
    and each fetch's state, for `fetches`."""
    try:
        stats = orjson.loads(text)
        brokers = stats.get("brokers", {}).values()
        up = {b.get("nodeid") for b in brokers if b.get("state") == "UP"}
        settled = {
            b.get("nodeid")
            for b in brokers
            if b.get("state") == "UP" and b.get("stateage", 0) >= SETTLED_US
        }
        fetching: set[Slot] = set()
        for topic, t in stats.get("topics", {}).items():
            info = by_topic.get(topic)
            if info is None:
                continue
            for part in t.get("partitions", {}).values():
                slot = (info.name, part.get("partition", -1))
                replica = replicas.get(slot)
                hi = part.get("hi_offset", -1)
                if replica is None or replica.paused:
                    continue
                leader, state = part.get("leader"), part.get("fetch_state", "")
                fetches.observe(slot, now, leader in up, state, hi, replica.position)
                if hi < 0 or leader not in settled or state != "active":
                    continue
                fetching.add(slot)
                if slot not in witness.fetching:
                    continue  # its end may predate the fetch: the next report says
                replica.end_offset = max(replica.end_offset, hi)
                replica.end_seen_at = now
        witness.fetching = fetching
    except Exception as e:  # statistics are advisory: never let them break consuming
        log.debug("unreadable consumer statistics: %s", e)
