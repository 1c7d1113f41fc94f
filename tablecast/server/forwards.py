"""Plain key reads of another node's partitions, forwarded on a path as short as a kept
answer's (:mod:`tablecast.server.answers`).

A ``GET /v1/tables/{t}/keys/{k}`` with no query string, token, rate limit,
consistency header or hop, whose partition a peer answers first, goes through
the router as any read: a request object, the key parsed and hashed, the
choices listed, closures to read here if the peer fails, a future for the
answer. On the forwarding node that Python cost more than the forward itself
(the read's answer comes back in a batch, :mod:`tablecast.server.coalesce`).
Here the path's table, partition and onward target are kept by path (a
*plan*), and each read costs the routing check and a place in the batch.

Whatever the answer, it is the router's: the same peer (the first of
:meth:`Routing.choices` for such a read), the same target and onward headers,
the peer's status, headers and body passed on as they came. Only a read the
peer could not answer (unreachable, 503) goes the router's way after all
(:meth:`forward_failed`): to the other choices, as :meth:`Rpc.forward` does.
"""

from __future__ import annotations

import asyncio
import os

from tablecast.cluster.ingest import Ingestor
from tablecast.cluster.membership import Member
from tablecast.kafka.catalog import TableInfo
from tablecast.serde import SerdeError
from tablecast.server.coalesce import Coalescer, RawResponse
from tablecast.server.request import HOP
from tablecast.server.routing import Routing
from tablecast.server.rpc import FORWARD_TIMEOUT_S, key_target, plain_key_read
from tablecast.store.cache import drop_oldest

#: TABLECAST_FORWARD_SHORT=0 sends every forwarded read the router's way (for comparison)
ENABLED = os.environ.get("TABLECAST_FORWARD_SHORT", "1") != "0"
#: what every such read carries onward: the hop mark (no token, no position: none came)
ONWARD = [(HOP, "1")]
#: plans kept at most (about 300 bytes each); the oldest eighth goes when full
MAX_PLANS = 100_000


class Plan:
    """What a path names: its table (as the catalog had it), partition and onward target."""

    __slots__ = ("info", "partition", "target")

    def __init__(self, info: TableInfo, partition: int, target: str) -> None:
        self.info, self.partition, self.target = info, partition, target


class Forwards:
    def __init__(
        self, ingestor: Ingestor, routing: Routing, coalescer: Coalescer, max_key_bytes: int
    ) -> None:
        self._ingestor = ingestor  # its tables are replaced on a change, never mutated
        self.routing = routing
        self.coalescer = coalescer
        self.max_key_bytes = max_key_bytes
        self._plans: dict[str, Plan] = {}

    def submit(self, path: str) -> tuple[Member, asyncio.Future[RawResponse]] | None:
        """The peer a plain read of `path` is forwarded to and its answer to come, or None
        when the router takes it (not a key read, read here, a table not served, a key
        the router refuses, the peer taking reads one by one)."""
        plan = self._plans.get(path)
        if plan is None or self._ingestor.tables.get(plan.info.name) is not plan.info:
            plan = self._plan(path)
            if plan is None:
                return None
        member = self.routing.first_peer(plan.info, plan.partition)
        if member is None:
            return None
        waiter = self.coalescer.submit(member.url, plan.target, ONWARD, FORWARD_TIMEOUT_S)
        return None if waiter is None else (member, waiter)

    def _plan(self, path: str) -> Plan | None:
        found = plain_key_read("GET", path)
        if found is None:
            return None
        table, key_text = found
        info = self._ingestor.tables.get(table)
        if info is None or info.kind != "kv" or len(key_text) > self.max_key_bytes:
            return None  # the router says why
        try:
            raw = info.key_serde.text_to_bytes(key_text)
        except (SerdeError, ValueError, TypeError, OverflowError):
            return None
        plan = Plan(info, info.partition_of(raw), key_target(table, key_text, ""))
        plans = self._plans
        if len(plans) >= MAX_PLANS:
            for _ in drop_oldest(plans):
                pass
        plans[path] = plan
        return plan
