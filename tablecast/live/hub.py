"""The node's watches: who follows which partition, and how each record reaches them.

Everything here runs on the event loop except the feed and catch-up threads
(:mod:`tablecast.live.topic_feed`), which hand over whole batches.

Per table partition some watch needs, a :class:`PartitionFeed` keeps a ring of
its recent records (what the feed read, in offset order) and an index of its
watches: by key for key watches, a list for span watches. A batch from the
feed is appended to the ring and dispatched: each record goes to the watches
of its key and to the span watches it falls in, each watch renders nothing
that another watch of the same partition already rendered (see
:class:`Change`), and every sink touched is flushed once at the end.

A watch starts at a position (its snapshot's, or a resume token's). It joins a
partition's feed at once when the ring still holds that position (replaying
the ring from there first); an older one is read by a private catch-up reader
until it reaches the ring. A partition nobody watches any more stays fed for
a grace period, so clients reconnecting after a blip find their position in
the ring.

The feed's position in a partition comes from the watches only through
positions the service has judged against the partition's end; should the
feed find records below where it started all the same (its consumer went back
to the partition's start, as a consumer does when asked for an offset beyond
the end), it starts its ring over from them rather than drop them, so no
watch's position can keep records from the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from bisect import bisect_left
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tablecast.cluster.attached_records import translation
from tablecast.cluster.validate import checker
from tablecast.contract.table_info import TableInfo
from tablecast.live import tcpdiag
from tablecast.live.events import CHANGE, ERROR, READY, SNAPSHOT, Change, Encoder, Renderer
from tablecast.live.resume_token import Token
from tablecast.live.selection import Selection
from tablecast.live.sinks import SLOW, Progress, Sink, StreamSink
from tablecast.live.topic_feed import Batch, CatchUp, Feed, Source
from tablecast.metric_families import counters

log = logging.getLogger(__name__)

#: records and bytes of a partition's ring (the oldest go first)
RING_RECORDS = 10_000
RING_BYTES = 8 * 1024 * 1024
#: a partition joining the feed is read from this many records before the position asked
#: for, so the next watches, which ask a little earlier or later, join without catching up
LOOKBACK = 2_000
#: a partition no watch needs leaves the feed after this long
GRACE_S = 60.0
#: every stream gets a keep-alive at least this often (the API promises at least every 15 s)
KEEPALIVE_S = 10.0
#: private catch-up readers at once; more watches that need one wait their turn
CATCH_UPS = 4
#: how often slow consumers are looked for
WATCHDOG_S = 2.0
#: how often a private catch-up reader looks whether its watch can join the feed, between batches
SETTLE_S = 0.5
#: the periodic passes over every watch (keep-alives, the watchdog) take this many at a time
#: before letting the loop deliver events
CHUNK = 500

_offset = attrgetter("offset")
_T = TypeVar("_T")


class PartitionFeed:
    """One table partition as the feed reads it: recent records, and the watches following it."""

    __slots__ = (
        "by_key",
        "confirmed",
        "dispatched",
        "generation",
        "head",
        "idle_since",
        "info",
        "low",
        "partition",
        "ring",
        "ring_bytes",
        "spanning",
        "users",
    )

    def __init__(self, info: TableInfo, partition: int, start: int, generation: int) -> None:
        self.info = info
        self.partition = partition
        self.generation = generation
        #: records in offset order; ring[head:] are live (the rest await compaction)
        self.ring: list[Change] = []
        self.head = 0
        self.ring_bytes = 0
        #: every record with offset in [low, dispatched) is in the ring
        self.low = start
        #: every record below this has been dispatched to the watches following the partition
        self.dispatched = start
        #: how far the feed has seen the partition go (records, or its end): never beyond it
        self.confirmed = 0
        self.by_key: dict[bytes, list[Watch]] = {}
        self.spanning: list[Watch] = []
        #: watches that need this partition (following it, or on their way)
        self.users = 0
        self.idle_since: float | None = None

    def append(self, change: Change) -> None:
        self.ring.append(change)
        self.ring_bytes += len(change.data) + 120  # the object and its slots, roughly
        self.dispatched = change.offset + 1

    def trim(self) -> None:
        ring = self.ring
        head = self.head
        while len(ring) - head > RING_RECORDS or (
            self.ring_bytes > RING_BYTES and len(ring) - head > 1
        ):
            old = ring[head]
            self.ring_bytes -= len(old.data) + 120
            self.low = old.offset + 1
            head += 1
        if head > 4096 and head * 2 > len(ring):
            del ring[:head]
            head = 0
        self.head = head

    def start_over(self, offset: int) -> None:
        """The ring begins again at `offset`, empty: the feed reads on from there."""
        self.ring = []
        self.head = 0
        self.ring_bytes = 0
        self.low = self.dispatched = offset

    def since(self, offset: int) -> list[Change]:
        """The ring's records at or above `offset`."""
        ring = self.ring
        i = bisect_left(ring, offset, lo=self.head, key=_offset)
        return ring[i:]


