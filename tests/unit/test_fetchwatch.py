"""The fetch watch: a partition is fetched again only when its leader is up and its fetch
has made no headway for STUCK_S; headway, a new state or a down leader start over."""

from __future__ import annotations

from tablecast.cluster.fetchwatch import FetchWatch

SLOT = ("kv", 1)


def test_a_fetch_not_active_with_its_leader_up_is_due_after_the_wait() -> None:
    w = FetchWatch(stuck_s=10)
    w.observe(SLOT, 0, True, "offset-query", 7, 5)
    w.observe(SLOT, 9, True, "offset-query", 7, 5)
    assert w.taken() == {}
    w.observe(SLOT, 10, True, "offset-query", 7, 5)
    assert w.taken() == {SLOT: "fetch state 'offset-query' for 10 s with its leader up"}
    assert w.taken() == {}  # once; the next wait starts over
    w.observe(SLOT, 11, True, "offset-query", 7, 5)
    w.observe(SLOT, 20, True, "offset-query", 7, 5)
    assert w.taken() == {}


def test_an_active_fetch_behind_the_broker_without_headway_is_due() -> None:
    w = FetchWatch(stuck_s=10)
    for t in range(0, 11):
        w.observe(SLOT, t, True, "active", 9, 4)
    assert w.taken() == {
        SLOT: "no record past offset 4 while the broker holds 9 for 10 s with its leader up"
    }


def test_headway_a_new_state_a_down_leader_or_being_at_the_end_start_over() -> None:
    w = FetchWatch(stuck_s=10)
    w.observe(SLOT, 0, True, "active", 9, 4)
    w.observe(SLOT, 8, True, "active", 9, 5)  # a record arrived
    w.observe(SLOT, 12, True, "active", 9, 5)
    assert w.taken() == {}
    w.observe(SLOT, 13, True, "validate-epoch-wait", 9, 5)  # another state
    w.observe(SLOT, 20, True, "validate-epoch-wait", 9, 5)
    w.observe(SLOT, 21, False, "validate-epoch-wait", 9, 5)  # the broker is down: wait for it
    w.observe(SLOT, 40, True, "validate-epoch-wait", 9, 5)
    assert w.taken() == {}
    w.observe(SLOT, 41, True, "active", 9, 9)  # at the end: nothing to fetch
    w.observe(SLOT, 60, True, "active", 9, 9)
    assert w.taken() == {}
    w.observe(SLOT, 61, True, "none", 9, 9)
    w.forget(SLOT)
    w.observe(SLOT, 75, True, "none", 9, 9)
    assert w.taken() == {}
