"""Whole replies to a prepared one-key SELECT, kept under the bytes of the messages that
asked for it, and given again before any message is parsed.

A driver running a prepared statement sends the same few messages for the same key
every time (Bind, perhaps Describe, Execute, Sync; libpq and pgbench in one packet).
When a connection's packet is exactly such a run, and the Execute was a read of one key
answered here with no read option, token or rate limit, the bytes the session wrote for
it (BindComplete, the row, CommandComplete, ReadyForQuery) are kept under the packet's
bytes. The next packet of those very bytes, on any connection whose statement of that
name is the same SQL with the same parameter types, gets them written at once, for as
long as the partition's replica stays where it was read: the same test that keeps a
plain HTTP read's answer (:meth:`tablecast.query.kept_answers.Answers.current`).

Like the kept answers, the replies are bounded by an estimate of their bytes and drop
their oldest eighth when full.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tablecast.cluster.replica import Replica
from tablecast.contract.table_info import TableInfo
from tablecast.query.kept_answers import Answers, ReadMark
from tablecast.store.cache import drop_oldest

#: per reply beyond its request's and reply's bytes: the dict slot, the object, its fields
OVERHEAD = 400


class Reply:
    __slots__ = (
        "binary",
        "described",
        "end",
        "info",
        "name",
        "noted",
        "oids",
        "params",
        "position",
        "replica",
        "reply",
        "sent",
        "slot",
        "sql",
    )

    def __init__(
        self,
        name: str,
        sql: str,
        oids: list[int],
        info: TableInfo,
        replica: Replica,
        position: int,
        end: int,
        reply: bytes,
    ) -> None:
        #: the statement the packet names, as the session that asked had it prepared
        self.name, self.sql, self.oids = name, sql, oids
        self.info, self.replica, self.slot = info, replica, replica.slot
        self.position, self.end = position, end
        self.reply = reply
        #: the unnamed portal the packet left behind (its state, for what comes next)
        self.params: list[Any] = []
        self.binary: list[bool] = []
        self.described = False
        self.sent = 0
        #: the position, lag and staleness the session reports after it (``SHOW``)
        self.noted: tuple[str | None, ...] | None = None


class KeptReplies:
    def __init__(self, answers: Answers, max_bytes: int) -> None:
        self.answers = answers
        self.max_bytes = max_bytes
        self._replies: dict[bytes, Reply] = {}
        self._bytes = 0
        self.hits = 0

    def get(self, request: bytes) -> Reply | None:
        """The reply kept for a packet of these bytes, if it is still the read's answer (the
        caller checks the statement is the same, and counts it in :attr:`hits` if given)."""
        kept = self._replies.get(request)
        if kept is None or not self.answers.current(
            kept.info, kept.replica, kept.slot, kept.position, kept.end
        ):
            return None
        return kept

    def stamp(self, info: TableInfo, replica: Replica, before: ReadMark) -> int | None:
        """:meth:`Answers.stamp`: the position a read is exact at, None when not keepable."""
        return self.answers.stamp(info, replica, before)

    def keep(self, request: bytes, reply: Reply) -> None:
        size = _size(request, reply)
        if size > self.max_bytes:
            return
        before = self._replies.pop(request, None)
        if before is not None:
            self._bytes -= _size(request, before)
        while self._bytes + size > self.max_bytes and self._replies:
            for gone_request, gone in drop_oldest(self._replies):
                self._bytes -= _size(gone_request, gone)
        self._replies[request] = reply
        self._bytes += size

    def __len__(self) -> int:
        return len(self._replies)

    def collect(self) -> Iterator[Metric]:
        """Its figures as Prometheus metrics (a prometheus-client collector)."""
        yield CounterMetricFamily(
            "tablecast_sql_kept_replies",
            "SQL reads answered with the reply kept for a packet of the same bytes",
            value=self.hits,
        )
        yield GaugeMetricFamily(
            "tablecast_sql_kept_reply_bytes",
            "bytes of kept SQL replies, as estimated",
            value=self._bytes,
        )


def _size(request: bytes, reply: Reply) -> int:
    return len(request) + len(reply.reply) + len(reply.sql) + OVERHEAD
