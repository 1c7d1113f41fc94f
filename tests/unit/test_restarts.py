"""How often, and after how long, a failed pipeline query is started again."""

from __future__ import annotations

from tablecast.pipeline.run.restarts import Restarts


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_waits_double_up_to_the_ceiling_until_the_budget_is_spent() -> None:
    r = Restarts(budget=6, first_delay_s=1, max_delay_s=8, clock=Clock())
    assert [r.delay("q", "task failed") for _ in range(7)] == [1, 2, 4, 8, 8, 8, None]


def test_budget_is_per_query_and_renews_with_the_window() -> None:
    clock = Clock()
    r = Restarts(budget=2, window_s=60, clock=clock)
    assert r.delay("a", "x") == 1 and r.delay("a", "x") == 2
    assert r.delay("a", "x") is None
    assert r.delay("b", "x") == 1  # another query's failures are its own
    clock.now = 61
    assert r.delay("a", "x") == 1


def test_lost_input_is_never_retried() -> None:
    r = Restarts()
    error = "Partition t-0's offset was changed from 5 to 0 ... set failOnDataLoss to false"
    assert r.delay("q", error) is None
