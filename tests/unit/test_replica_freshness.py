"""A replica's freshness: the age of the newest record it applied, by the record's timestamp,
as heartbeats carry it and /v1/cluster and /metrics report it."""

from __future__ import annotations

from tablecast.cluster.replica import Replica, age_ms
from tablecast.contract.table_info import TableInfo
from tablecast.store import Write
from tablecast.store.memory import MemoryStore

INFO = TableInfo(name="t", topic="app.table.t", partitions=1, key={}, value={})


def test_none_before_a_record_is_applied() -> None:
    replica = Replica(INFO, 0, MemoryStore())
    assert replica.freshness_ms(10_000) is None
    assert "newest_ms" not in replica.state()


def test_the_newest_timestamp_applied_counts_not_the_last() -> None:
    replica = Replica(INFO, 0, MemoryStore())
    replica.apply([Write(b"a", b"1", 0, 5_000), Write(b"b", b"2", 1, 7_000)])
    assert replica.freshness_ms(10_000) == 3_000
    # a record written late with an older timestamp leaves the newest as it was
    replica.apply([Write(b"c", None, 2, 4_000)])
    assert replica.freshness_ms(10_000) == 3_000
    assert replica.state()["newest_ms"] == 7_000
    replica.apply([Write(b"a", b"3", 3, 9_500)])
    assert replica.freshness_ms(10_000) == 500


def test_a_clock_behind_the_records_reads_zero_not_negative() -> None:
    assert age_ms(12_000, 10_000) == 0
    assert age_ms(-1, 10_000) is None
    assert age_ms(None) is None


def test_a_timestamp_far_ahead_of_this_clock_does_not_count() -> None:
    import time

    now = int(time.time() * 1000)
    replica = Replica(INFO, 0, MemoryStore())
    replica.apply([Write(b"a", b"1", 0, now - 2_000), Write(b"b", b"2", 1, now + 3_600_000)])
    assert replica.newest_ms == now - 2_000
    replica.apply([Write(b"c", b"3", 2, now + 3_600_000)])
    assert replica.newest_ms == now - 2_000


def test_a_peers_value_that_is_no_timestamp_reads_as_none() -> None:
    assert age_ms("12", 10_000) is None
    assert age_ms(1.5, 10_000) is None
