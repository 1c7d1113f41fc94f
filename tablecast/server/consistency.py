"""Read options: which replica may answer a read and how fresh it must be, for every read route.

Every read route (keys, windows, batchGet, range, count, history, index, and
the internal routes a fan-out calls) takes its consistency options from
:func:`read_options` and no other place:

- ``max_lag=N``: a replica at most N records behind its topic's end may answer
  (a standby too); ``max_staleness_ms=N``: a replica last known at its
  topic's end at most N ms ago may answer (a standby too), and none staler
  does — not even the active, so a node cut off from Kafka refuses rather
  than answering older than asked.
- ``after=TOKEN`` (or the header ``X-Tablecast-After``) and
  ``min_offset=P:O``: the answering replica of each partition read must
  have reached the token's offset (``min_offset``: applied offset O, i.e.
  position O+1) first; it waits up to ``timeout_ms`` (default 1000), woken by
  the ingest thread as it applies, then answers ``504``.
- ``redirect=true``: answer ``307`` to the node that owns the data instead of
  forwarding (a read of one partition, or a fan-out whose partitions one other
  node answers for all).

Options are parsed once per request and kept on it; a request without query
parameters or the header gets :data:`NO_OPTIONS` without parsing anything
(the point-GET hot path).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tablecast.cluster.offsetwait import wake
from tablecast.cluster.replica import Replica
from tablecast.kafka import positions
from tablecast.kafka.catalog import TableInfo
from tablecast.server.errors import ApiError
from tablecast.server.params import int_param

if TYPE_CHECKING:
    from tablecast.server.ratelimit import WaitSlots

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

    @property
    def bounded(self) -> bool:
        """Whether the caller bounded how stale an answer may be, so a standby may answer."""
        return self.max_lag is not None or self.max_staleness_ms is not None

    def onward(self, table: str, partitions: Iterable[int]) -> dict[str, str]:
        """These options as query parameters of an internal call that reads `partitions`."""
        q: dict[str, str] = {}
        if self.max_lag is not None:
            q["max_lag"] = str(self.max_lag)
        if self.max_staleness_ms is not None:
            q["max_staleness_ms"] = str(self.max_staleness_ms)
        if self.at_least:
            wanted = {p: self.at_least[p] for p in partitions if p in self.at_least}
            if wanted:
                q["after"] = positions.Position(table, wanted).text()
                q["timeout_ms"] = str(self.timeout_ms)
        return q


NO_OPTIONS = ReadOptions()


def read_options(params: Mapping[str, str], headers: Any, info: TableInfo) -> ReadOptions:
    """The read options of a request to `info`'s table; 400 for one that does not parse."""
    after_text = params.get("after") or headers.get(AFTER_HEADER)
    if not params and after_text is None:
        return NO_OPTIONS
    at_least: dict[int, int] = {}
    if after_text:
        try:
            token = positions.parse(after_text)
        except positions.BadToken as e:
            raise ApiError(
                "bad_request",
                f"after is not a position token (TABLE@PARTITION:OFFSET,...): {e}; pass back "
                "an X-Tablecast-Position as it came",
            ) from None
        if token.table != info.name:
            raise ApiError(
                "bad_request", f"the after token is of table {token.table!r}, not {info.name!r}"
            )
        for p, o in token.offsets.items():
            _check_partition(info, p, "after")
            at_least[p] = o
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
        _check_partition(info, min_partition, "min_offset")
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
    replicas: Iterable[tuple[Replica, int]], opts: ReadOptions, subject: str, waits: WaitSlots
) -> None:
    """Wait until each replica's position is at least its wanted position (``after``,
    ``min_offset``), within ``timeout_ms`` for all of them together.

    A wait is a future the ingest thread completes when it applies that far (no
    polling); a caller may have only so many reads waiting at once. A replica
    released while waiting raises ``partition_unavailable``: the caller routes
    the read again.
    """
    behind = [(r, want) for r, want in replicas if r.position < want]
    if not behind:
        return
    waits.enter(subject)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.timeout_ms / 1000
    try:
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
