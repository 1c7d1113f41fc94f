"""Forwarded reads to one peer that leave together, sent as one call.

A node forwards each read it does not own to the owner, and each forward costs
both nodes a request of their own: a write, a wakeup, a read and a parse on the
forwarder, the same plus the HTTP server's work on the owner. Under load many
forwards to the same peer are waiting at once; the ones that arrive within one
turn of the event loop (and carry the same onward headers) leave as one
``POST /internal/reads``, whose answer holds each read's status, headers and body,
exactly as it would have answered alone. A lone read goes as before, so a quiet
node adds no latency.

The headers an answer passes on travel as the HTTP lines they are on the wire
(``name: value\r\n``), and the node's plain key reads take an answer as a
future (:meth:`Coalescer.submit`) rather than a task: the forwarder writes each
answer to its client without parsing or formatting a header, and without a task
per read (10-15 % of the forwarder's CPU per forwarded read, 15-20 % of the
owner's, measured against the JSON-headers framing with a task per read).

A batch answered with anything but 200 (a token refused for all its reads, say)
is sent again read by read, so a batch never changes an answer; a peer that does
not know the route (a node of an earlier version, during a rolling upgrade) gets
its reads one by one for a while (the route's name changed with its framing:
``/internal/batch``, the JSON-headers framing, is answered by none).
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Sequence

import orjson

from tablecast.server.errors import ApiError
from tablecast.server.peers import PeerPool, PeerUnavailable, Response

BATCH_PATH = "/internal/reads"
#: TABLECAST_FORWARD_BATCH=0 sends every forwarded read alone (for comparison)
ENABLED = os.environ.get("TABLECAST_FORWARD_BATCH", "1") != "0"
#: reads per batch at most: a full one takes no more, the next read opens another
MAX_READS = 64
#: what each read of a batch may ask for: the routes a read of one partition forwards
READ_PREFIX = "/v1/tables/"
#: how long a peer without the route gets reads one by one before a batch is tried again
ONE_BY_ONE_S = 60.0
_FRAME = struct.Struct("!HII")  # status, header bytes, body bytes
#: the headers a forwarded answer passes on (the forwarder's own say the rest)
PASS_HEADERS = frozenset(
    (
        "x-tablecast-node",
        "x-tablecast-lag",
        "x-tablecast-staleness-ms",
        "x-tablecast-position",
        "retry-after",
    )
)
#: every read of a batch answers JSON, its errors included (the SPEC's error JSON)
_JSON_LINE = b"content-type: application/json\r\n"
#: status, header lines as they go on the wire, body
RawResponse = tuple[int, bytes, bytes]


def encode_targets(targets: Sequence[str]) -> bytes:
    return orjson.dumps(targets)


def decode_targets(body: bytes) -> list[str]:
    """The reads of a batch's body: a JSON list of GET targets (path and query)."""
    try:
        targets = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ApiError("bad_request", "a batch is a JSON list of GET targets") from None
    if (
        not isinstance(targets, list)
        or not 0 < len(targets) <= MAX_READS
        or not all(isinstance(t, str) and t.startswith(READ_PREFIX) for t in targets)
    ):
        raise ApiError(
            "bad_request", f"a batch is 1 to {MAX_READS} GET targets under {READ_PREFIX}"
        )
    return targets


def header_lines(headers: Sequence[tuple[str, str]]) -> bytes:
    """A read's answer headers as a batch carries them: its content type and the headers a
    forwarder passes on, as HTTP lines."""
    passed = [f"{k}: {v}\r\n" for k, v in headers if k in PASS_HEADERS]
    return _JSON_LINE + "".join(passed).encode("latin-1")


def header_pairs(lines: bytes) -> list[tuple[str, str]]:
    """The headers of :func:`header_lines`' text, as (name, value) pairs."""
    pairs = []
    for line in lines.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(": ")
        if sep:
            pairs.append((name, value))
    return pairs


def encode_answers(
    answers: Sequence[tuple[int, bytes, Sequence[tuple[str, str]] | bytes]],
) -> bytes:
    """Each answer framed: status, header lines, body. An answer's headers may come as
    their lines already (a kept answer's, made once)."""
    out = []
    for status, body, headers in answers:
        head = headers if isinstance(headers, bytes) else header_lines(headers)
        out += (_FRAME.pack(status, len(head), len(body)), head, body)
    return b"".join(out)


