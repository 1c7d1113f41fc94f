"""The deaf-consumer check: a question to the broker only after `deaf_s` of silence, asked
off the caller's thread, at most once per `deaf_s`, and a replaced consumer's silence
counted from its replacement (the watch feed was replaced twice before that)."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest

from tablecast.kafka import deafness
from tablecast.kafka.deafness import DeafCheck

SLOT = ("t", 0)


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The questions sent to 'the broker', answered with end 40 (or failing, if told)."""
    calls: list[Any] = []

    def ends(bootstrap: str, slots: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        calls.append(slots)
        if bootstrap == "down":
            raise RuntimeError("no broker")
        return dict.fromkeys(slots, 40)

    monkeypatch.setattr(deafness, "ends_from_a_fresh_client", ends)
    return calls


def answer(check: DeafCheck, now: float, heard: dict[tuple[str, int], float]) -> Any:
    """Call until the question in flight has been answered (it runs on another thread)."""
    for _ in range(200):
        got = check.confirmed(now, heard)
        if got or check._question is None:
            return got
        time.sleep(0.01)
    raise AssertionError("the question was never answered")


def test_silence_shorter_than_deaf_s_asks_nothing(asked: list[Any]) -> None:
    check = DeafCheck("b", deaf_s=15)
    assert check.confirmed(100.0, {SLOT: 90.0}) == {}
    assert asked == []


def test_a_long_silence_is_asked_about_once_and_answered(asked: list[Any]) -> None:
    check = DeafCheck("b", deaf_s=15)
    assert check.confirmed(100.0, {SLOT: 80.0}) == {}  # the question goes out
    assert answer(check, 100.5, {SLOT: 80.0}) == {SLOT: 40}
    assert check.confirmed(101.0, {SLOT: 80.0}) == {}  # not again within deaf_s
    assert asked == [[SLOT]]


def test_a_partition_heard_of_meanwhile_is_not_reported(asked: list[Any]) -> None:
    check = DeafCheck("b", deaf_s=15)
    check.confirmed(100.0, {SLOT: 80.0})
    assert answer(check, 100.5, {SLOT: 100.2}) == {}


def test_an_outage_for_every_client_reports_nothing(asked: list[Any]) -> None:
    check = DeafCheck("down", deaf_s=15)
    check.confirmed(100.0, {SLOT: 80.0})
    assert answer(check, 100.5, {SLOT: 80.0}) == {}
    assert len(asked) == 1


def test_a_replaced_consumer_gets_deaf_s_to_be_heard_from(asked: list[Any]) -> None:
    check = DeafCheck("b", deaf_s=15)
    check.replaced(100.0)
    assert check.confirmed(110.0, {SLOT: 80.0}) == {}
    assert asked == []
    check.confirmed(115.0, {SLOT: 80.0})
    assert answer(check, 115.0, {SLOT: 80.0}) == {SLOT: 40}


def test_statistics_name_the_partitions_fetched_from_a_connected_leader() -> None:
    stats = {
        "brokers": {
            "127.0.0.1:9092/1": {"nodeid": 1, "state": "UP"},
            "127.0.0.1:9093/2": {"nodeid": 2, "state": "DOWN"},
        },
        "topics": {
            "t": {
                "partitions": {
                    "0": {"partition": 0, "leader": 1, "fetch_state": "active"},
                    "1": {"partition": 1, "leader": 2, "fetch_state": "active"},  # leader down
                    "2": {"partition": 2, "leader": 1, "fetch_state": "offset-query"},
                    "-1": {"partition": -1, "leader": -1, "fetch_state": "none"},
                }
            }
        },
    }
    assert deafness.fetching(orjson.dumps(stats).decode()) == [("t", 0)]
    assert deafness.fetching("not json") == []
    assert deafness.fetching("{}") == []
