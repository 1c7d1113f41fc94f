"""Whole answers of plain point reads, kept by URL path and answered before anything else.

A ``GET /v1/tables/{t}/keys/{k}`` with no query string, no token, no rate
limit and no consistency header gets the same answer for as long as the
partition's replica does not move: same body, same headers (the position it
is exact at, the lag, which node answered). Parsing the path, serializing the
key, hashing it to a partition, routing, reading the store and formatting the
body cost a GET about 8 µs of the serving thread's Python; a hit here costs a
dict lookup and a few attribute checks.

An entry is valid while its replica is at the position and topic end it was
read at, caught up, not stale, not released, and this node still answers for
the partition as its first owner (or the table is global): any apply, any
catalog change and any reassignment moves one of those, so a hit never shows
an answer the normal path would not give. Like the store's read cache it is
bounded by an estimate of its bytes and drops its oldest eighth when full
(:func:`tablecast.store.cache.drop_oldest`), which keeps a hit to one dict lookup.

A front end may also keep an entry under the bytes of a request that was
answered with it (:meth:`Answers.keep_request`): the loop engine does, for a
request a client sends again byte for byte, and so answers it without parsing
it. Such a name lives as long as its entry (a newer answer or a drop takes it)
and counts towards the same bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from tablecast.cluster.node import Node
from tablecast.cluster.replica import Replica
from tablecast.contract.table_info import TableInfo
from tablecast.query.answer_bytes import kept_alive
from tablecast.query.local import Headers
from tablecast.store.cache import drop_oldest

#: per entry beyond the path's and body's bytes: the dict slot, the entry, its header list,
#: and the str and bytes objects' own (377 bytes measured with tracemalloc; the rest margin)
ENTRY_OVERHEAD = 400
#: the whole response kept beside it once written or sent to a forwarder (Entry.wire): the
#: body again after the head (175 bytes measured, longer with a long node id) in a bytes object
WIRE_OVERHEAD = 300
#: per request an entry is also kept under, beyond the request's bytes: the bytes object's
#: own, a dict slot and the entry's tuple of them
REQUEST_OVERHEAD = 160
#: requests' bytes one answer is kept under at most: a client that sends each request
#: different (a trace id header) would otherwise pile names on a hot answer
MAX_REQUESTS_PER_ANSWER = 4
JSON = ("content-type", "application/json")


class ReadMark(NamedTuple):
    """Where a replica stood as a read of it began (:func:`mark`): an answer is kept only if
    the replica stands there still once it is made, so its headers are those of the
    position it is kept at."""

    version: int
    end: int
    position: int
    #: not stale: the answer's headers say staleness 0, as every kept answer's do
    fresh: bool


def mark(replica: Replica) -> ReadMark:
    return ReadMark(
        replica.version, replica.end_offset, replica.position, replica.stale_since is None
    )


class Entry:
    __slots__ = (
        "body",
        "end",
        "headers",
        "info",
        "name",
        "position",
        "replica",
        "requests",
        "slot",
        "wire",
    )

    def __init__(
        self,
        name: str,
        info: TableInfo,
        replica: Replica,
        position: int,
        end: int,
        headers: Headers,
        body: bytes,
    ) -> None:
        self.name = name
        self.info = info
        self.replica = replica
        self.slot = replica.slot
        self.position = position
        self.end = end
        self.headers = headers
        self.body = body
        #: the whole HTTP/1.1 response, once the loop engine has written it (http/http1.py)
        #: or a forwarder has been sent it (query/coalesce.py)
        self.wire: bytes | None = None
        #: the requests' bytes it is also kept under (Answers.keep_request)
        self.requests: tuple[bytes, ...] = ()

    def whole(self) -> bytes:
        """The whole HTTP/1.1 response (made once)."""
        wire = self.wire
        if wire is None:
            wire = self.wire = kept_alive(200, self.headers, self.body)
        return wire


class Answers:
    def __init__(self, node: Node, max_bytes: int) -> None:
        # read on every hit: the objects, not the node's property chains
        self._ingestor = node.ingestor
        self._coordinator = node.coordinator
        self.me = node.id
        self.max_bytes = max_bytes
        self._entries: dict[str, Entry] = {}
        self._requests: dict[bytes, Entry] = {}
        self._bytes = 0
        self.hits = 0

    def get(self, path: str) -> Entry | None:
        """The kept answer for `path` if it is still the one the read path would give."""
        entry = self._entries.get(path)
        if entry is None:
            return None
        return self._still(entry)

    def get_many(self, paths: Sequence[str]) -> list[Entry | None]:
        """:meth:`get` of each of `paths` (the reads of a forwarded batch): a replica's
        ownership and catalog checks are made once for all of its entries."""
        entries = self._entries
        answerable: dict[Replica, TableInfo] = {}  # replicas checked, by the table they hold
        found: list[Entry | None] = []
        hits = 0
        for path in paths:
            entry = entries.get(path)
            if entry is not None:
                replica = entry.replica
                if replica.position != entry.position or replica.end_offset != entry.end:
                    entry = None
                elif answerable.get(replica) is not entry.info:
                    if self._answerable(entry.info, replica, entry.slot):
                        answerable[replica] = entry.info
                    else:
                        entry = None
                if entry is not None:
                    hits += 1
            found.append(entry)
        self.hits += hits
        return found

    def get_request(self, request: bytes) -> Entry | None:
        """The kept answer a request of these very bytes was answered with
        (:meth:`keep_request`), if it is still the one the read path would give."""
        entry = self._requests.get(request)
        if entry is None:
            return None
        return self._still(entry)

    def keep_request(self, request: bytes, entry: Entry) -> None:
        """Keep `entry` under the bytes of a request that was answered with it too, for as
        long as it is kept: the caller knows every request of these bytes asks for the same
        answer (one plain GET of the entry's path, none of the headers that change it)."""
        if (
            len(entry.requests) >= MAX_REQUESTS_PER_ANSWER
            or request in self._requests
            or self._entries.get(entry.name) is not entry
        ):
            return
        size = len(request) + REQUEST_OVERHEAD
        if self._bytes + size > self.max_bytes:
            return  # answers come first: a name never pushes one out
        self._requests[request] = entry
        entry.requests += (request,)
        self._bytes += size

    def _still(self, entry: Entry) -> Entry | None:
        if not self.current(entry.info, entry.replica, entry.slot, entry.position, entry.end):
            return None
        self.hits += 1
        return entry

    def current(
        self, info: TableInfo, replica: Replica, slot: tuple[str, int], position: int, end: int
    ) -> bool:
        """Whether an answer :meth:`stamp` gave `position` and `end` is still the one the
        read path would give."""
        return (
            replica.position == position
            and replica.end_offset == end
            and self._answerable(info, replica, slot)
        )

    def stamp(self, info: TableInfo, replica: Replica, before: ReadMark) -> int | None:
        """The position a plain read of `replica` begun at `before` is exact at; None when
        its answer may not be kept.

        If the seqlock still stands at the same even version no apply started since the
        read began, so the answer is exact at the position. That position may also move
        without an apply (past a transaction's marker, or a record left out), and the
        replica may have been stale as the headers were made: the same position, end and
        freshness now say the headers are those the read path gives at that position."""
        if (
            before.version & 1
            or not before.fresh
            or replica.version != before.version
            or replica.end_offset != before.end
            or replica.position != before.position
            or not self._answerable(info, replica, replica.slot)
        ):
            return None
        return before.position

    def _answerable(self, info: TableInfo, replica: Replica, slot: tuple[str, int]) -> bool:
        """`replica` answers a plain read here, as the router would decide: caught up, not
        stale, not released or reopening, its table as in the catalog, and this node the
        partition's first owner (or the table global)."""
        if (
            replica.stale_since is not None
            or not replica.serving
            or self._ingestor.tables.get(info.name) is not info  # dropped, or changed
        ):
            return False
        if info.is_global:
            return True
        owners = self._coordinator.view.target.get(slot)
        return bool(owners) and owners[0] == self.me  # type: ignore[index]

    def keep(
        self,
        path: str,
        info: TableInfo,
        replica: Replica,
        before: ReadMark,
        headers: Any,
        body: bytes,
    ) -> None:
        """Remember a 200 answer read from `replica` that stood at `before` as the read
        began (:meth:`stamp`)."""
        position = self.stamp(info, replica, before)
        if position is None:
            return
        size = _size(path, body)
        if size > self.max_bytes:
            return
        older = self._entries.pop(path, None)  # kept before, at an older position
        if older is not None:
            self._forget(older)
        self._make_room(size)
        entry = Entry(path, info, replica, position, before.end, [JSON, *headers], body)
        self._entries[path] = entry
        self._bytes += size

    def _make_room(self, size: int) -> None:
        """Drop the oldest requests' names, then the oldest answers, until `size` more bytes
        fit: answers come first, so a name never keeps an answer out."""
        while self._bytes + size > self.max_bytes:
            if self._requests:
                for request, entry in drop_oldest(self._requests):
                    self._bytes -= len(request) + REQUEST_OVERHEAD
                    entry.requests = tuple(r for r in entry.requests if r is not request)
            elif self._entries:
                for _, gone in drop_oldest(self._entries):
                    self._forget(gone)
            else:
                self._bytes = 0
                break

    def _forget(self, entry: Entry) -> None:
        """Count out an entry taken out of the answers, and take its requests' names."""
        self._bytes -= _size(entry.name, entry.body)
        for request in entry.requests:
            del self._requests[request]
            self._bytes -= len(request) + REQUEST_OVERHEAD
        entry.requests = ()

    def __len__(self) -> int:
        return len(self._entries)


def _size(path: str, body: bytes) -> int:
    """An entry's bytes as estimated: the path, the body twice (alone and on the wire)."""
    return len(path) + 2 * len(body) + ENTRY_OVERHEAD + WIRE_OVERHEAD