_ids = itertools.count()


class Watch:
    """One watcher: what it selects, where it is in each partition, and where its events go."""

    def __init__(
        self,
        hub: Hub,
        info: TableInfo,
        renderer: Renderer,
        selection: Selection,
        encoder: Encoder,
        expires: float | None = None,
    ) -> None:
        self.id = next(_ids)
        self.hub = hub
        self.info = info
        self.renderer = renderer
        self.selection = selection
        self.matches = selection.matches
        self.encoder = encoder
        self.single = len(selection.partitions) == 1
        #: partition -> next offset to hand over (exact while catching up; a floor while live)
        self.pos: dict[int, int] = {}
        #: partitions it follows on the feed (with their PartitionFeed)
        self.live: dict[int, PartitionFeed] = {}
        self.needs: list[PartitionFeed] = []
        #: inside a snapshot: the last row's key (rows above it not sent yet)
        self.after: bytes | None = None
        #: past its snapshot: its position is a plain resume token
        self.ready = False
        #: the caller's token expires then (epoch seconds): the watch ends with it
        self.expires = expires
        self.sink: Sink | None = None
        self.catching_up: frozenset[int] = frozenset()
        #: the stream is over: nothing may register it again
        self.ended = False

    # -- positions -----------------------------------------------------------------
    def position(self, partition: int) -> int:
        pos = self.pos[partition]
        feed = self.live.get(partition)
        if feed is not None and feed.dispatched > pos:
            return feed.dispatched  # following it: everything dispatched was handed over
        return pos

    def token(self, partition: int | None = None, offset: int = 0) -> str:
        offsets = {p: self.position(p) for p in self.selection.partitions}
        if partition is not None:
            offsets[partition] = offset
        return Token(self.info.name, offsets, self.after).text()

    # -- events ----------------------------------------------------------------------
    def deliver(self, change: Change) -> None:
        p = change.partition
        self.pos[p] = change.offset + 1
        assert self.sink is not None
        if self.single and self.after is None:
            self.sink.add(change.shared(self.encoder))
        else:
            self.sink.add(self.encoder.encode(CHANGE, self.token(p, change.offset + 1), change))

    def take(self, changes: list[Change]) -> None:
        """Records of one partition in offset order, for a watch not following it yet."""
        pos = self.pos
        matches = self.matches
        after = self.after
        for c in changes:
            p = c.partition
            if c.offset < pos[p]:
                continue
            if matches(c.key) and (after is None or c.key <= after):
                self.deliver(c)
            else:
                pos[p] = c.offset + 1

    def close(self, reason: str | None = None, message: str | None = None) -> None:
        sink = self.sink
        if sink is None or sink.closed:
            return
        if reason is not None and reason != SLOW:
            sink.add(self.encoder.encode(ERROR, None, None, _error(reason, message)))
        # through the hub: a sink left in its list of touched sinks would outlive its stream
        # (and keep granian's response open)
        self.hub.flush()
        sink.close(reason)


async def _chunks(items: list[_T]) -> AsyncIterator[list[_T]]:
    """`items` CHUNK at a time, the loop delivering events between one and the next."""
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]
        await asyncio.sleep(0)


def _error(code: str, message: str | None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message or code}}


#: what of a catalog entry says how its table's records read and show (not its views)
_READING = ("name", "kind", "key", "value", "partitions")


