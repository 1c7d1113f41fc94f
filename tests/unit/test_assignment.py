"""Assignment: deterministic, balanced, distinct replicas, and sticky under membership change."""

from __future__ import annotations

from collections import Counter

import pytest

from tablecast.cluster.assignment import assign

SLOTS = [("t", p) for p in range(12)] + [("u", p) for p in range(30)]


def moved_actives(before: dict, after: dict) -> int:  # type: ignore[type-arg]
    return sum(before[s][0] != after[s][0] for s in before)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("standbys", [0, 1, 2])
def test_balanced_and_distinct(n: int, standbys: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    a = assign(nodes, SLOTS, standbys)
    assert a == assign(list(reversed(nodes)), SLOTS, standbys)  # order of discovery is irrelevant
    for owners in a.values():
        assert len(owners) == min(n, 1 + standbys)
        assert len(set(owners)) == len(owners)
    actives = Counter(o[0] for o in a.values())
    assert max(actives.values()) <= -(-len(SLOTS) // n)
    assert set(actives) == set(nodes)


def test_sticky_when_a_node_joins_or_leaves() -> None:
    three = assign(["a", "b", "c"], SLOTS, 1)
    four = assign(["a", "b", "c", "d"], SLOTS, 1)
    # the newcomer takes about its share of actives; few others move
    assert moved_actives(three, four) <= len(SLOTS) // 4 + 6
    two = assign(["a", "b"], SLOTS, 1)
    # when c leaves, the actives of a and b mostly stay where they were
    kept = [s for s in SLOTS if three[s][0] != "c"]
    assert sum(three[s][0] == two[s][0] for s in kept) >= len(kept) - 6


def test_no_members() -> None:
    assert assign([], SLOTS[:2], 1) == {SLOTS[0]: [], SLOTS[1]: []}
