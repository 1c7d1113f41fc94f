"""A read's bound: which replica may answer it and how fresh it must be, for every read.

Every read (keys, windows, batchGet, range, count, history, index, and the
shares of them a fan-out asks of peers) carries its bound as a
:class:`ReadOptions`, read from what a request spells by :func:`bound_of` and
held to its table by :meth:`ReadOptions.check`, in no other place:

- ``max_lag=N``: a replica at most N records behind its topic's end may answer
  (a standby too); ``max_staleness_ms=N``: a replica last known at its
  topic's end at most N ms ago may answer (a standby too), and none staler
  does — not even the active, so a node cut off from Kafka refuses rather
  than answering older than asked.
- ``after=TOKEN`` (or the header ``X-Tablecast-After``) and
  ``min_offset=P:O``: the answering replica of each partition read must
  have reached the token's offset (``min_offset``: applied offset O, i.e.
  position O+1) first; it waits up to ``timeout_ms`` (default 1000), woken by
  the ingest thread as it applies, then answers ``504``. An ``after`` position
  beyond the end of its partition (its high watermark, asked of the broker
  when the node cannot vouch for it) is no position any node handed out:
  ``400``, not a wait.
- ``redirect=true``: answer ``307`` to the node that owns the data instead of
  forwarding (a read of one partition, or a fan-out whose partitions one other
  node answers for all).

A request without query parameters or the header gets :data:`NO_OPTIONS`
without parsing anything (the point-GET hot path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tablecast.cluster.offsetwait import wake
from tablecast.cluster.replica import Replica
from tablecast.contract import positions
from tablecast.contract.table_info import TableInfo
from tablecast.kafka.deafness import ends_from_a_fresh_client
from tablecast.query.errors import ApiError
from tablecast.query.params import int_param

if TYPE_CHECKING:
    from tablecast.query.ratelimit import WaitSlots

AFTER_HEADER = "x-tablecast-after"
DEFAULT_TIMEOUT_MS = 1000
MAX_WAIT_MS = 30_000


@dataclass(frozen=True, slots=True)
class ReadOptions:
    max_lag: int | None = None
    max_staleness_ms: int | None = None
    #: partition -> the position its answering replica must have reached (after, min_offset)
    at_least: Mapping[int, int] | None = None
    #: the partition min_offset names (a key read refuses one that is not the key's)
    min_offset_partition: int | None = None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    redirect: bool = False
    #: partition -> the position the ``after`` token names (judged against the topic's end)
    after: Mapping[int, int] | None = None
    #: the table the ``after`` token names
    after_table: str | None = None

    @property
    def bounded(self) -> bool:
        """Whether the caller bounded how stale an answer may be, so a standby may answer."""
        return self.max_lag is not None or self.max_staleness_ms is not None

    def check(self, info: TableInfo) -> None:
        """400 unless the positions named are of `info`'s table and partitions."""
        if self.after is not None:
            if self.after_table != info.name:
                raise ApiError(
                    "bad_request",
                    f"the after token is of table {self.after_table!r}, not {info.name!r}",
                )
            for p in self.after:
                _check_partition(info, p, "after")
        if self.min_offset_partition is not None:
            _check_partition(info, self.min_offset_partition, "min_offset")

    def onward(self, table: str, partitions: Iterable[int]) -> dict[str, str]:
        """These options as query parameters of an internal call that reads `partitions`."""
        q: dict[str, str] = {}
        if self.max_lag is not None:
            q["max_lag"] = str(self.max_lag)
        if self.max_staleness_ms is not None:
            q["max_staleness_ms"] = str(self.max_staleness_ms)
        if self.at_least:
            # min_offset goes on as itself: a peer judges an after position against the
            # topic's end, and min_offset may name the next offset to come
            parts = set(partitions)
            after = {p: o for p, o in (self.after or {}).items() if p in parts}
            if after:
                q["after"] = positions.Position(table, after).text()
            least = self.min_offset_partition
            if least is not None and least in parts:
                q["min_offset"] = f"{least}:{self.at_least[least] - 1}"
            if after or "min_offset" in q:
                q["timeout_ms"] = str(self.timeout_ms)
        return q


NO_OPTIONS = ReadOptions()


