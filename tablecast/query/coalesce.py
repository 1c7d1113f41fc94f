"""Forwarded reads to one peer that leave together, sent as one call.

A node forwards each read it does not own to the owner, and each forward costs
both nodes a request of their own: a write, a wakeup, a read and a parse on the
forwarder, the same plus the HTTP server's work on the owner. Under load many
forwards to the same peer are waiting at once; the ones that arrive within one
turn of the event loop (and carry the same onward headers) leave as one
``POST /internal/answers``, whose answer holds each read's whole HTTP/1.1
response (status line, the headers a forwarder passes on, length, body), exactly
as it would have answered alone. A lone read goes as before, so a quiet node adds
no latency. While MAX_IN_FLIGHT batches to a peer are unanswered, the reads that
come meanwhile wait in the open batch, which leaves when one is answered: under
load batches grow, so both nodes pay a batch's fixed cost (a request, a task,
system calls, wake-ups) less often. That holds per peer and onward headers; a
full batch is never held, and a held one fails when its first read's time is up.

The forwarder writes such a response to its client as it came (the owner's kept
answers are already in that form: :mod:`tablecast.query.kept_answers`), and the
node's plain key reads take it by a call (:class:`Sink`) rather than a future and
a callback per read: the forwarder neither parses nor formats a header. Reads
the router forwards take a future (:meth:`Coalescer.submit`).

A batch answered with anything but 200 (a token refused for all its reads, say)
is sent again read by read, so a batch never changes an answer; a peer that does
not know the route (a node of an earlier version, during a rolling upgrade) gets
its reads one by one for a while. The framing before this one (``POST
/internal/reads``: status, header lines and body apart) is still answered, so a
node of the version before forwards in batches to this one during an upgrade.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Protocol

import orjson
from prometheus_client.core import CounterMetricFamily, Metric

from tablecast.query.answer_bytes import kept_alive, sized_head, split
from tablecast.query.errors import ApiError
from tablecast.query.peer_pool import PeerPool, PeerUnavailable, Response

log = logging.getLogger(__name__)

#: the route of batches whose answers are whole HTTP/1.1 responses
ANSWERS_PATH = "/internal/answers"
#: the route of the version before (header lines and body apart), still answered
BATCH_PATH = "/internal/reads"
#: reads per batch at most: a full one takes no more, the next read opens another
MAX_READS = 64
#: what each read of a batch may ask for: the routes a read of one partition forwards
READ_PREFIX = "/v1/tables/"
#: batches to one peer (with the same headers) sent and not yet answered, at most: the
#: reads that come meanwhile wait in the open batch, so under load batches grow
MAX_IN_FLIGHT = 2
#: how long a peer without the route gets reads one by one before a batch is tried again
ONE_BY_ONE_S = 60.0
_WIRE_FRAME = struct.Struct("!HI")  # status, response bytes
_FRAME = struct.Struct("!HII")  # status, header bytes, body bytes (BATCH_PATH's)
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
#: every read of a batch answers JSON, its errors included (the API's error JSON)
JSON = ("content-type", "application/json")
_JSON_LINE = b"content-type: application/json\r\n"
#: status and the whole HTTP/1.1 response, as the forwarder writes it to its client
RawResponse = tuple[int, bytes]
#: a read's answer as a batch's encoders take it: status, body, and its headers (or a peer's
#: header lines, as they go on the wire)
Made = tuple[int, bytes, Sequence[tuple[str, str]] | bytes]


class Sink(Protocol):
    """Where a forwarded read's answer goes, called on the event loop."""

    def answered(self, status: int, wire: bytes) -> None: ...

    def unanswered(self, error: PeerUnavailable) -> None: ...


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


