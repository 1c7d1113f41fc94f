"""A read that finds no ready replica waits briefly for the view to name one (rpc.py)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import pytest

from tablecast.query.consistency import NO_OPTIONS, ReadOptions
from tablecast.query.errors import ApiError
from tablecast.query.ownership import ME
from tablecast.query.peer_calls import NO_REPLICA_GRACE_S, Rpc
from tablecast.query.request import Request


class ViewCatchingUp:
    """Routing whose view names this node only after `after_s` (a replica seen late)."""

    def __init__(self, after_s: float) -> None:
        self.ready_at = time.monotonic() + after_s
        self.asked = 0

    def choices(self, info: Any, partition: int, req: Request, opts: ReadOptions) -> list[Any]:
        self.asked += 1
        return [ME] if time.monotonic() >= self.ready_at else []


class Info:
    name = "t"


def _read(
    routing: ViewCatchingUp,
    headers: dict[str, str] | None = None,
    opts: ReadOptions = NO_OPTIONS,
    choices: list[Any] | None = None,
) -> Any:
    rpc = Rpc(peers=None, routing=routing)  # type: ignore[arg-type]
    req = Request(headers or {})
    here = lambda: (200, b"{}", [])  # noqa: E731
    return asyncio.run(rpc.elsewhere(Info(), 0, choices or [], "/x", req, opts, here))  # type: ignore[arg-type]


def test_a_replica_seen_within_the_grace_answers_instead_of_503() -> None:
    routing = ViewCatchingUp(after_s=NO_REPLICA_GRACE_S / 3)
    assert _read(routing)[0] == 200
    assert routing.asked >= 2


def test_no_replica_within_the_grace_is_503() -> None:
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        _read(ViewCatchingUp(after_s=60))
    assert e.value.code == "partition_unavailable"
    assert time.monotonic() - t0 >= NO_REPLICA_GRACE_S


def test_a_forwarded_read_does_not_wait() -> None:
    routing = ViewCatchingUp(after_s=60)
    with pytest.raises(ApiError):
        _read(routing, {"x-tablecast-hop": "1"})
    assert routing.asked == 0


def test_a_redirect_read_only_this_node_can_answer_is_answered_at_once() -> None:
    opts = replace(NO_OPTIONS, redirect=True)
    t0 = time.monotonic()
    assert _read(ViewCatchingUp(after_s=60), opts=opts, choices=[ME])[0] == 200
    assert time.monotonic() - t0 < NO_REPLICA_GRACE_S / 2