def bound_of(params: Mapping[str, str], after_text: str | None) -> ReadOptions:
    """The read options `params` and an ``after`` token spell, as far as they can be read
    without the table (:meth:`ReadOptions.check` holds them to it); 400 for one that does
    not parse."""
    if not params and after_text is None:
        return NO_OPTIONS
    at_least: dict[int, int] = {}
    after: dict[int, int] | None = None
    after_table = None
    if after_text:
        try:
            token = positions.parse(after_text)
        except positions.BadToken as e:
            raise ApiError(
                "bad_request",
                f"after is not a position token (TABLE@PARTITION:OFFSET,...): {e}; pass back "
                "an X-Tablecast-Position as it came",
            ) from None
        after_table = token.table
        at_least.update(token.offsets)
        after = dict(at_least)
    min_partition = None
    text = params.get("min_offset")
    if text is not None:
        p_text, _, o_text = text.partition(":")
        try:
            min_partition, offset = int(p_text), int(o_text)
        except ValueError:
            raise ApiError(
                "bad_request", f"min_offset must be PARTITION:OFFSET, not {text!r}"
            ) from None
        if offset < 0 or offset >= 2**63 - 1:
            raise ApiError("bad_request", f"min_offset's offset {offset} is out of range")
        at_least[min_partition] = max(at_least.get(min_partition, 0), offset + 1)
    timeout_ms = int_param(params, "timeout_ms", DEFAULT_TIMEOUT_MS)
    if timeout_ms > MAX_WAIT_MS:
        raise ApiError("bad_request", f"timeout_ms is at most {MAX_WAIT_MS}")
    redirect = params.get("redirect")
    if redirect not in (None, "true", "false"):
        raise ApiError("bad_request", f"redirect is true or false, not {redirect!r}")
    return ReadOptions(
        int_param(params, "max_lag", None),
        int_param(params, "max_staleness_ms", None),
        at_least or None,
        min_partition,
        timeout_ms,
        redirect == "true",
        after,
        after_table,
    )


def _check_partition(info: TableInfo, partition: int, what: str) -> None:
    if not 0 <= partition < info.partitions:
        raise ApiError(
            "bad_request",
            f"{what} names partition {partition}; {info.name!r} has 0..{info.partitions - 1}",
        )


def may_answer(replica: Replica, opts: ReadOptions, nobody_else: bool) -> bool:
    """Whether `replica` is fresh enough to answer under `opts`: caught up, or within the
    caller's bounds; or — when `nobody_else` (no node has a caught-up replica) — restored
    once, so a partition whose writes fail keeps answering what it holds, reported stale."""
    stale_ms = opts.max_staleness_ms
    if stale_ms is not None and replica.staleness_ms() > stale_ms:
        return False
    if replica.caught_up:
        return True
    if opts.max_lag is not None and replica.lag <= opts.max_lag:
        return True
    if stale_ms is not None:
        return True  # within the staleness asked for (checked above)
    return nobody_else and replica.restored


async def reach(
    replicas: Iterable[tuple[Replica, int]],
    opts: ReadOptions,
    subject: str,
    waits: WaitSlots,
    ends: TopicEnds | None = None,
) -> None:
    """Wait until each replica's position is at least its wanted position (``after``,
    ``min_offset``), within ``timeout_ms`` for all of them together.

    A wait is a future the ingest thread completes when it applies that far (no
    polling); a caller may have only so many reads waiting at once. A replica
    released while waiting raises ``partition_unavailable``: the caller routes
    the read again. With `ends`, an ``after`` position beyond its partition's end
    is refused (400) before anything waits for it.
    """
    behind = [(r, want) for r, want in replicas if r.position < want]
    if not behind:
        return
    waits.enter(subject)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.timeout_ms / 1000
    try:
        if ends is not None and opts.after:
            after = opts.after
            by_table: dict[str, tuple[TableInfo, dict[int, int], dict[int, int]]] = {}
            for r, _ in behind:
                if r.partition in after:
                    info, claims, known = by_table.setdefault(r.table.name, (r.table, {}, {}))
                    claims[r.partition] = after[r.partition]
                    known[r.partition] = max(r.end_offset, r.position)
            for info, claims, known in by_table.values():
                await ends.refuse_beyond(info, claims, known, "after")
        for replica, want in behind:
            while replica.position < want:
                if replica.closed:
                    raise ApiError("partition_unavailable", "the replica was released", [])
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise ApiError(
                        "timeout",
                        f"partition {replica.partition} of {replica.table.name!r} did not reach "
                        f"offset {want} within {opts.timeout_ms} ms (it is at {replica.position})",
                    )
                # the waiters count in applied offsets: position `want` is offset want - 1
                future = replica.waiters.wait(want - 1)
                timer = loop.call_later(remaining, wake, future)
                try:
                    # an apply between the check above and wait() woke nobody: look again
                    if replica.position < want and not replica.closed:
                        await future
                finally:
                    timer.cancel()
                    replica.waiters.forget(future)
    finally:
        waits.leave(subject)


