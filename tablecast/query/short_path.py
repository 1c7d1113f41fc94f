"""Plain key reads of another node's partitions, forwarded on a path as short as a kept
answer's (:mod:`tablecast.query.kept_answers`).

A ``GET /v1/tables/{t}/keys/{k}`` with no query string, token, rate limit,
consistency header or hop, whose partition a peer answers first, goes through
the router as any read: a request object, the key parsed and hashed, the
choices listed, closures to read here if the peer fails, a future for the
answer. On the forwarding node that Python cost more than the forward itself
(the read's answer comes back in a batch, :mod:`tablecast.query.coalesce`).
Here the path's table, partition and onward target are kept by path (a
*plan*, left by the router the first time it forwards a read of that path),
and each later read costs the routing check and a place in the batch: its answer, the
peer's whole response, goes straight to the connection that asked (a
:class:`~tablecast.query.coalesce.Sink`), which writes it as it came.

Whatever the answer, it is the router's: the same peer (the first of
:meth:`Routing.choices` for such a read), the same target and onward headers,
the peer's status, headers and body passed on as they came. Only a read the
peer could not answer (unreachable, 503) goes the router's way after all
(:meth:`forward_failed`): to the other choices, as :meth:`Rpc.forward` does.
"""

from __future__ import annotations

from tablecast.cluster.ingest import Ingestor
from tablecast.cluster.membership import Member
from tablecast.contract.table_info import TableInfo
from tablecast.query.coalesce import Coalescer, Sink
from tablecast.query.ownership import Routing
from tablecast.query.peer_calls import FORWARD_TIMEOUT_S
from tablecast.query.request import HOP
from tablecast.store.cache import drop_oldest

#: what every such read carries onward: the hop mark (no token, no position: none came)
ONWARD = [(HOP, "1")]
#: plans kept at most (about 300 bytes each); the oldest eighth goes when full
MAX_PLANS = 100_000


class Plan:
    """What a path names: its table (as the catalog had it), partition and onward target."""

    __slots__ = ("info", "partition", "path", "target")

    def __init__(self, path: str, info: TableInfo, partition: int, target: str) -> None:
        self.path, self.info, self.partition, self.target = path, info, partition, target


class Forwards:
    def __init__(self, ingestor: Ingestor, routing: Routing, coalescer: Coalescer) -> None:
        self._ingestor = ingestor  # its tables are replaced on a change, never mutated
        self.routing = routing
        self.coalescer = coalescer
        self._plans: dict[str, Plan] = {}

    def plan(self, path: str) -> Plan | None:
        """The plan of a plain read of `path`; None for a path the router has not forwarded
        (it leaves one as it does, :meth:`remember`)."""
        return self._plans.get(path)

    def send(self, plan: Plan, sink: Sink) -> Member | None:
        """The peer the read `plan` is for is forwarded to, its answer to be given to
        `sink`; None, and nothing sent, when the router takes it: one read here now, a
        table changed in the catalog, the peer taking reads one by one."""
        info = plan.info
        if self._ingestor.tables.get(info.name) is not info:
            if self._plans.get(plan.path) is plan:
                del self._plans[plan.path]
            return None
        member = self.routing.first_peer(info, plan.partition)
        if member is None:
            return None
        sent = self.coalescer.send(member.url, plan.target, ONWARD, FORWARD_TIMEOUT_S, sink)
        return member if sent else None

    def remember(self, path: str, info: TableInfo, partition: int, target: str) -> None:
        """What the router found `path` to name, as it forwards a plain read of it: the
        next read of the path takes the short path. Only forwarded paths are kept, so a
        read this node answers itself (a cold key, say) pays nothing here."""
        plans = self._plans
        if len(plans) >= MAX_PLANS:
            for _ in drop_oldest(plans):
                pass
        plans[path] = Plan(path, info, partition, target)
