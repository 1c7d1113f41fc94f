"""A partition whose store writes fail, and its way back.

A write that fails (disk full, an I/O error) stops the partition at the failed
batch: the ingestion takes it off the consumer (what it had fetched beyond the
batch is dropped), it keeps answering from what it holds, and it is retried
with backoff (1, 2, 4 … up to ``MAX_BACKOFF_S`` seconds). A RocksDB store takes
no writes after a failed one until it is opened again, which is done once its
disk has room; then the partition goes back on the consumer at the failed
batch, and resumes with no gap when the write succeeds. The states it goes
through are :class:`~tablecast.cluster.replica_lifecycle.Writes`.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tablecast.cluster.replica import Replica
from tablecast.cluster.replica_lifecycle import Writes
from tablecast.store import PartitionStore, Write

log = logging.getLogger(__name__)

#: retries of a failed write wait 1, 2, 4 ... up to this many seconds (a retry while
#: the disk is still full costs one statfs)
MAX_BACKOFF_S = 10.0
#: free bytes a RocksDB store's disk needs before it is reopened after a failed write
REOPEN_FREE_BYTES = 8 * 1024 * 1024


#: what failed() says by default: the store refused the writes
STORE_WRITE = "writing to the store"


def failed(
    replica: Replica, writes: Sequence[Write], error: Exception, doing: str = STORE_WRITE
) -> None:
    """The store refused `writes` (or, as `doing` says, they could not be made: their
    writer schema did not come): the replica stops at them until :func:`retry` says to go
    on (the caller takes the partition off the consumer)."""
    first = replica.failed is None
    replica.store_failed = doing == STORE_WRITE
    replica.failures += 1
    replica.error = f"{type(error).__name__}: {error}"[:500]
    replica.failed_offset = writes[0].offset
    replica.end_offset = max(replica.end_offset, writes[-1].offset + 1)
    replica.retry_at = time.monotonic() + min(MAX_BACKOFF_S, 2.0 ** min(replica.failures - 1, 5))
    replica.move(Writes.FAILED)
    if first:
        log.error(
            "table %r partition %d: %s offsets %d..%d failed: %s; "
            "the partition stops there, keeps answering from what it holds, "
            "and is retried until it succeeds",
            replica.table.name,
            replica.partition,
            doing,
            writes[0].offset,
            writes[-1].offset,
            replica.failed,
        )
    else:
        log.debug("%s/%d: retry failed: %s", replica.table.name, replica.partition, replica.failed)


def recovered(replica: Replica) -> None:
    """A write worked again after failed ones (or the records could be made again)."""
    what = "store writes work again" if replica.store_failed else "records are read again"
    log.info(
        "table %r partition %d: %s after %d failure(s); continuing from offset %d",
        replica.table.name,
        replica.partition,
        what,
        replica.failures,
        replica.failed_offset,
    )
    replica.move(Writes.WRITING)
    replica.failures = 0


def retry(replica: Replica, now: float, open_store: Callable[[], PartitionStore]) -> bool:
    """Whether a stopped replica goes back on the consumer now (at its position): its retry
    is due, and its store (opened again with `open_store`) takes writes."""
    if replica.retry_at > now:
        return False
    if replica.store_failed and not _reopen(replica, open_store):
        replica.retry_at = now + min(MAX_BACKOFF_S, 2.0 ** min(replica.failures, 5))
        return False
    replica.move(Writes.RETRYING)
    return True


def _reopen(replica: Replica, open_store: Callable[[], PartitionStore]) -> bool:
    """A RocksDB store refuses writes after a failed one until reopened; reopen it once
    its disk has room again. False: not yet."""
    path = durable_path(replica.store)
    if path is None:
        return True  # a memory store has nothing to reopen
    try:
        if shutil.disk_usage(path).free < REOPEN_FREE_BYTES:
            return False
    except OSError:
        return False
    # closing first: RocksDB allows one open instance per directory. Until the new store
    # is in place (also while a failed reopen is retried) reads go to a peer holding the
    # partition, or wait the routing's grace for this one
    if replica.writes is not Writes.REOPENING:  # else a reopen that failed, tried again
        replica.move(Writes.REOPENING)
    try:
        replica.store.close()
        replica.store = open_store()
    except Exception as e:
        log.warning(
            "reopening the store of %s/%d failed: %s", replica.table.name, replica.partition, e
        )
        return False
    return True


def durable_path(store: object) -> Path | None:
    """Where a RocksDB store (behind its read cache or not) keeps its files; None for memory."""
    inner = getattr(store, "inner", store)  # a read cache in front of the durable store
    path = getattr(inner, "path", None)
    return path if isinstance(path, Path) else None
