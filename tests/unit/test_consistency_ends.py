"""Positions callers name, judged against where their partitions end: an ``after`` token stays
itself on its way to a peer (min_offset too), ends a node can vouch for answer without the
broker, and a broker that cannot be asked refuses with 503 rather than letting it through."""

from __future__ import annotations

import asyncio

import pytest

from tablecast import serde
from tablecast.contract.table_info import TableInfo
from tablecast.query.consistency import ReadOptions, TopicEnds, bound_of
from tablecast.query.errors import ApiError
from tablecast.query.ratelimit import WaitSlots

INFO = TableInfo("t", "app.table.t", 4, serde.string().spec(), serde.json().spec())


def read_options(params: dict[str, str], headers: dict[str, str], info: TableInfo) -> ReadOptions:
    opts = bound_of(params, params.get("after") or headers.get("x-tablecast-after"))
    opts.check(info)
    return opts


def test_after_and_min_offset_go_on_to_a_peer_as_themselves() -> None:
    opts = read_options({"after": "t@0:5,2:7", "min_offset": "1:9"}, {}, INFO)
    assert opts.after == {0: 5, 2: 7} and opts.at_least == {0: 5, 1: 10, 2: 7}
    # min_offset may name the next record to come: a peer must wait for it, as min_offset
    assert opts.onward("t", [1, 2]) == {"after": "t@2:7", "min_offset": "1:9", "timeout_ms": "1000"}
    assert opts.onward("t", [3]) == {}
    only = read_options({"min_offset": "3:4"}, {"x-tablecast-after": "t@3:2"}, INFO)
    assert only.after == {3: 2} and only.onward("t", [3])["min_offset"] == "3:4"


def test_ends_known_here_answer_and_an_unreachable_broker_refuses() -> None:
    async def run() -> None:
        ends = TopicEnds(lambda: "127.0.0.1:1", timeout_s=0.5)
        waits = WaitSlots(1)
        # within what the node vouches for: no question, no wait slot
        await ends.refuse_beyond(INFO, {0: 5, 1: 0}, {0: 5}, "after", (waits, "me"))
        assert ends.questions == 0
        with pytest.raises(ApiError) as unknown:
            await ends.refuse_beyond(INFO, {0: 6}, {0: 5}, "after", (waits, "me"))
        assert unknown.value.code == "partition_unavailable" and ends.questions == 1
        waits.enter("me")  # the question gave its wait slot back
        waits.leave("me")

    asyncio.run(run())


def test_callers_that_come_while_the_broker_is_asked_share_the_next_question() -> None:
    async def run() -> None:
        ends = TopicEnds(lambda: "127.0.0.1:1", timeout_s=0.3)

        async def claim() -> str:
            try:
                await ends.refuse_beyond(INFO, {0: 6}, {}, "after")
            except ApiError as e:
                return e.code
            return "let through"

        first = asyncio.ensure_future(claim())
        await asyncio.sleep(0.05)  # its question is being put to the broker
        later = [asyncio.ensure_future(claim()) for _ in range(3)]
        codes = await asyncio.gather(first, *later)
        # one question at a time: the three that came during the first share the second
        assert codes == ["partition_unavailable"] * 4 and ends.questions == 2

    asyncio.run(run())
