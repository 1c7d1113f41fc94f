"""Requests a client sent before, byte for byte, remembered with how they parsed.

A client that keeps its connection open sends the same bytes whenever it asks
the same thing (wrk, httpx, a browser's fetch): the request line and headers
do not change from one GET of a key to the next. Parsing a request with
httptools calls from C into Python for its URL, each header, the end of its
headers and its end, and builds a headers dict; on a node answering point
GETs from kept answers that was most of a GET's Python. The loop engine
(:mod:`tablecast.http.http1`) looks a read chunk up here first and, when it is
a request seen before, goes on from that request's parse as if the parser had
just made it.

Only a chunk that held exactly one whole request, with no body, no upgrade, no
``expect`` and a connection kept alive, read while its connection was between
requests, is remembered: its parse then depends on its bytes alone. Requests
with the same header block share one headers dict, which nobody changes. The
memory is bounded like the node's other caches: past :data:`MAX_BYTES`
(estimated: each request, and each header block once with its dict, for as
long as a request remembered shares it) the oldest eighth goes
(:func:`tablecast.store.cache.drop_oldest`).
"""

from __future__ import annotations

from typing import Any

from tablecast.store.cache import drop_oldest

#: the estimated bytes remembered requests may take
MAX_BYTES = 64 << 20
#: a chunk longer than this is not remembered (requests are a few hundred bytes)
MAX_CHUNK = 4096
#: per request beyond its chunk's and path's bytes: the parse's record and a dict slot
#: (about 150 measured with tracemalloc; the rest margin)
OVERHEAD = 260
#: per forward plan a request holds beyond twice its path's bytes (the plan's path and
#: onward target): the plan's record, which outlives the app's when that drops it
PLAN_OVERHEAD = 160
#: per header block beyond its bytes (held twice: as the key it is shared by, and as the
#: headers' names and values): the dict's own and the block's record, and per header two
#: str objects and the dict's slot (about 140 bytes a header measured for 800 short ones)
BLOCK_OVERHEAD = 320
HEADER_OVERHEAD = 160


class Parsed:
    """What the loop engine takes from a request's head."""

    __slots__ = ("block", "headers", "method", "path", "plan", "query")

    def __init__(
        self,
        method: str,
        path: str,
        query: bytes,
        headers: dict[str, str],
        block: bytes = b"",
        plan: Any = None,
    ) -> None:
        self.method, self.path, self.query = method, path, query
        #: by lower-case name, the first of repeated ones: shared, never to be changed
        self.headers = headers
        #: the head's bytes after the request line, as sent (whose requests share `headers`)
        self.block = block
        #: how the app forwarded the request the last time (its forward plan), if it did:
        #: set by :meth:`RepeatedRequests.plan` once remembered, which counts it
        self.plan = plan


class _Block:
    """A header block's headers dict, shared by the requests remembered with it."""

    __slots__ = ("block", "headers", "users")

    def __init__(self, block: bytes, headers: dict[str, str]) -> None:
        self.block, self.headers, self.users = block, headers, 0


class RepeatedRequests:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._parsed: dict[bytes, Parsed] = {}
        self._blocks: dict[bytes, _Block] = {}
        self._bytes = 0
        #: the parse of a chunk remembered, or None (bound here: called for every chunk read)
        self.get = self._parsed.get

    def remember(self, chunk: bytes, parsed: Parsed) -> None:
        """Remember that `chunk`, one whole request, parses as `parsed`."""
        line_end = chunk.find(b"\n")
        if len(chunk) > MAX_CHUNK or line_end < 1 or chunk[line_end - 1] != 13:
            return  # a request line ends in CRLF: what follows it is the header block
        if chunk in self._parsed:
            return
        block = chunk[line_end + 1 :]
        size = _size(chunk, parsed)
        new_block = 0 if block in self._blocks else _block_size(block, parsed.headers)
        self._make_room(size + new_block)
        shared = self._blocks.get(block)
        if shared is None:  # new, or its last request went to make room
            shared = self._blocks[block] = _Block(block, parsed.headers)
            new_block = _block_size(block, parsed.headers)
        shared.users += 1
        self._parsed[chunk] = Parsed(
            parsed.method, parsed.path, parsed.query, shared.headers, shared.block, parsed.plan
        )
        self._bytes += size + new_block

    def plan(self, chunk: bytes, plan: Any) -> None:
        """Remember (or with None, forget) the app's plan the request `chunk` was forwarded
        on, if the request is remembered."""
        parsed = self._parsed.get(chunk)
        if parsed is None or parsed.plan is plan:
            return
        self._bytes += _plan_size(parsed.path, plan) - _plan_size(parsed.path, parsed.plan)
        parsed.plan = plan
        self._make_room(0)

    def _make_room(self, size: int) -> None:
        while self._bytes + size > self.max_bytes and self._parsed:
            for old, gone in drop_oldest(self._parsed):
                self._bytes -= _size(old, gone)
                shared = self._blocks[gone.block]
                shared.users -= 1
                if not shared.users:
                    del self._blocks[gone.block]
                    self._bytes -= _block_size(gone.block, gone.headers)

    def __len__(self) -> int:
        return len(self._parsed)


def _size(chunk: bytes, parsed: Parsed) -> int:
    path = parsed.path
    return len(chunk) + len(path) + len(parsed.query) + OVERHEAD + _plan_size(path, parsed.plan)


def _plan_size(path: str, plan: Any) -> int:
    return 0 if plan is None else PLAN_OVERHEAD + 2 * len(path)


def _block_size(block: bytes, headers: dict[str, str]) -> int:
    return 2 * len(block) + BLOCK_OVERHEAD + HEADER_OVERHEAD * len(headers)
