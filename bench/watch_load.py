"""One load process of ``python -m bench watch``: many SSE watchers on raw asyncio sockets.

python -m bench.watch_load URL KEYS FIRST COUNT --seconds S [--slow N] [--slow-span K]

Opens COUNT watches ``/v1/tables/quotes/watch?key=k…`` (watcher i follows key
(FIRST + i) mod KEYS), waits for every ``ready``, then, on a line on stdin,
measures for S seconds: each change's value carries the producer's send time
``t``, so ``now - t`` is the delivery latency produce → client. Prints one JSON
line: latencies as a histogram (see :func:`bucket`), events, how many streams
the node ended. The last N watchers (``--slow``) are slow consumers instead: a
receive buffer of 1 KiB, a watch of K keys (a range), and nothing read after
the headers.

Written on sockets and bytes searches, not an HTTP client: one process must
hold thousands of streams and parse tens of thousands of events a second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
import time
from collections import Counter
from urllib.parse import urlsplit

import orjson

#: latencies are counted in 0.1 ms buckets up to 100 ms, then 1 ms ones: a few thousand
#: buckets per process at most, however late some events are
FINE_MS = 100.0


def bucket(seconds: float) -> int:
    ms = seconds * 1000
    if ms < FINE_MS:
        return max(0, int(ms * 10))
    return int(FINE_MS * 10) + int(ms - FINE_MS)


def upper_ms(index: int) -> float:
    """The upper bound (ms) of a bucket."""
    fine = int(FINE_MS * 10)
    return (index + 1) / 10 if index < fine else FINE_MS + (index - fine) + 1


class Watcher(asyncio.Protocol):
    def __init__(self, load: Load, path: bytes, slow: bool) -> None:
        self.load = load
        self.request = (
            b"GET " + path + b" HTTP/1.1\r\nhost: bench\r\naccept: text/event-stream\r\n\r\n"
        )
        self.slow = slow
        self.ready = asyncio.get_running_loop().create_future()
        self.head = b""
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if not self.ready.done():
            head = self.head = (self.head + data)[-4096:]
            if (
                not head.startswith(b"HTTP/1.1 200")
                and len(head) >= 12
                and b"HTTP/1.1" in head[:12]
            ):
                self.ready.set_exception(RuntimeError(head[:200].decode(errors="replace")))
                return
            if b"event: ready" in head or (self.slow and b"\r\n\r\n" in head):
                self.ready.set_result(None)
                self.head = b""
                if self.slow and self.transport is not None:
                    self.transport.pause_reading()  # a consumer that stops reading
        if not self.load.measuring:
            return
        now = time.time()
        buf = self.tail + data
        at = 0
        hist = self.load.hist
        tail = buf[-3:]  # a '"t":' split over two reads
        while True:
            i = buf.find(b'"t":', at)
            if i < 0:
                break
            j = buf.find(b",", i)
            if j < 0:
                tail = buf[i:]  # its number comes with the next read
                break
            with contextlib.suppress(ValueError):
                hist[bucket(now - float(buf[i + 4 : j]))] += 1
            at = j
        self.tail = tail

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.ended += 1
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("closed before ready"))


class Load:
    def __init__(self) -> None:
        self.hist: Counter[int] = Counter()
        self.measuring = False
        self.ended = 0


async def run(args: argparse.Namespace) -> dict[str, object]:
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    load = Load()
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(64)
    watchers: list[Watcher] = []

    async def open_one(i: int) -> None:
        slow = i >= args.count - args.slow
        if slow:
            start = (args.first + i) % max(1, args.keys - args.slow_span)
            path = f"/v1/tables/quotes/watch?from=k{start:07d}&to=k{start + args.slow_span:07d}"
        else:
            path = f"/v1/tables/quotes/watch?key=k{(args.first + i) % args.keys:07d}"
        async with slots:
            sock = socket.socket()
            sock.setblocking(False)
            if slow:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
            await loop.sock_connect(sock, (host, port))
            _, w = await loop.create_connection(
                lambda: Watcher(load, path.encode(), slow), sock=sock
            )
            watchers.append(w)
            await asyncio.wait_for(w.ready, 120)

    started = time.monotonic()
    await asyncio.gather(*(open_one(i) for i in range(args.count)))
    print(
        orjson.dumps({"ready": len(watchers), "seconds": time.monotonic() - started}).decode(),
        flush=True,
    )
    await loop.run_in_executor(None, sys.stdin.readline)  # the driver says when
    ended_before = load.ended
    load.measuring = True
    await asyncio.sleep(args.seconds)
    load.measuring = False
    events = sum(load.hist.values())
    return {
        "hist": {str(k): v for k, v in load.hist.items()},
        "events": events,
        "ended": load.ended - ended_before,
        "open": len(watchers),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("keys", type=int)
    p.add_argument("first", type=int)
    p.add_argument("count", type=int)
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--slow", type=int, default=0)
    p.add_argument("--slow-span", type=int, default=50)
    args = p.parse_args()
    import uvloop

    print(orjson.dumps(uvloop.run(run(args))).decode(), flush=True)


if __name__ == "__main__":
    main()
