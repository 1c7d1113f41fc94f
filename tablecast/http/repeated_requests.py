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
requests, is remembered: its parse then depends on its bytes alone. Remembered
requests share one headers dict per distinct header block, which nobody
changes. The memory is bounded like the node's other caches: past
:data:`MAX_BYTES` (estimated) the oldest eighth goes
(:func:`tablecast.store.cache.drop_oldest`).
"""

from __future__ import annotations

from typing import NamedTuple

from tablecast.store.cache import drop_oldest

#: the estimated bytes remembered requests may take
MAX_BYTES = 64 << 20
#: a chunk longer than this is not remembered (requests are a few hundred bytes)
MAX_CHUNK = 4096
#: per request beyond its chunk's and path's bytes: the bytes, str and tuple objects' own
#: and a dict slot (about 230 measured with tracemalloc; the rest margin)
OVERHEAD = 260
#: distinct header blocks whose headers dict is shared
MAX_BLOCKS = 4096


class Parsed(NamedTuple):
    """What the loop engine takes from a request's head."""

    method: str
    path: str
    query: bytes
    #: by lower-case name, the first of repeated ones: shared, never to be changed
    headers: dict[str, str]


class RepeatedRequests:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._parsed: dict[bytes, Parsed] = {}
        self._blocks: dict[bytes, dict[str, str]] = {}
        self._bytes = 0
        #: the parse of a chunk remembered, or None (bound here: called for every chunk read)
        self.get = self._parsed.get

    def remember(self, chunk: bytes, parsed: Parsed) -> None:
        """Remember that `chunk`, one whole request, parses as `parsed`."""
        if len(chunk) > MAX_CHUNK or chunk in self._parsed:
            return
        block = chunk[chunk.find(b"\r\n") :]  # the headers, as sent
        headers = self._blocks.get(block)
        if headers is None:
            if len(self._blocks) >= MAX_BLOCKS:
                self._blocks.clear()  # requests remembered keep theirs
            headers = self._blocks[block] = parsed.headers
        size = _size(chunk, parsed)
        while self._bytes + size > self.max_bytes and self._parsed:
            for old, gone in drop_oldest(self._parsed):
                self._bytes -= _size(old, gone)
        self._parsed[chunk] = parsed._replace(headers=headers)
        self._bytes += size

    def __len__(self) -> int:
        return len(self._parsed)


def _size(chunk: bytes, parsed: Parsed) -> int:
    return len(chunk) + len(parsed.path) + len(parsed.query) + OVERHEAD