class TopicEnds:
    """Where partitions end (their high watermarks) as the broker says, for positions a caller
    names that the node cannot vouch for: a resume token's or an ``after`` token's offsets.

    A position at or below an end known here (a replica's, the watch feed's, or an earlier
    answer: ends only grow) is within its topic at once. Beyond them, the broker is asked
    through a client made for the question, off the loop, with at most one question per
    topic at a time: callers that come while one is asked share the next one, so every
    caller's answer was asked after it came, and a flood of made-up offsets costs one
    question at a time.
    """

    def __init__(self, bootstrap_servers: Callable[[], str], timeout_s: float = 5.0) -> None:
        #: looked up when the broker is first asked (a node's settings are read then)
        self._bootstrap = bootstrap_servers
        self._timeout_s = timeout_s
        self._pool: ThreadPoolExecutor | None = None
        #: topic -> partition -> the end the broker last said
        self._known: dict[str, dict[int, int]] = {}
        #: topic -> the latest question, and whether it has been put to the broker yet
        self._questions: dict[str, tuple[asyncio.Task[dict[int, int]], list[bool]]] = {}
        self.questions = 0

    def known(self, topic: str, partition: int) -> int:
        """The greatest end of the partition the broker has said so far (0: none)."""
        return self._known.get(topic, {}).get(partition, 0)

    async def refuse_beyond(
        self,
        info: TableInfo,
        claims: Mapping[int, int],
        known: Mapping[int, int],
        what: str,
        waiting: tuple[WaitSlots, str] | None = None,
    ) -> None:
        """400 when an offset of `claims` (partition -> offset) lies beyond its partition's
        end; `known` holds ends the caller can vouch for (lower bounds of the real ones).
        503 when the broker cannot be asked. `waiting`: the caller's wait slots and subject,
        a slot held while the broker is asked."""
        unsure = {
            p: o for p, o in claims.items() if o > max(known.get(p, 0), self.known(info.topic, p))
        }
        if not unsure:
            return
        if waiting is not None:
            waiting[0].enter(waiting[1])
        try:
            said = await self.ask(info.topic, info.partitions)
        except Exception as e:  # the broker's answer is what a refusal rests on
            raise ApiError(
                "partition_unavailable",
                f"cannot ask where the partitions of {info.name!r} end, to check {what}: {e}",
                [("retry-after", "1")],
            ) from None
        finally:
            if waiting is not None:
                waiting[0].leave(waiting[1])
        for p, o in sorted(unsure.items()):
            end = said.get(p, 0)
            if o > end:
                raise ApiError(
                    "bad_request",
                    f"{what} names offset {o} of partition {p} of {info.name!r}, beyond its "
                    f"end ({end}): pass back a position as a node gave it",
                )

    async def ask(self, topic: str, partitions: int) -> dict[int, int]:
        """Each partition's end, from a question put to the broker after this call began."""
        loop = asyncio.get_running_loop()
        latest = self._questions.get(topic)
        if latest is not None and not latest[0].done() and not latest[1][0]:
            return await asyncio.shield(latest[0])  # not put yet: it will answer us too
        before = latest[0] if latest is not None and not latest[0].done() else None
        asked = [False]
        task = loop.create_task(self._question(topic, partitions, before, asked))
        self._questions[topic] = (task, asked)
        return await asyncio.shield(task)

    async def _question(
        self,
        topic: str,
        partitions: int,
        before: asyncio.Task[dict[int, int]] | None,
        asked: list[bool],
    ) -> dict[int, int]:
        if before is not None:
            await asyncio.wait([before])  # one question per topic at a time
        asked[0] = True
        self.questions += 1
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2, thread_name_prefix="tablecast-ends")
        slots = [(topic, p) for p in range(partitions)]
        got = await asyncio.get_running_loop().run_in_executor(
            self._pool, ends_from_a_fresh_client, self._bootstrap(), slots, self._timeout_s
        )
        known = self._known.setdefault(topic, {})
        for (_, p), end in got.items():
            known[p] = max(known.get(p, 0), end)
        return {p: end for (_, p), end in got.items()}