def _reads_alike(a: TableInfo, b: TableInfo) -> bool:
    """Whether two catalog entries of a table read and show its records the same."""
    return all(getattr(a, f) == getattr(b, f) for f in _READING)


@dataclass
class Start:
    """Where a watch starts: rows to send first (its snapshot), and the positions after them."""

    rows: list[Change]
    positions: dict[int, int]
    #: the rows go out before `ready` (a plain resume sends neither)
    snapshot: bool = True
    #: a resume from inside a snapshot: the rows up to key `after` were sent as of `resumed_at`
    resumed_at: dict[int, int] | None = None
    after: bytes | None = None


class Hub:
    def __init__(
        self, bootstrap: str, group: str, tables: Callable[[], dict[str, TableInfo]]
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self._tables = tables
        self.loop: asyncio.AbstractEventLoop | None = None
        self.feed = Feed(bootstrap, group, self._from_feed)
        #: (topic, partition) -> its feed state
        self.parts: dict[tuple[str, int], PartitionFeed] = {}
        self.watches: dict[int, Watch] = {}
        self._renderers: dict[str, tuple[TableInfo, Renderer, Source]] = {}
        self._touched: list[Sink] = []
        self._generations = itertools.count(1)
        self._catch_up_slots = asyncio.Semaphore(CATCH_UPS)
        self._executor = ThreadPoolExecutor(CATCH_UPS + 1, thread_name_prefix="tablecast-watch")
        self._tasks: list[asyncio.Task[None]] = []
        #: snapshots being finished and catch-ups: held here, as the loop keeps only weak refs
        self._background: set[asyncio.Task[None]] = set()
        self._port: int | None = None
        self._diag_failed = False
        self._conns: dict[tuple[str, int], Progress] = {}
        self.stopping = False
        # counters for /metrics
        self.delivered = 0
        self.opened = 0
        #: streams ended, by why: client (it left), slow_consumer, shutdown, unauthorized ...
        self.closed: dict[str, int] = {}
        self.catch_ups = 0

    # -- lifecycle ----------------------------------------------------------------------
    def start(self, port: int | None = None) -> None:
        """Begin on the running loop (at the first watch): the feed thread and the timers."""
        if self.loop is not None:
            return
        self.loop = asyncio.get_running_loop()
        self._port = port
        self.feed.start()
        for job in (self._keep_alive, self._watchdog, self._release_idle):
            self._tasks.append(self.loop.create_task(job()))

    def close_all(self, reason: str = "shutdown", message: str | None = None) -> None:
        """End every stream (the node stops: clients resume elsewhere with their last id)."""
        self.stopping = True
        if self.watches:
            log.info("ending %d watch stream(s): %s", len(self.watches), reason)
        for w in list(self.watches.values()):
            w.close(reason, message)

    def stop(self) -> None:
        self.close_all()
        for task in [*self._tasks, *self._background]:
            task.cancel()
        self.feed.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def open_by_transport(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for w in self.watches.values():
            counts[w.encoder.name] = counts.get(w.encoder.name, 0) + 1
        return counts

    def source(self, info: TableInfo) -> tuple[Renderer, Source]:
        known = self._renderers.get(info.name)
        if known is None or known[0] != info:
            renderer = Renderer(info)
            known = self._renderers[info.name] = (
                info,
                renderer,
                Source(info.topic, renderer, checker(info), translation(info)),
            )
        return known[1], known[2]

    # -- the feed -------------------------------------------------------------------------
    def _from_feed(self, batch: Batch) -> None:
        """On the feed thread: hand the batch to the loop in one call."""
        loop = self.loop
        if loop is None or loop.is_closed():
            self.feed.taken()
            return
        try:
            loop.call_soon_threadsafe(self._dispatch, batch)
        except RuntimeError:  # the loop closed under us: the node is stopping
            self.feed.taken()

    def _dispatch(self, batch: Batch) -> None:
        try:
            parts = self.parts
            delivered = 0
            for slot, (generation, changes) in batch.changes.items():
                pf = parts.get(slot)
                if pf is None or pf.generation != generation:
                    continue  # released, or read again from elsewhere since
                if changes and changes[0].offset < pf.low:
                    # the consumer went back to the partition's start: the feed began beyond
                    # its end; dropping what comes now would keep it from every watch
                    log.warning(
                        "watch feed of %s/%d: its ring began at %d, beyond the partition's end; "
                        "it reads on from %d",
                        *slot,
                        pf.low,
                        changes[0].offset,
                    )
                    pf.start_over(changes[0].offset)
                by_key = pf.by_key
                spanning = pf.spanning
                p = pf.partition
                for c in changes:
                    if c.offset < pf.dispatched:
                        continue
                    pf.append(c)
                    watches = by_key.get(c.key)
                    if watches is not None:
                        for w in watches:
                            if c.offset >= w.pos[p]:
                                w.deliver(c)
                                delivered += 1
                    for w in spanning:
                        if w.matches(c.key) and c.offset >= w.pos[p]:
                            w.deliver(c)
                            delivered += 1
                if changes:
                    pf.confirmed = max(pf.confirmed, changes[-1].offset + 1)
                pf.trim()
            for slot, (generation, end) in batch.ends.items():
                pf = parts.get(slot)
                if pf is None or pf.generation != generation:
                    continue
                pf.confirmed = max(pf.confirmed, end)
                if end < pf.low:  # the partition ends below where the feed began (as above)
                    pf.start_over(end)
                elif end > pf.dispatched:
                    # nothing to deliver below `end` beyond what was: the ring still covers it
                    pf.dispatched = end
            self.delivered += delivered
            self.flush()
        finally:
            self.feed.taken()

    def touched(self, sink: Sink) -> None:
        self._touched.append(sink)

    def flush(self) -> None:
        touched, self._touched = self._touched, []
        now = time.monotonic()
        for sink in touched:
            sink.flush()
            sink.last_write = now

    def need(self, info: TableInfo, partition: int, start: int) -> PartitionFeed:
        """The partition's feed, joined now (from a little before `start`) if it was not fed."""
        slot = (info.topic, partition)
        pf = self.parts.get(slot)
        if pf is None:
            begin = max(0, start - LOOKBACK)
            pf = PartitionFeed(info, partition, begin, next(self._generations))
            self.parts[slot] = pf
            _, source = self.source(info)
            self.feed.assign(source, partition, begin, pf.generation)
        elif pf.info != info:
            self._retable(pf, info)
        pf.users += 1
        pf.idle_since = None
        return pf

    def _retable(self, pf: PartitionFeed, info: TableInfo) -> None:
        """The table's catalog entry changed (an index or history added, other serdes): the
        feed goes on for the watches that follow it, reading with the new entry."""
        if pf.info == self._tables().get(info.name):
            return  # the feed has the current entry already: this watch was prepared before
        old, pf.info = pf.info, info
        if _reads_alike(old, info):
            return  # its records read and show as they did
        # the ring was rendered with the old serdes: read on from the feed's position anew
        pf.generation = next(self._generations)
        pf.start_over(pf.dispatched)
        _, source = self.source(info)
        self.feed.assign(source, pf.partition, pf.dispatched, pf.generation)

    def known_end(self, info: TableInfo, partition: int) -> int:
        """How far the feed has seen the partition go (0: it does not read it): a lower bound
        of its end."""
        pf = self.parts.get((info.topic, partition))
        return pf.confirmed if pf is not None else 0

    def now(self, info: TableInfo, partition: int) -> int | None:
        """The feed's position in a partition it reads (None: not fed)."""
        pf = self.parts.get((info.topic, partition))
        return pf.dispatched if pf is not None and pf.info is info else None

    async def end_offset(self, info: TableInfo, partition: int) -> int:
        """The partition's end as the broker says it (the position "now" of a watch that skips
        its snapshot, on a partition not fed yet)."""
        assert self.loop is not None
        return await self.loop.run_in_executor(
            self._executor, self.feed.end_offset, info.topic, partition
        )

    # -- watches -----------------------------------------------------------------------------
    def begin(self, watch: Watch, sink: Sink, start: Start) -> None:
        """Send the watch's snapshot (if any) and `ready`, then follow the feed from there."""
        self.watches[watch.id] = watch
        self.opened += 1
        watch.sink = sink
        info = watch.info
        for p in watch.selection.partitions:
            watch.pos[p] = (start.resumed_at or start.positions)[p]
            watch.needs.append(self.need(info, p, watch.pos[p]))
        if start.resumed_at is not None:
            # a resume from inside a snapshot: the rows already sent are at `resumed_at`; bring
            # them to the new snapshot's positions first, then send the rest of the snapshot
            self._spawn(self._finish_snapshot(watch, start))
            return
        self._send_snapshot(watch, start)

    def _send_snapshot(self, watch: Watch, start: Start) -> None:
        sink = watch.sink
        assert sink is not None
        if start.snapshot:
            encode = watch.encoder.encode
            for row in start.rows:
                watch.after = row.key
                sink.add(
                    encode(SNAPSHOT, Token(watch.info.name, start.positions, row.key).text(), row)
                )
            watch.after = None
            for p, position in start.positions.items():
                watch.pos[p] = max(watch.pos[p], position)
            sink.add(encode(READY, watch.token(), None, {"rows": len(start.rows)}))
        watch.ready = True
        self.flush()
        self._follow(watch)

    async def _finish_snapshot(self, watch: Watch, start: Start) -> None:
        try:
            assert start.resumed_at is not None
            watch.after = start.after
            behind = {
                p: start.resumed_at[p]
                for p in watch.selection.partitions
                if start.resumed_at[p] < start.positions[p]
            }
            if behind:
                await self._read(watch, behind, until=start.positions)
            if watch.ended or watch.sink is None or watch.sink.closed:
                return
            self._send_snapshot(watch, start)
        except Exception as e:  # one watch's failure must not reach the loop
            log.exception("watch %d: could not finish its snapshot", watch.id)
            watch.close("partition_unavailable", f"could not resume the snapshot: {e}")

    def _follow(self, watch: Watch) -> None:
        """Join each partition's feed now if its ring reaches back to the watch's position, and
        catch the others up with a private reader first."""
        behind: dict[int, int] = {}
        for pf in watch.needs:
            p = pf.partition
            if watch.pos[p] >= pf.low:
                self._join(watch, pf)
            else:
                behind[p] = watch.pos[p]
        self.flush()
        if behind:
            self._spawn(self._catch_up(watch, behind))

    def _spawn(self, job: Any) -> None:
        assert self.loop is not None
        task = self.loop.create_task(job)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _join(self, watch: Watch, pf: PartitionFeed) -> None:
        """Replay the ring from the watch's position, then follow the feed (no await between:
        nothing can be dispatched in between)."""
        if watch.ended:
            return
        p = pf.partition
        watch.take(pf.since(watch.pos[p]))
        if watch.selection.keys is not None:
            for key in watch.selection.keys:
                if p in pf.info.partitions_for(key):
                    pf.by_key.setdefault(key, []).append(watch)
        else:
            pf.spanning.append(watch)
        watch.live[p] = pf

    async def _catch_up(self, watch: Watch, behind: dict[int, int]) -> None:
        try:
            await self._read(watch, behind, until=None)
        except Exception as e:
            log.exception("watch %d: catch-up failed", watch.id)
            watch.close("partition_unavailable", f"could not catch up: {e}")

    async def _read(
        self, watch: Watch, starts: dict[int, int], until: dict[int, int] | None
    ) -> None:
        """Read `starts`' partitions with a private consumer: up to `until` (then stop), or
        until each can join the feed (until None)."""
        assert self.loop is not None
        loop = self.loop
        info = watch.info
        _, source = self.source(info)
        wanted = set(starts)
        watch.catching_up = frozenset(wanted)
        room = threading.Semaphore(2)
        finished = loop.create_future()

        def apply(batch: Batch) -> None:
            try:
                if watch.ended:
                    wanted.clear()
                for (_, p), (_, changes) in batch.changes.items():
                    if p not in wanted:
                        continue
                    if until is not None:
                        changes = [c for c in changes if c.offset < until[p]]
                    watch.take(changes)
                for (_, p), (_, end) in batch.ends.items():
                    if p in wanted:
                        cap = end if until is None else min(end, until[p])
                        watch.pos[p] = max(watch.pos[p], cap)
                settle()
            finally:
                room.release()

        def settle() -> None:
            """Let go of the partitions read far enough: up to `until`, or into the ring."""
            if watch.ended:
                wanted.clear()
            for p in list(wanted):
                if until is not None:
                    if watch.pos[p] >= until[p]:
                        watch.pos[p] = until[p]
                        wanted.discard(p)
                else:
                    pf = self.parts.get((info.topic, p))
                    if pf is not None and watch.pos[p] >= pf.low:
                        self._join(watch, pf)
                        wanted.discard(p)
            if watch.sink is None or watch.sink.closed:
                wanted.clear()
            watch.catching_up = frozenset(wanted)
            self.flush()
            if not wanted and not finished.done():
                finished.set_result(None)

        def on_batch(batch: Batch) -> None:  # on the reader's thread
            while not room.acquire(timeout=0.5):
                if reader.cancelled.is_set():
                    return
            try:
                loop.call_soon_threadsafe(apply, batch)
            except RuntimeError:
                reader.cancelled.set()

        reader = CatchUp(
            self.bootstrap, self.group, source, starts, on_batch, lambda: set(watch.catching_up)
        )
        async with self._catch_up_slots:
            if watch.sink is None or watch.sink.closed:
                return
            self.catch_ups += 1
            job = loop.run_in_executor(self._executor, reader.run)
            try:
                while not (finished.done() or job.done()):
                    await asyncio.wait(
                        [finished, job], timeout=SETTLE_S, return_when=asyncio.FIRST_COMPLETED
                    )
                    # a reader at the partition's end gets no more batches: the ring may have
                    # come to it all the same (the feed went back to records below where it
                    # began), and the slot must not wait for the next record to be let go
                    if not finished.done():
                        settle()
            finally:
                reader.cancelled.set()
                with contextlib.suppress(Exception):
                    await job
        if wanted and not (watch.sink is None or watch.sink.closed):
            raise RuntimeError(f"the reader stopped before partitions {sorted(wanted)} were read")

    def end(self, watch: Watch) -> None:
        """The stream ended: stop following, and let idle partitions go after the grace."""
        if self.watches.pop(watch.id, None) is None:
            return
        watch.ended = True
        watch.catching_up = frozenset()
        reason = (watch.sink.reason if watch.sink is not None else None) or "client"
        self.closed[reason] = self.closed.get(reason, 0) + 1
        now = time.monotonic()
        for pf in watch.live.values():
            if watch.selection.keys is not None:
                for key in watch.selection.keys:
                    listed = pf.by_key.get(key)
                    if listed is not None and watch in listed:
                        listed.remove(watch)
                        if not listed:
                            del pf.by_key[key]
            elif watch in pf.spanning:
                pf.spanning.remove(watch)
        watch.live = {}
        for pf in watch.needs:
            pf.users -= 1
            if pf.users <= 0:
                pf.users = 0
                pf.idle_since = now
        watch.needs = []

    # -- timers ------------------------------------------------------------------------------
    async def _keep_alive(self) -> None:
        """A keep-alive on every stream silent for half of KEEPALIVE_S, looked for each half
        (so none is silent for KEEPALIVE_S); it carries the watch's position, so a quiet
        watch's resume token stays recent. Streams that had events need none. The watches
        are visited CHUNK at a time, the loop delivering events in between: a pass over
        20,000 watches in one go held it for tens of milliseconds."""
        half = KEEPALIVE_S / 2
        while True:
            await asyncio.sleep(half)
            # the list lives in the generator, not in this long-lived frame, where it would
            # keep ended watches (and their open responses) alive until the next pass
            async for chunk in _chunks(list(self.watches.values())):
                self._keep_alive_chunk(chunk, half)

    def _keep_alive_chunk(self, watches: list[Watch], silent_s: float) -> None:
        now, since = time.time(), time.monotonic() - silent_s
        for w in watches:
            sink = w.sink
            if sink is None or sink.closed:
                continue
            if w.expires is not None and now >= w.expires:
                w.close("unauthorized", "the token expired: reconnect with a fresh one")
                continue
            if sink.last_write <= since:
                sink.add(w.encoder.keep_alive(w.token() if w.pos else None))
        self.flush()

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(WATCHDOG_S)
            try:
                streamed = await self._cut_slow_queues()
                if streamed and self._port is not None and not self._diag_failed:
                    await self._check_streams(streamed, time.monotonic())
                del streamed
            except Exception:
                log.exception("watch watchdog failed")

    async def _cut_slow_queues(self) -> list[StreamSink]:
        """Close sinks that are too far behind (queued ones, and SSE ones whose connection
        says what it holds); the other SSE sinks, judged by TCP next. CHUNK watches at a
        time, events delivered in between."""
        now = time.monotonic()
        streamed: list[StreamSink] = []
        async for chunk in _chunks(list(self.watches.values())):
            for w in chunk:
                sink = w.sink
                if sink is None:
                    continue
                if sink.behind(now):
                    w.close(SLOW)
                elif isinstance(sink, StreamSink) and not sink.measured:
                    streamed.append(sink)
        return streamed

    async def _check_streams(self, sinks: list[StreamSink], now: float) -> None:
        """SSE clients too far behind: compare what each connection was handed with what its
        client's TCP acknowledged (granian buffers whatever a slow client does not read)."""
        assert self.loop is not None and self._port is not None
        try:
            acked = await self.loop.run_in_executor(self._executor, tcpdiag.acked, self._port)
        except OSError as e:
            self._diag_failed = True
            log.warning("cannot see TCP progress of SSE clients (%s): slow ones are not cut off", e)
            return
        by_peer: dict[tuple[str, int], list[StreamSink]] = {}
        for sink in sinks:
            if sink.peer is not None and not sink.closed:
                by_peer.setdefault(sink.peer, []).append(sink)
        conns = self._conns
        for peer in conns.keys() - by_peer.keys():
            del conns[peer]
        async for chunk in _chunks(list(by_peer.items())):
            for peer, group in chunk:
                got = acked.get(peer)
                if got is None or any(s.closed for s in group):
                    continue
                # an HTTP/2 connection carries several streams: they are judged together
                handed = sum(s.handed for s in group)
                conn = conns.get(peer)
                if conn is None:
                    conns[peer] = Progress(handed, got)
                    continue
                if conn.judge(handed, got, now):
                    for sink in group:
                        sink.close(SLOW)
                    conns.pop(peer, None)

    async def _release_idle(self) -> None:
        while True:
            await asyncio.sleep(GRACE_S / 4)
            now = time.monotonic()
            for slot, pf in list(self.parts.items()):
                if pf.users == 0 and pf.idle_since is not None and now - pf.idle_since > GRACE_S:
                    del self.parts[slot]
                    self.feed.unassign(*slot)

    def collect(self) -> Iterator[Metric]:
        """Watches and the feed, for ``/metrics`` (a prometheus-client collector)."""
        open_ = GaugeMetricFamily(
            "tablecast_watches", "open watches, by transport", labels=["transport"]
        )
        counts = self.open_by_transport()
        for transport in ("sse", "websocket", "grpc"):
            open_.add_metric([transport], counts.get(transport, 0))
        yield open_
        closed = CounterMetricFamily(
            "tablecast_watch_closed",
            "watches ended, by why (client: the client left; slow_consumer: cut off for being "
            "too far behind; shutdown; unauthorized: the token expired)",
            labels=["reason"],
        )
        for reason, n in sorted(self.closed.items()):
            closed.add_metric([reason], n)
        yield closed
        yield from counters(
            ("tablecast_watch_events", "change events delivered to watches", self.delivered),
            ("tablecast_watch_opened", "watches opened", self.opened),
            (
                "tablecast_watch_catch_ups",
                "watches that read the topic privately first",
                self.catch_ups,
            ),
            ("tablecast_watch_feed_records", "records the watch feed read", self.feed.records),
        )
        fed = GaugeMetricFamily(
            "tablecast_watch_feed_partitions", "table partitions the watch feed reads"
        )
        fed.add_metric([], len(self.parts))
        yield fed
        ring = GaugeMetricFamily(
            "tablecast_watch_ring_bytes",
            "recent records the feed keeps for joining watches (estimate)",
        )
        ring.add_metric([], sum(pf.ring_bytes for pf in list(self.parts.values())))
        yield ring
