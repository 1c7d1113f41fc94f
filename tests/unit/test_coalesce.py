"""The forwarder's batches (tablecast.query.coalesce) against a small real HTTP peer: reads
that leave together travel as one call, a lone one as before, and a peer that refuses the
batch route gets each read alone with the answer it gives alone; each read's answer (or
its failure) reaches its future or sink exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Awaitable, Callable

import orjson
import pytest

from tablecast.cluster.membership import Member
from tablecast.query import coalesce
from tablecast.query.coalesce import (
    ANSWERS_PATH,
    Coalescer,
    decode_wires,
    encode_answers,
    encode_wires,
    header_pairs,
    unwired,
)
from tablecast.query.errors import ApiError
from tablecast.query.peer_calls import Rpc
from tablecast.query.peer_pool import PeerPool, PeerUnavailable, Response
from tablecast.query.request import Request

Handler = Callable[[str, str, bytes], Awaitable[tuple[int, bytes]]]


class Peer:
    """An HTTP/1.1 keep-alive server answering each request with `handler`; it notes the
    request lines it was sent."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.seen: list[tuple[str, str]] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                length = next(
                    int(line.split(":", 1)[1])
                    for line in lines
                    if line.startswith("content-length")
                )
                body = await reader.readexactly(length)
                self.seen.append((method, target))
                status, answer = await self.handler(method, target, body)
                writer.write(
                    f"HTTP/1.1 {status} X\r\ncontent-length: {len(answer)}\r\n"
                    f"x-tablecast-node: peer\r\n\r\n".encode()
                    + answer
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def _alone(target: str) -> tuple[int, bytes]:
    """What the peer answers a read of `target` alone: 404 for keys named missing-*."""
    key = target.rsplit("/", 1)[1]
    if key.startswith("missing"):
        return 404, ApiError("key_not_found", f"no {key}").body()
    return 200, orjson.dumps({"key": key})


async def _batching(method: str, target: str, body: bytes) -> tuple[int, bytes]:
    if target == ANSWERS_PATH:
        node = [("x-tablecast-node", "peer")]
        return 200, encode_wires([(*_alone(t), node) for t in orjson.loads(body)])
    return _alone(target)


async def _no_route(method: str, target: str, body: bytes) -> tuple[int, bytes]:
    if target == ANSWERS_PATH:
        return 404, ApiError("not_found", "no route").body()
    return _alone(target)


TARGETS = [f"/v1/tables/t/keys/{k}" for k in ("a", "missing-1", "b", "c", "missing-2")]
Check = Callable[[str, Coalescer, Peer], Awaitable[None]]


def _against(handler: Handler, check: Check) -> None:
    """Run `check` with a Coalescer and a peer answering with `handler`."""

    async def run() -> None:
        peer = Peer(handler)
        async with peer as url:
            c = Coalescer(PeerPool())
            try:
                await check(url, c, peer)
            finally:
                c.pool.close()

    asyncio.run(run())


class Sink:
    """Notes each answer and failure it is given; `broken` ones raise on an answer."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken
        self.given: list[object] = []
        self.done = asyncio.get_running_loop().create_future()

    def answered(self, status: int, wire: bytes) -> None:
        self.given.append((status, wire))
        self.done.set_result(None)
        if self.broken:
            raise RuntimeError("a bug in the sink")

    def unanswered(self, error: PeerUnavailable) -> None:
        self.given.append(error)
        self.done.set_result(None)


async def _all(c: Coalescer, url: str, targets: list[str]) -> list[Response]:
    return await asyncio.gather(*(c.get(url, t, [], 2.0) for t in targets))


def test_reads_that_leave_together_travel_as_one_call() -> None:
    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        answers = await _all(c, url, TARGETS)
        assert [(s, b) for s, _, b in answers] == [_alone(t) for t in TARGETS]
        assert all(("x-tablecast-node", "peer") in h for _, h, _ in answers)
        assert peer.seen == [("POST", ANSWERS_PATH)]
        assert (c.batches, c.batched_reads) == (1, len(TARGETS))
        # a lone read goes as a plain GET
        lone = await c.get(url, TARGETS[0], [], 2.0)
        assert lone[0] == 200 and peer.seen[-1] == ("GET", TARGETS[0])

    _against(_batching, check)


def test_different_headers_never_share_a_batch() -> None:
    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        tokens = [[("authorization", f"Bearer {i % 2}")] for i in range(4)]
        await asyncio.gather(*(c.get(url, TARGETS[0], h, 2.0) for h in tokens))
        assert peer.seen == [("POST", ANSWERS_PATH)] * 2

    _against(_batching, check)


def test_a_peer_without_the_route_gets_each_read_alone() -> None:
    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        answers = await _all(c, url, TARGETS)
        assert [(s, b) for s, _, b in answers] == [_alone(t) for t in TARGETS]
        assert peer.seen[0] == ("POST", ANSWERS_PATH)
        assert sorted(peer.seen[1:]) == sorted(("GET", t) for t in TARGETS)
        # for a while, no batch is tried again
        del peer.seen[:]
        await _all(c, url, TARGETS)
        assert all(m == "GET" for m, _ in peer.seen)

    _against(_no_route, check)


def test_an_unreachable_peer_fails_every_read_of_the_batch() -> None:
    """Each future fails, and each sink is told once."""

    async def run() -> None:
        peer = Peer(_batching)
        async with peer as url:
            pass  # closed: nothing listens there now
        c = Coalescer(PeerPool())
        sinks = [Sink() for _ in TARGETS]
        for target, sink in zip(TARGETS, sinks, strict=True):
            c.send(url, target, [], 2.0, sink)
        results = await asyncio.gather(
            *(c.get(url, t, [], 2.0) for t in TARGETS), return_exceptions=True
        )
        assert all(isinstance(r, PeerUnavailable) for r in results)
        await asyncio.wait_for(asyncio.gather(*(s.done for s in sinks)), 5)
        await asyncio.sleep(0.05)  # nothing more comes
        assert all(len(s.given) == 1 and isinstance(s.given[0], PeerUnavailable) for s in sinks)

    asyncio.run(run())


def test_a_full_batch_leaves_and_the_next_read_opens_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(coalesce, "MAX_READS", 3)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        answers = await _all(c, url, TARGETS)
        assert [(s, b) for s, _, b in answers] == [_alone(t) for t in TARGETS]
        assert (c.batches, c.batched_reads) == (2, 5)

    _against(_batching, check)


def test_framing_round_trips_and_refuses_a_short_answer() -> None:
    node = [("x-tablecast-node", "n"), ("content-type", "text/plain"), ("x-other", "o")]
    kept = b"HTTP/1.1 200 OK\r\nx-kept: 1\r\ncontent-length: 2\r\n\r\n{}"
    answers = [
        (200, b'{"a":1}', node),
        (404, b"", []),
        (200, b"{}", b"x-tablecast-lag: 0\r\n"),  # a peer's header lines
        kept,  # a kept answer's whole response
    ]
    data = encode_wires(answers)  # type: ignore[arg-type]
    wires = decode_wires(data, 4)
    assert wires[0] == (
        200,
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-tablecast-node: n\r\n"
        b'content-length: 7\r\n\r\n{"a":1}',
    )
    # only the headers a forwarder passes on, behind the content type every read has
    assert [unwired(w) for w in wires] == [
        (200, b"content-type: application/json\r\nx-tablecast-node: n\r\n", b'{"a":1}'),
        (404, b"content-type: application/json\r\n", b""),
        (200, b"x-tablecast-lag: 0\r\n", b"{}"),  # given as lines already: sent as they are
        (200, b"x-kept: 1\r\n", b"{}"),  # made already: sent as it is
    ]
    assert header_pairs(unwired(wires[0])[1]) == [
        ("content-type", "application/json"),
        ("x-tablecast-node", "n"),
    ]
    not_http = data.replace(b"HTTP/1.1 404", b"HTTP/1.0 404")
    for bad in (data[:-1], data + b"x", not_http):
        with pytest.raises(PeerUnavailable):
            decode_wires(bad, 4)


def test_the_framing_before_keeps_headers_and_body_apart() -> None:
    """What a forwarder of the version before reads (POST /internal/reads)."""
    data = encode_answers([(200, b"{}", [("x-tablecast-node", "n"), ("x-other", "o")])])
    status, head, size = struct.unpack_from("!HII", data)
    lines = b"content-type: application/json\r\nx-tablecast-node: n\r\n"
    assert (status, data[10 : 10 + head], data[10 + head :]) == (200, lines, b"{}")
    assert size == 2 and len(data) == 10 + head + size


def test_sinks_get_their_whole_answers_once_even_beside_a_broken_one() -> None:
    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        sinks = [Sink(broken=i == 1) for i in range(len(TARGETS))]
        assert all(c.send(url, t, [], 2.0, s) for t, s in zip(TARGETS, sinks, strict=True))
        await asyncio.wait_for(asyncio.gather(*(s.done for s in sinks)), 5)
        await asyncio.sleep(0.05)  # nothing more comes
        for target, sink in zip(TARGETS, sinks, strict=True):
            (answer,) = sink.given
            status, lines, body = unwired(answer)  # type: ignore[arg-type]
            assert (status, body) == _alone(target) and b"x-tablecast-node: peer" in lines
        assert peer.seen == [("POST", ANSWERS_PATH)]

    _against(_batching, check)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"{}",
        b"[]",
        b'["/internal/tables/t/scan"]',
        b"[1]",
        orjson.dumps(["/v1/tables/t/keys/a"] * 65),
    ],
)
def test_a_batch_holds_1_to_64_reads_of_tables(body: bytes) -> None:
    with pytest.raises(ApiError) as e:
        coalesce.decode_targets(body)
    assert e.value.status == 400


def test_a_garbled_batch_answer_fails_its_reads_and_none_hangs() -> None:
    async def garbled(method: str, target: str, body: bytes) -> tuple[int, bytes]:
        return (200, b"\x00\x01garbage") if target == ANSWERS_PATH else _alone(target)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        results = await asyncio.wait_for(
            asyncio.gather(*(c.get(url, t, [], 2.0) for t in TARGETS), return_exceptions=True),
            5.0,
        )
        assert all(isinstance(r, PeerUnavailable) for r in results)
        assert c.batches == 0

    _against(garbled, check)


class _Info:
    name = "t"


async def _forward(url_first: str, url_next: str, targets: list[str]) -> list[object]:
    """Rpc.forward of each target, with the peer at `url_first` its first choice and the
    one at `url_next` its second."""
    rpc = Rpc(PeerPool(), routing=None)  # type: ignore[arg-type]
    try:
        choices = [Member("first", url_first), Member("next", url_next)]
        here = lambda: (200, b"here", [])  # noqa: E731
        pending = [
            rpc.forward(_Info(), 0, choices, t, Request({}), here)  # type: ignore[arg-type]
            for t in targets
        ]
        assert all(isinstance(p, asyncio.Future) for p in pending)  # no task of their own
        return await asyncio.gather(*pending)  # type: ignore[arg-type]
    finally:
        rpc.peers.close()


def test_a_forwarded_read_is_the_owners_answer_with_its_header_lines() -> None:
    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        answers = await _forward(url, url, TARGETS)
        lines = b"content-type: application/json\r\nx-tablecast-node: peer\r\n"
        assert answers == [(s, b, lines) for s, b in map(_alone, TARGETS)]
        assert peer.seen == [("POST", ANSWERS_PATH)]

    _against(_batching, check)


def test_a_forwarded_read_its_first_choice_cannot_answer_goes_to_the_next() -> None:
    async def unavailable(method: str, target: str, body: bytes) -> tuple[int, bytes]:
        return 503, ApiError("partition_unavailable", "released").body()

    async def run() -> None:
        gone = Peer(_batching)
        async with gone as gone_url:
            pass  # closed: nothing listens there now
        busy, able = Peer(unavailable), Peer(_batching)
        async with busy as busy_url, able as able_url:
            for first in (gone_url, busy_url):
                answers = await asyncio.wait_for(_forward(first, able_url, TARGETS), 10)
                assert [(s, b) for s, b, _ in answers] == [_alone(t) for t in TARGETS]  # type: ignore[misc]
            # a batch refused is sent again read by read before a read moves on
            assert busy.seen == [("POST", ANSWERS_PATH)] + [("GET", t) for t in TARGETS]

    asyncio.run(run())


def test_reads_wait_in_one_batch_while_batches_are_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under load batches grow: while MAX_IN_FLIGHT batches to a peer are unanswered, the
    reads that come meanwhile (over several turns of the loop) wait in one batch, which
    leaves when one is answered; a batch whose peer failed frees its place too."""
    monkeypatch.setattr(coalesce, "MAX_IN_FLIGHT", 1)
    release = asyncio.Event()
    batches: list[list[str]] = []

    async def slow_then_garbled(method: str, target: str, body: bytes) -> tuple[int, bytes]:
        if target != ANSWERS_PATH:
            return _alone(target)
        batches.append(orjson.loads(body))
        if len(batches) == 1:
            await release.wait()
            return 200, b"\x00garbled"  # the first batch fails
        return await _batching(method, target, body)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        first = [asyncio.ensure_future(c.get(url, t, [], 5.0)) for t in TARGETS[:2]]
        while not batches:
            await asyncio.sleep(0.01)
        later = []
        for target in TARGETS[2:]:  # each in a turn of its own, as clients' reads come
            later.append(asyncio.ensure_future(c.get(url, target, [], 5.0)))
            await asyncio.sleep(0.01)
        assert len(batches) == 1  # held while the first is unanswered
        release.set()
        failed = await asyncio.gather(*first, return_exceptions=True)
        assert all(isinstance(f, PeerUnavailable) for f in failed)
        answers = await asyncio.wait_for(asyncio.gather(*later), 5.0)
        assert [(s, b) for s, _, b in answers] == [_alone(t) for t in TARGETS[2:]]
        assert batches == [TARGETS[:2], TARGETS[2:]]
        # nothing is left counted in flight: the next reads leave at once
        again = await asyncio.wait_for(_all(c, url, TARGETS[:2]), 5.0)
        assert [(s, b) for s, _, b in again] == [_alone(t) for t in TARGETS[:2]]
        assert len(batches) == 3

    _against(slow_then_garbled, check)


async def _never(method: str, target: str, body: bytes) -> tuple[int, bytes]:
    """A peer that takes each request and never answers it."""
    await asyncio.sleep(60)
    return _alone(target)


def test_a_batch_held_behind_unanswered_ones_fails_within_its_reads_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its wait for a place counts: when the batch in flight goes unanswered for the whole
    timeout, the reads held behind it fail soon after, not a second timeout later."""
    monkeypatch.setattr(coalesce, "MAX_IN_FLIGHT", 1)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        first = [asyncio.ensure_future(c.get(url, t, [], 1.0)) for t in TARGETS[:2]]
        await asyncio.sleep(0.05)
        held = [asyncio.ensure_future(c.get(url, t, [], 1.0)) for t in TARGETS[2:]]
        failed = await asyncio.gather(*first, *held, return_exceptions=True)
        assert all(isinstance(f, PeerUnavailable) for f in failed)
        assert loop.time() - started < 1.6  # a second timeout would end at 2 s

    _against(_never, check)


def test_a_full_batch_leaves_at_once_also_while_others_are_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Holding a batch that cannot grow would only delay it."""
    monkeypatch.setattr(coalesce, "MAX_IN_FLIGHT", 1)
    monkeypatch.setattr(coalesce, "MAX_READS", 2)
    release = asyncio.Event()
    batches: list[list[str]] = []

    async def first_waits(method: str, target: str, body: bytes) -> tuple[int, bytes]:
        batches.append(orjson.loads(body))
        if len(batches) == 1:
            await release.wait()
        return await _batching(method, target, body)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        first = [asyncio.ensure_future(c.get(url, t, [], 5.0)) for t in TARGETS[:2]]
        while not batches:
            await asyncio.sleep(0.01)
        full = [asyncio.ensure_future(c.get(url, t, [], 5.0)) for t in TARGETS[2:4]]
        answers = await asyncio.wait_for(asyncio.gather(*full), 5.0)  # the first still waits
        assert [(s, b) for s, _, b in answers] == [_alone(t) for t in TARGETS[2:4]]
        release.set()
        await asyncio.gather(*first)
        assert batches == [TARGETS[:2], TARGETS[2:4]]

    _against(first_waits, check)


def test_a_batch_held_past_its_reads_time_fails_them_without_being_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batch in flight is still unanswered (its peer is slow to connect, say): the reads
    held behind it fail when their time is up, and go no later."""
    monkeypatch.setattr(coalesce, "MAX_IN_FLIGHT", 1)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        loop = asyncio.get_running_loop()
        first = [asyncio.ensure_future(c.get(url, t, [], 5.0)) for t in TARGETS[:2]]
        await asyncio.sleep(0.05)
        started = loop.time()
        held = [asyncio.ensure_future(c.get(url, t, [], 0.3)) for t in TARGETS[2:]]
        failed = await asyncio.gather(*held, return_exceptions=True)
        assert all(isinstance(f, PeerUnavailable) for f in failed)
        assert loop.time() - started < 2.0  # not when the batch ahead of them failed (5 s)
        assert len(peer.seen) == 1  # never sent
        for f in first:
            f.cancel()

    _against(_never, check)


def test_a_batch_cancelled_before_it_is_sent_fails_its_reads_and_frees_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As when a node stops: no read waits for ever, and later reads still leave."""
    monkeypatch.setattr(coalesce, "MAX_IN_FLIGHT", 1)

    async def check(url: str, c: Coalescer, peer: Peer) -> None:
        cancelled = [asyncio.ensure_future(c.get(url, t, [], 5.0)) for t in TARGETS[:2]]
        await asyncio.sleep(0)  # the reads join their batch
        await asyncio.sleep(0)  # the batch leaves: its task is made, and not yet run
        (sending,) = c._sending
        sending.cancel()
        failed = await asyncio.wait_for(asyncio.gather(*cancelled, return_exceptions=True), 5)
        assert all(isinstance(f, PeerUnavailable) for f in failed)
        answers = await asyncio.wait_for(_all(c, url, TARGETS), 5.0)
        assert [(s, b) for s, _, b in answers] == [_alone(t) for t in TARGETS]

    _against(_batching, check)


def test_a_peer_that_never_accepts_the_connection_fails_within_the_timeout() -> None:
    """A peer whose accept queue is full drops the connection's SYNs, as a host that
    drops packets does: the connection waits no longer than the request's timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    queued = []
    for _ in range(3):  # fill the accept queue
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        queued.append(s)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(PeerUnavailable, match="no connection in time"):
            await PeerPool().request(f"http://127.0.0.1:{port}", "GET", "/x", [], b"", 0.5)
        return loop.time() - started

    try:
        assert asyncio.run(main()) < 3.0  # the system's own connect timeout is minutes
    finally:
        for s in (*queued, listener):
            s.close()
