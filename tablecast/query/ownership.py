"""Ownership: which node answers for a partition (Kafka Streams' host metadata).

For each partition the choice is, in order: this node if it may answer (it is
the effective active, the table is global, the caller bounded staleness with
``max_lag`` or ``max_staleness_ms``, or the request was forwarded here
already), else the caught-up holders from the cluster view, the effective
active first. ``x-tablecast-hop`` marks a forwarded request, which is only
ever answered locally: no loops.
"""

from __future__ import annotations

from collections.abc import Iterable

from tablecast.cluster.membership import Member
from tablecast.cluster.node import Node
from tablecast.contract.table_info import TableInfo
from tablecast.query.consistency import NO_OPTIONS, ReadOptions
from tablecast.query.local import Local, unavailable
from tablecast.query.request import Request

ME = "me"
#: a client's read: no parameters, not forwarded, no caller
PLAIN = Request({})
Choice = str | Member  # ME, or a peer


class Routing:
    def __init__(self, node: Node, local: Local) -> None:
        self.node = node
        self.me = node.id  # read on every request: a plain attribute, not a property chain
        self.local = local

    def answers_here(
        self, info: TableInfo, partition: int, req: Request, opts: ReadOptions
    ) -> bool:
        """Whether this node, holding a readable replica of `partition`, answers for it itself."""
        slot = (info.name, partition)
        view = self.node.view
        owners = view.target.get(slot)
        if owners and owners[0] == self.me:  # the common case first: it is ours
            return True
        if opts.bounded or req.forwarded or info.is_global:
            return True
        # the view is up to a tick old: a replica that just caught up may not be in it
        # yet, so when nobody is known to answer, the holder does
        return view.effective_active(slot) in (self.me, None)

    def choices(
        self, info: TableInfo, partition: int, req: Request, opts: ReadOptions
    ) -> list[Choice]:
        here = self.local.readable(info, partition, opts) is not None
        if here and self.answers_here(info, partition, req, opts):
            return [ME]
        if req.forwarded or info.is_global:
            return []
        out: list[Choice] = []
        for member in self.node.view.candidates((info.name, partition)):
            if member.id == self.me:
                if here:
                    out.append(ME)
            else:
                out.append(member)
        return out

    def first_peer(self, info: TableInfo, partition: int) -> Member | None:
        """The peer :meth:`choices` puts first for a client's read of `partition` without
        read options, or None when it puts this node first or names nobody (the short path
        of plain forwarded reads, :mod:`tablecast.query.short_path`)."""
        choices = self.choices(info, partition, PLAIN, NO_OPTIONS)
        first = choices[0] if choices else None
        return first if isinstance(first, Member) else None

    def groups(
        self, info: TableInfo, partitions: Iterable[int], req: Request, opts: ReadOptions
    ) -> list[tuple[Choice, list[int]]]:
        """The partitions grouped by the node that answers for them first; 503 for a
        partition nobody can answer."""
        groups: dict[str, tuple[Choice, list[int]]] = {}
        for p in partitions:
            choices = self.choices(info, p, req, opts)
            if not choices:
                raise unavailable(info, p)
            first = choices[0]
            key = first if isinstance(first, str) else first.id
            groups.setdefault(key, (first, []))[1].append(p)
        return list(groups.values())
