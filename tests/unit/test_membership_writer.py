"""A node whose heartbeats stop going out while the others' still come renews its writer;
one that hears nobody (an outage) keeps it."""

from __future__ import annotations

import time

from tablecast.cluster.membership import STUCK_WRITER_S, Member, Membership


def membership() -> Membership:
    # no broker at that address: nothing here connects
    return Membership("127.0.0.1:9", "unit", lambda: Member("a", "http://a"), "a")


def test_a_writer_nobody_hears_while_the_others_are_heard_is_renewed() -> None:
    m = membership()
    now = time.monotonic()
    first = m._producer
    m._heard_others = now
    m._delivered = m._writer_since = now - STUCK_WRITER_S - 1
    m._renew_stuck_writer(now)
    assert m._producer is not first
    second = m._producer
    m._renew_stuck_writer(now + 1)  # a fresh writer gets its own time
    assert m._producer is second


def test_during_an_outage_the_writer_is_kept() -> None:
    m = membership()
    now = time.monotonic()
    first = m._producer
    m._heard_others = now - 10  # the others are silent too: Kafka is
    m._delivered = m._writer_since = now - STUCK_WRITER_S - 1
    m._renew_stuck_writer(now)
    assert m._producer is first
    m._heard_others = now
    m._delivered = now - 1  # ours go out
    m._renew_stuck_writer(now)
    assert m._producer is first
