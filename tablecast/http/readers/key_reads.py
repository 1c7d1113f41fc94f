"""A read process's own answers: plain key GETs of the partitions in the node's feed, read
from its secondary instances of the node's stores.

:meth:`Answerer.answer` takes a request's head (request line and headers, as
received) and returns the whole HTTP answer, or None when the request is not
one it answers the way the node would: a method other than GET, a query
string, a body, an upgrade, a forwarded hop, a key it cannot parse, a key outside
the caller's grant, a table or partition not in the feed (or whose store has not
seen all the node applied), an ``X-Tablecast-After``
its store has not reached yet (the node waits for it), a caller over its rate limit
(the node refuses it: the node and its read processes spend tokens from one table,
:class:`~tablecast.query.ratelimit.SharedTokenBuckets`).
Those the connection hands to the node (:mod:`tablecast.http.readers.relay`),
which answers them itself, errors included. So every answer a read process
gives is one the node gives: the same body and headers, exact at the position
it reports (that of the secondary store it was read from).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from tablecast.contract import positions
from tablecast.contract.table_info import TableInfo
from tablecast.http.readers.heads import AFTER, plain_get
from tablecast.query.answer_bytes import kept_alive
from tablecast.query.auth import Auth, Caller
from tablecast.query.errors import ApiError
from tablecast.query.kept_answers import JSON
from tablecast.query.local import key_answer, key_bytes, position_header
from tablecast.query.ratelimit import SharedTokenBuckets
from tablecast.query.request import caller_key
from tablecast.query.stats import HttpStats
from tablecast.store.cache import drop_oldest
from tablecast.store.rocksdb_secondary import SecondaryStore

log = logging.getLogger(__name__)

#: per kept answer beyond its head's and answer's bytes: the dict slot, the entry, the objects
KEPT_OVERHEAD = 250
#: a feed line older than this (the node stuck, or gone): answer nothing, the node decides;
#: what the last one said about the topic's end and staleness no longer holds
FEED_TIMEOUT_S = 0.5
#: a secondary instance that has not seen what the node applied for this long after its
#: catch-ups is opened afresh (meanwhile the node answers its partition's reads)
REOPEN_BEHIND_S = 1.0


@dataclass
class Slot:
    """A partition in the feed, with this process's secondary instance of its store."""

    table: str
    partition: int
    generation: str
    store: SecondaryStore
    #: the node's position when its store had applied `node_applied`
    node_position: int = 0
    node_applied: int = -1
    end_offset: int = 0
    staleness_ms: int | None = None
    #: the position this process's store is exact at, and its header
    position: int = -1
    token: tuple[str, str] = ("", "")
    #: False once closed: answers kept from it are gone
    open: bool = True
    #: since when (perf_counter) a catch-up left the store short of what the node applied;
    #: while it is, the node answers (its own replica has those records)
    behind_since: float | None = None

    def caught_up_to(self) -> None:
        """Note where the store stands after a catch-up."""
        applied = self.store.applied_offset
        # the node's position may be past the last record applied (a compacted gap)
        position = self.node_position if applied == self.node_applied else applied + 1
        if position != self.position:
            self.position = position
            self.token = position_header(self.table, self.partition, position)

    def headers(self, node_header: tuple[str, str]) -> list[tuple[str, str]]:
        return [
            node_header,
            ("x-tablecast-lag", str(max(0, self.end_offset - self.position))),
            ("x-tablecast-staleness-ms", str(self.staleness_ms or 0)),
            self.token,
        ]


class Kept:
    """A whole answer, given again to the same request head while its slot stands where it
    stood (as the node's kept answers, :mod:`tablecast.query.kept_answers`)."""

    __slots__ = ("end", "position", "slot", "staleness", "status", "wire")

    def __init__(self, slot: Slot, status: int, wire: bytes) -> None:
        self.slot, self.status, self.wire = slot, status, wire
        self.position, self.end, self.staleness = slot.position, slot.end_offset, slot.staleness_ms

    def valid(self) -> bool:
        slot = self.slot
        return (
            slot.open
            and slot.behind_since is None
            and slot.position == self.position
            and slot.end_offset == self.end
            and slot.staleness_ms == self.staleness
        )