def decode_answers(data: bytes, count: int) -> list[RawResponse]:
    answers: list[RawResponse] = []
    at = 0
    try:
        for _ in range(count):
            status, head_len, body_len = _FRAME.unpack_from(data, at)
            at += _FRAME.size
            head = data[at : at + head_len]
            at += head_len
            answers.append((status, head, data[at : at + body_len]))
            at += body_len
    except struct.error as e:
        raise PeerUnavailable(f"bad batch answer: {e}") from None
    if at != len(data) or len(answers) != count:
        raise PeerUnavailable("bad batch answer: its length does not match its reads")
    return answers


def _now() -> float:
    return asyncio.get_running_loop().time()


class _Open:
    __slots__ = ("loop", "targets", "waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        #: kept: asyncio.get_running_loop() costs a getpid() system call per read here
        self.loop = loop
        self.targets: list[str] = []
        self.waiters: list[asyncio.Future[RawResponse]] = []


class Coalescer:
    """GETs to peers, those that leave together sent as one batch per peer and headers."""

    def __init__(self, pool: PeerPool) -> None:
        self.pool = pool
        self._open: dict[tuple[str, tuple[tuple[str, str], ...]], _Open] = {}
        #: peers without the batch route, and until when their reads go one by one
        self._one_by_one: dict[str, float] = {}
        #: batches being sent (the loop keeps only weak references to tasks)
        self._sending: set[asyncio.Task[None]] = set()
        #: batches sent and the reads in them (for /metrics)
        self.batches = 0
        self.batched_reads = 0

    async def get(
        self, base_url: str, target: str, headers: list[tuple[str, str]], timeout: float
    ) -> Response:
        waiter = self.submit(base_url, target, headers, timeout)
        if waiter is None:
            return await self.pool.request(base_url, "GET", target, headers, b"", timeout)
        status, lines, body = await waiter
        return status, header_pairs(lines), body

    def submit(
        self, base_url: str, target: str, headers: list[tuple[str, str]], timeout: float
    ) -> asyncio.Future[RawResponse] | None:
        """The answer to come of a GET of `target`, sent with the reads that leave with it;
        None while the peer takes its reads one by one (see :meth:`get`). The future fails
        with :class:`PeerUnavailable` when no answer came."""
        if self._one_by_one and self._one_by_one.get(base_url, 0.0) > _now():
            return None
        key = (base_url, tuple(headers))
        batch = self._open.get(key)
        if batch is None:
            loop = asyncio.get_running_loop()
            batch = self._open[key] = _Open(loop)
            # after the callbacks that are ready now: the reads they start join this batch
            loop.call_soon(self._leave, key, batch, timeout)
        waiter: asyncio.Future[RawResponse] = batch.loop.create_future()
        batch.targets.append(target)
        batch.waiters.append(waiter)
        if len(batch.targets) >= MAX_READS:
            del self._open[key]  # full: it leaves when its turn comes, the next read opens another
        return waiter

    def _leave(
        self, key: tuple[str, tuple[tuple[str, str], ...]], batch: _Open, timeout: float
    ) -> None:
        if self._open.get(key) is batch:
            del self._open[key]
        task = batch.loop.create_task(self._send(key[0], list(key[1]), batch, timeout))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(
        self, base_url: str, headers: list[tuple[str, str]], batch: _Open, timeout: float
    ) -> None:
        targets, waiters = batch.targets, batch.waiters
        failure = PeerUnavailable(f"{base_url}: the batch was not answered")
        try:
            if len(targets) > 1:
                status, _, body = await self.pool.request(
                    base_url, "POST", BATCH_PATH, headers, encode_targets(targets), timeout
                )
                if status == 200:
                    answers = decode_answers(body, len(targets))
                    self.batches += 1
                    self.batched_reads += len(targets)
                    for waiter, answer in zip(waiters, answers, strict=True):
                        if not waiter.done():
                            waiter.set_result(answer)
                    return
                if status == 404:  # no such route there: an earlier version
                    self._one_by_one[base_url] = _now() + ONE_BY_ONE_S
            pairs = zip(targets, waiters, strict=True)
            await asyncio.gather(*(self._alone(base_url, t, headers, w, timeout) for t, w in pairs))
        except PeerUnavailable as e:
            failure = e
        finally:
            # whatever went wrong (the peer, or a bug here), no read waits for ever
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(PeerUnavailable(str(failure)))

    async def _alone(
        self,
        base_url: str,
        target: str,
        headers: list[tuple[str, str]],
        waiter: asyncio.Future[RawResponse],
        timeout: float,
    ) -> None:
        try:
            status, pairs, body = await self.pool.request(
                base_url, "GET", target, headers, b"", timeout
            )
        except PeerUnavailable as e:
            if not waiter.done():
                waiter.set_exception(e)
            return
        if not waiter.done():
            waiter.set_result((status, header_lines(pairs), body))
