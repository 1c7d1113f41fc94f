"""A replica's two state machines (tablecast/cluster/replica_lifecycle.py): the moves each
allows and no other, and what readers see of a replica in each state."""

from __future__ import annotations

import itertools

import pytest

from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import MOVES, Freshness, IllegalMove, Writes
from tablecast.contract.table_info import TableInfo
from tablecast.store.memory import MemoryStore

INFO = TableInfo(name="t", topic="app.table.t", partitions=1, key={}, value={})


def at(freshness: Freshness, writes: Writes) -> Replica:
    return Replica(INFO, 0, MemoryStore(), freshness=freshness, writes=writes)


@pytest.mark.parametrize("machine", [Freshness, Writes])
def test_each_machine_allows_the_moves_listed_and_no_other(machine: type) -> None:
    for now, to in itertools.product(machine, machine):
        replica = at(
            now if machine is Freshness else Freshness.CURRENT,
            now if machine is Writes else Writes.WRITING,
        )
        if to in MOVES[now]:
            replica.move(to)
            assert to in (replica.freshness, replica.writes)
        else:
            with pytest.raises(IllegalMove):
                replica.move(to)


def test_released_is_the_end_of_both() -> None:
    for freshness, writes in itertools.product(Freshness, Writes):
        if freshness is Freshness.RELEASED or writes is Writes.RELEASED:
            continue
        replica = at(freshness, writes)
        replica.release()
        assert (replica.freshness, replica.writes) == (Freshness.RELEASED, Writes.RELEASED)
        assert replica.closed and not replica.serving
        replica.release()  # again: nothing more happens


@pytest.mark.parametrize(
    ("freshness", "writes", "serving", "caught_up", "restored", "paused", "reopening", "failed"),
    [
        (Freshness.WARMING, Writes.WRITING, False, False, False, False, False, False),
        (Freshness.CURRENT, Writes.WRITING, True, True, True, False, False, False),
        (Freshness.BEHIND, Writes.WRITING, False, False, True, False, False, False),
        # a store whose writes fail answers from what it holds while it is current
        (Freshness.CURRENT, Writes.FAILED, True, True, True, True, False, True),
        (Freshness.CURRENT, Writes.REOPENING, False, True, True, True, True, True),
        (Freshness.CURRENT, Writes.RETRYING, True, True, True, False, False, True),
    ],
)
def test_what_readers_see_in_each_state(
    freshness: Freshness,
    writes: Writes,
    serving: bool,
    caught_up: bool,
    restored: bool,
    paused: bool,
    reopening: bool,
    failed: bool,
) -> None:
    replica = at(freshness, writes)
    replica.error = "OSError: no space left on device"
    assert (
        replica.serving,
        replica.caught_up,
        replica.restored,
        replica.paused,
        replica.reopening,
        replica.failed is not None,
        replica.closed,
    ) == (serving, caught_up, restored, paused, reopening, failed, False)


def test_serving_follows_every_move() -> None:
    replica = at(Freshness.WARMING, Writes.WRITING)
    steps = [
        (Freshness.CURRENT, True),
        (Writes.FAILED, True),
        (Writes.REOPENING, False),  # its store is closed: reads go elsewhere
        (Writes.RETRYING, True),  # open again
        (Freshness.BEHIND, False),
        (Writes.WRITING, False),
        (Freshness.CURRENT, True),
    ]
    for to, serving in steps:
        replica.move(to)
        assert replica.serving is serving, to