def passed(headers: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """A read's answer headers as a forwarder gives them: its content type and the headers
    it passes on."""
    return [JSON, *((k, v) for k, v in headers if k in PASS_HEADERS)]


def header_lines(headers: Sequence[tuple[str, str]]) -> bytes:
    """:func:`passed`'s headers as HTTP lines (BATCH_PATH's framing)."""
    lines = [f"{k}: {v}\r\n" for k, v in headers if k in PASS_HEADERS]
    return _JSON_LINE + "".join(lines).encode("latin-1")


def header_pairs(lines: bytes) -> list[tuple[str, str]]:
    """The headers of HTTP lines, as (name, value) pairs."""
    pairs = []
    for line in lines.decode("latin-1").split("\r\n"):
        name, sep, value = line.partition(": ")
        if sep:
            pairs.append((name, value))
    return pairs


def encode_wires(answers: Sequence[Made | bytes]) -> bytes:
    """Each answer framed as its status and whole response (ANSWERS_PATH's framing); a
    `bytes` answer is a 200's whole response made already (a kept answer's)."""
    out = []
    for answer in answers:
        if isinstance(answer, bytes):
            status, wire = 200, answer
        else:
            status, body, headers = answer
            if isinstance(headers, bytes):
                wire = sized_head(status, [], len(body), False, headers) + body
            else:
                wire = kept_alive(status, passed(headers), body)
        out += (_WIRE_FRAME.pack(status, len(wire)), wire)
    return b"".join(out)


def encode_answers(answers: Sequence[Made]) -> bytes:
    """Each answer framed as status, header lines, body (BATCH_PATH's framing)."""
    out = []
    for status, body, headers in answers:
        head = headers if isinstance(headers, bytes) else header_lines(headers)
        out += (_FRAME.pack(status, len(head), len(body)), head, body)
    return b"".join(out)


def decode_wires(data: bytes, count: int) -> list[RawResponse]:
    answers: list[RawResponse] = []
    at = 0
    try:
        for _ in range(count):
            status, size = _WIRE_FRAME.unpack_from(data, at)
            at += _WIRE_FRAME.size
            if not data.startswith(b"HTTP/1.1 ", at):
                raise PeerUnavailable("bad batch answer: a read's is not an HTTP/1.1 response")
            answers.append((status, data[at : at + size]))
            at += size
    except struct.error as e:
        raise PeerUnavailable(f"bad batch answer: {e}") from None
    if at != len(data):
        raise PeerUnavailable("bad batch answer: its length does not match its reads")
    return answers


def unwired(answer: RawResponse) -> tuple[int, bytes, bytes]:
    """A forwarded answer's status, header lines (without its length) and body."""
    try:
        status, lines, body = split(answer[1])
    except ValueError as e:
        raise PeerUnavailable(f"bad batch answer: {e}") from None
    return status, lines, body


def _now() -> float:
    return asyncio.get_running_loop().time()


class _Open:
    __slots__ = ("ended", "expiry", "loop", "opened", "sinks", "targets", "timeout")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        #: kept: asyncio.get_running_loop() costs a getpid() system call per read here
        self.loop = loop
        self.opened = loop.time()
        self.timeout = timeout
        self.targets: list[str] = []
        self.sinks: list[Sink | asyncio.Future[RawResponse]] = []
        #: while it is held: the timer that fails it if it is held past its reads' time
        self.expiry: asyncio.TimerHandle | None = None
        #: every read of it has been given its answer or its failure
        self.ended = False


_Key = tuple[str, tuple[tuple[str, str], ...]]


def _deliver(
    sink: Sink | asyncio.Future[RawResponse], answer: RawResponse | PeerUnavailable
) -> None:
    if isinstance(sink, asyncio.Future):
        if not sink.done():
            if isinstance(answer, PeerUnavailable):
                sink.set_exception(answer)
            else:
                sink.set_result(answer)
        return
    try:
        if isinstance(answer, PeerUnavailable):
            sink.unanswered(answer)
        else:
            sink.answered(*answer)
    except Exception:  # the sink's bug: the other reads of the batch still get theirs
        log.exception("a forwarded read's answer could not be given")


class Coalescer:
    """GETs to peers, those that leave together sent as one batch per peer and headers."""

    def __init__(self, pool: PeerPool) -> None:
        self.pool = pool
        self._open: dict[_Key, _Open] = {}
        #: per peer and headers, batches sent and not yet answered
        self._in_flight: dict[_Key, int] = {}
        #: per peer and headers, batches that wait for one in flight to be answered
        self._held: dict[_Key, deque[_Open]] = {}
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
        status, lines, body = unwired(await waiter)
        return status, header_pairs(lines), body

    def collect(self) -> Iterator[Metric]:
        """What it sent, for ``/metrics`` (a prometheus-client collector)."""
        batches = CounterMetricFamily(
            "tablecast_forward_batches", "batches of forwarded reads sent"
        )
        batches.add_metric([], self.batches)
        yield batches
        reads = CounterMetricFamily(
            "tablecast_forward_batched_reads", "forwarded reads sent in a batch"
        )
        reads.add_metric([], self.batched_reads)
        yield reads

    def submit(
        self, base_url: str, target: str, headers: list[tuple[str, str]], timeout: float
    ) -> asyncio.Future[RawResponse] | None:
        """The answer to come of a GET of `target`, sent with the reads that leave with it;
        None while the peer takes its reads one by one (see :meth:`get`). The future fails
        with :class:`PeerUnavailable` when no answer came."""
        batch = self._batch(base_url, headers, timeout)
        if batch is None:
            return None
        waiter: asyncio.Future[RawResponse] = batch.loop.create_future()
        self._join(base_url, headers, batch, target, waiter)
        return waiter

    def send(
        self,
        base_url: str,
        target: str,
        headers: list[tuple[str, str]],
        timeout: float,
        sink: Sink,
    ) -> bool:
        """:meth:`submit`, the answer given to `sink` (exactly once, whatever happens);
        False, and nothing sent, while the peer takes its reads one by one."""
        batch = self._batch(base_url, headers, timeout)
        if batch is None:
            return False
        self._join(base_url, headers, batch, target, sink)
        return True

    def _batch(self, base_url: str, headers: list[tuple[str, str]], timeout: float) -> _Open | None:
        """The batch a read to `base_url` with `headers` joins (opened if none is)."""
        if self._one_by_one and self._one_by_one.get(base_url, 0.0) > _now():
            return None
        key = (base_url, tuple(headers))
        batch = self._open.get(key)
        if batch is None:
            loop = asyncio.get_running_loop()
            batch = self._open[key] = _Open(loop, timeout)
            # after the callbacks that are ready now: the reads they start join this batch
            loop.call_soon(self._ready, key, batch)
        return batch

    def _join(
        self,
        base_url: str,
        headers: list[tuple[str, str]],
        batch: _Open,
        target: str,
        sink: Sink | asyncio.Future[RawResponse],
    ) -> None:
        batch.targets.append(target)
        batch.sinks.append(sink)
        if len(batch.targets) >= MAX_READS:
            # full: the next read opens another, and a held one waits no more (it cannot grow)
            key = (base_url, tuple(headers))
            del self._open[key]
            if batch.expiry is not None:
                self._unhold(key, batch)
                self._leave(key, batch)

    def _ready(self, key: _Key, batch: _Open) -> None:
        """A batch's reads so far are in: it leaves now, or, while MAX_IN_FLIGHT of its
        peer's (with these headers) are unanswered, it stays open for more reads and leaves
        when one is answered, when it is full, or fails when its reads' time is up."""
        if len(batch.targets) >= MAX_READS or self._in_flight.get(key, 0) < MAX_IN_FLIGHT:
            self._leave(key, batch)
            return
        self._held.setdefault(key, deque()).append(batch)
        batch.expiry = batch.loop.call_at(batch.opened + batch.timeout, self._expired, key, batch)

    def _unhold(self, key: _Key, batch: _Open) -> None:
        held = self._held[key]
        held.remove(batch)
        if not held:
            del self._held[key]
        assert batch.expiry is not None
        batch.expiry.cancel()
        batch.expiry = None

    def _expired(self, key: _Key, batch: _Open) -> None:
        """A batch held for its reads' whole time (the peer's batches before it unanswered
        that long): its reads fail, as they would had it been sent and not answered."""
        self._unhold(key, batch)
        if self._open.get(key) is batch:
            del self._open[key]
        self._end(batch, PeerUnavailable(f"{key[0]}: no answer in time"))

    def _leave(self, key: _Key, batch: _Open) -> None:
        if self._open.get(key) is batch:
            del self._open[key]
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        task = batch.loop.create_task(self._send(key, batch))
        self._sending.add(task)
        task.add_done_callback(partial(self._sent, key, batch))

    def _sent(self, key: _Key, batch: _Open, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        if not batch.ended:  # cancelled before it began: its reads are told, its place freed
            self._end(batch, PeerUnavailable(f"{key[0]}: the batch was not sent"))
            self._answered(key)

    def _answered(self, key: _Key) -> None:
        """One of `key`'s batches is answered (or failed): the first held one leaves."""
        left = self._in_flight[key] - 1
        if left:
            self._in_flight[key] = left
        else:
            del self._in_flight[key]
        held = self._held.get(key)
        if held and left < MAX_IN_FLIGHT:
            batch = held[0]
            self._unhold(key, batch)
            self._leave(key, batch)

    @staticmethod
    def _end(batch: _Open, failure: PeerUnavailable, given: int = 0) -> None:
        """Give each read of `batch` from the `given`-th on `failure`: no read waits for ever."""
        batch.ended = True
        for sink in batch.sinks[given:]:
            _deliver(sink, failure)

    async def _send(self, key: _Key, batch: _Open) -> None:
        base_url, headers = key[0], list(key[1])
        # a batch held while others were in flight spent that wait of its reads' time
        timeout = batch.timeout - (batch.loop.time() - batch.opened)
        sinks = batch.sinks
        given = 0
        failure = PeerUnavailable(f"{base_url}: the batch was not answered")
        try:
            if timeout <= 0:
                raise PeerUnavailable(f"{base_url}: no answer in time")
            for answer in await self._answers(base_url, headers, batch.targets, timeout):
                given += 1
                _deliver(sinks[given - 1], answer)
        except PeerUnavailable as e:
            failure = e
        finally:
            # whatever went wrong (the peer, or a bug here), no read waits for ever
            self._end(batch, failure, given)
            self._answered(key)

    async def _answers(
        self, base_url: str, headers: list[tuple[str, str]], targets: list[str], timeout: float
    ) -> list[RawResponse | PeerUnavailable]:
        """Each read's answer: of the batch, or of each read alone."""
        if len(targets) > 1:
            status, _, body = await self.pool.request(
                base_url, "POST", ANSWERS_PATH, headers, encode_targets(targets), timeout
            )
            if status == 200:
                answers = decode_wires(body, len(targets))
                self.batches += 1
                self.batched_reads += len(targets)
                return answers  # type: ignore[return-value]
            if status == 404:  # no such route there: an earlier version
                self._one_by_one[base_url] = _now() + ONE_BY_ONE_S
        alone = (self._alone(base_url, t, headers, timeout) for t in targets)
        return list(await asyncio.gather(*alone))

    async def _alone(
        self, base_url: str, target: str, headers: list[tuple[str, str]], timeout: float
    ) -> RawResponse | PeerUnavailable:
        try:
            status, pairs, body = await self.pool.request(
                base_url, "GET", target, headers, b"", timeout
            )
        except PeerUnavailable as e:
            return e
        return status, kept_alive(status, passed(pairs), body)