class Answerer:
    def __init__(
        self,
        node_id: str,
        max_key_bytes: int,
        own_dir: Path,
        auth: Auth,
        kept_bytes: int = 0,
        rate: SharedTokenBuckets | None = None,
    ) -> None:
        """`kept_bytes`: whole answers kept by request head, about this many bytes (0: none;
        none with auth either, as on the node: a token's grants make answers differ).
        `rate`: the node's table of callers' token buckets (``serve --rate-limit``)."""
        self.rate = rate
        self.node_header = ("x-tablecast-node", node_id)
        self.max_key_bytes = max_key_bytes
        self.own_dir = own_dir
        self.auth = auth
        self.tables: dict[str, TableInfo] = {}
        self.slots: dict[tuple[str, int], Slot] = {}
        self.stats = HttpStats()
        self._opened = 0
        self.kept_bytes = 0 if auth.enabled else kept_bytes
        self._kept: dict[bytes, Kept] = {}
        self._kept_size = 0
        #: when (perf_counter) the last feed line came
        self.fed_at = float("-inf")

    # -- the feed -----------------------------------------------------------------
    def update(self, msg: dict[str, Any]) -> None:
        """Take the node's latest feed line: open, catch up and close stores to match it.
        Answers go on only once a line is taken whole: a line that fails part-way leaves
        the feed as quiet, and the node answers."""
        now = perf_counter()
        if "tables" in msg:
            self.tables = {t["name"]: TableInfo(**t) for t in msg["tables"]}
            self._forget_kept()  # a table's formats may have changed
        fed: set[tuple[str, int]] = set()
        for table, partition, path, generation, position, applied, end, staleness in msg["slots"]:
            slot_id = (table, partition)
            fed.add(slot_id)
            slot = self.slots.get(slot_id)
            if slot is not None and slot.generation != generation:
                self._close(slot_id)
                slot = None
            if slot is None:
                slot = self._open(slot_id, Path(path), generation)
                if slot is None:
                    continue
            slot.node_position, slot.node_applied = position, applied
            slot.end_offset, slot.staleness_ms = end, staleness
            if applied > slot.store.applied_offset:
                try:
                    slot.store.catch_up()
                except Exception as e:  # its files went away (a restore from scratch)
                    log.warning("catching up with %s/%d failed: %s", table, partition, e)
                    self._close(slot_id)
                    continue
            if applied <= slot.store.applied_offset:
                slot.behind_since = None
            elif slot.behind_since is None:
                slot.behind_since = now
            elif now - slot.behind_since > REOPEN_BEHIND_S:
                # the primary's writes do not reach this instance: a fresh one reads them
                log.warning(
                    "the store of %s/%d stays at offset %d, the node's at %d: opening it again",
                    table,
                    partition,
                    slot.store.applied_offset,
                    applied,
                )
                self._close(slot_id)
                continue
            slot.caught_up_to()
        for gone in [s for s in self.slots if s not in fed]:
            self._close(gone)
        self.fed_at = now

    def _table(self, name: str) -> TableInfo:
        info = self.tables.get(name)
        if info is None:
            raise ApiError("table_not_found", name)
        return info

    def _open(self, slot_id: tuple[str, int], path: Path, generation: str) -> Slot | None:
        self._opened += 1
        try:
            store = SecondaryStore(path, self.own_dir / str(self._opened))
        except Exception as e:  # not there yet, or being replaced: the node answers meanwhile
            log.info("cannot read the store of %s/%d yet: %s", *slot_id, e)
            return None
        slot = self.slots[slot_id] = Slot(*slot_id, generation, store)
        return slot

    def _close(self, slot_id: tuple[str, int]) -> None:
        slot = self.slots.pop(slot_id, None)
        if slot is not None:
            slot.open = False
            slot.store.close()

    def _forget_kept(self) -> None:
        self._kept.clear()
        self._kept_size = 0

    def _keep(self, head: bytes, slot: Slot, status: int, wire: bytes) -> None:
        size = len(head) + len(wire) + KEPT_OVERHEAD
        if self._kept_size + size > self.kept_bytes:
            for old_head, old in drop_oldest(self._kept):
                self._kept_size -= len(old_head) + len(old.wire) + KEPT_OVERHEAD
            if self._kept_size + size > self.kept_bytes:
                return
        self._kept[head] = Kept(slot, status, wire)
        self._kept_size += size

    def close(self) -> None:
        for slot_id in list(self.slots):
            self._close(slot_id)

    # -- answering ------------------------------------------------------------------
    def answer(self, head: bytes, client: str = "") -> bytes | None:
        """The whole answer to the request with this head from `client` ("host:port"), or
        None: the node's to answer."""
        started = perf_counter()
        if started - self.fed_at > FEED_TIMEOUT_S:
            return None
        kept = self._kept.get(head)
        if kept is not None and kept.valid():  # the hot path: this head answered before
            if self.rate is not None and not self._admitted(None, client):
                return None
            if kept.status == 200:
                self.stats.kept += 1
            else:
                self.stats.record("key", kept.status, perf_counter() - started)
            return kept.wire
        target = plain_get(head)
        if target is None:
            return None
        table, key_text, headers = target
        scope = caller = None
        try:
            if self.auth.enabled:
                authorization = headers.get(b"authorization")
                text = None if authorization is None else authorization.decode("latin-1")
                caller = self.auth.remembered(text)
                if caller is None:
                    # a token not seen before costs a signature check: as on the node, the
                    # client's address pays for it first
                    if self.rate is not None and not self._admitted(None, client):
                        return None
                    # never blocks: a token whose signing key is not fetched yet (KeysNeeded,
                    # an ApiError) goes to the node, while this process's own fetch, started
                    # here in a worker thread, serves the tokens after it
                    caller = self.auth.caller(text)
                if caller.grants is not None:
                    info, scope = caller.grants.table_scope(table, self._table)
            info = self._table(table)
        except ApiError:
            return None  # the node says why (and counts it)
        if info.kind != "kv" or not info.placed:
            return None  # a key the node looks for (an unknown partitioner) is the node's
        try:
            raw = key_bytes(info, key_text, self.max_key_bytes)
        except ApiError:
            return None
        if scope is not None and not scope.allows(raw):
            return None
        partition = info.partition_of(raw)
        slot = self.slots.get((table, partition))
        if slot is None or slot.behind_since is not None:
            return None
        after = headers.get(AFTER)
        if after is not None and not _reached(after, table, info.partitions, partition, slot):
            return None
        # spent last, once the answer is this process's to give: a request handed to the
        # node is counted there (a new token's address, above, may be counted twice)
        if self.rate is not None and not self._admitted(caller, client):
            return None
        try:
            record = slot.store.get(raw)
        except Exception as e:  # a store that failed under the read: the node answers
            log.warning("reading %s/%d failed: %s", table, partition, e)
            return None
        headers = [JSON, *slot.headers(self.node_header)]
        try:
            status, body, _ = key_answer(info, raw, partition, record, key_text, headers)
        except ApiError as e:  # not there: the node's 404, with this store's position
            status, body = e.status, e.body()
        wire = kept_alive(status, headers, body)
        if self.kept_bytes and after is None:  # a token's heads would crowd out the rest
            self._keep(head, slot, status, wire)
        self.stats.record("key", status, perf_counter() - started)
        return wire

    def _admitted(self, caller: Caller | None, client: str) -> bool:
        """Whether the caller had a token to spend; if not, the node refuses the request
        (with its own error, counted in its metrics)."""
        try:
            self.rate.take(caller_key(caller, client))  # type: ignore[union-attr]
        except ApiError:
            return False
        return True


def _reached(after: bytes, table: str, partitions: int, partition: int, slot: Slot) -> bool:
    """Whether `slot` is as far as the ``X-Tablecast-After`` token asks for the key's
    partition, so the answer is the node's without a wait. A token the node would refuse
    (another table's, a partition out of range, not a token) is the node's to refuse."""
    try:
        token = positions.parse(after.decode("latin-1"))
    except positions.BadToken:
        return False
    if token.table != table or any(not 0 <= p < partitions for p in token.offsets):
        return False
    return slot.position >= token.offsets.get(partition, 0)
