"""Turning membership into what this node holds, and the view routing reads.

Each tick: compute the target assignment from the live members (only when
members or tables changed), publish a fresh :class:`ClusterView`, and tell the
ingestor which partitions to hold: the node's target partitions, every
partition of a global table, and partitions it no longer owns but still must
serve until their new active has been caught up for ``RELEASE_GRACE_S``.

While Kafka is unreachable for this node the assignment is *kept*, not
recomputed: a partition taken over now could not be restored until Kafka
returns, while its old holders keep serving it. The view still drops members
found dead, so routing skips them and a caught-up standby answers. Once Kafka
is back, the assignment follows the live members again; if they are the same,
nothing moves and nothing is restored.
"""

from __future__ import annotations

import logging
import time

from tablecast.cluster.assignment import Slot, assign
from tablecast.cluster.ingest import Ingestor
from tablecast.cluster.membership import Membership
from tablecast.cluster.view import ClusterView

log = logging.getLogger(__name__)

RELEASE_GRACE_S = 3.0
#: a leaving node lets a partition go once its new active has been caught up this long:
#: two heartbeats and a tick, so every node's view says so and reads go there
LEAVING_GRACE_S = 1.2


class Coordinator:
    def __init__(
        self, node_id: str, membership: Membership, ingestor: Ingestor, standby_replicas: int
    ):
        self.node_id = node_id
        self.membership = membership
        self.ingestor = ingestor
        self.standby_replicas = standby_replicas
        self.view = ClusterView({}, {})
        self._assigned_for: tuple[frozenset[str], tuple[Slot, ...]] | None = None
        self._target: dict[Slot, list[str]] = {}
        self._handed_over_since: dict[Slot, float] = {}
        self._frozen_for: frozenset[str] | None = None

    def tick(self) -> ClusterView:
        members = self.membership.alive()
        staying = {n: m for n, m in members.items() if not m.leaving}
        tables = list(self.ingestor.tables.values())
        global_tables = frozenset(t.name for t in tables if t.is_global)
        slots = tuple(
            sorted((t.name, p) for t in tables if not t.is_global for p in range(t.partitions))
        )
        key = (frozenset(staying), slots)
        if key != self._assigned_for and not self._keep_assignment(key[0]):
            self._target = assign(staying, slots, self.standby_replicas)
            self._assigned_for = key
            mine = sum(self.node_id in owners for owners in self._target.values())
            log.info(
                "assignment for %d member(s): this node holds %d of %d partition(s)",
                len(staying),
                mine,
                len(slots),
            )
        view = ClusterView(members, self._target, global_tables)
        self.view = view
        leaving = self.node_id not in staying
        self.ingestor.desired = self._desired(view, tables, leaving)
        return view

    def _keep_assignment(self, members: frozenset[str]) -> bool:
        """Whether to keep the last assignment although the members changed: Kafka is down."""
        if self._assigned_for is None or self.membership.kafka_reachable:
            self._frozen_for = None
            return False
        if self._frozen_for != members:
            self._frozen_for = members
            log.warning(
                "Kafka unreachable: keeping the assignment of %d member(s) (%d live now)",
                len(self._assigned_for[0]),
                len(members),
            )
        return True

    def _desired(self, view: ClusterView, tables: list, leaving: bool) -> set[Slot]:  # type: ignore[type-arg]
        grace = LEAVING_GRACE_S if leaving else RELEASE_GRACE_S
        want = {slot for slot, owners in view.target.items() if self.node_id in owners}
        want |= {(t.name, p) for t in tables if t.is_global for p in range(t.partitions)}
        now = time.monotonic()
        for slot in list(self.ingestor.replicas):
            if slot in want or slot not in view.target:
                self._handed_over_since.pop(slot, None)
                continue
            owners = view.target[slot]
            if owners and view.caught_up(owners[0], slot):
                since = self._handed_over_since.setdefault(slot, now)
                if now - since >= grace:
                    continue  # the new active has served long enough: let go
            else:
                self._handed_over_since.pop(slot, None)
            want.add(slot)  # still needed: keep serving until the new owner is warm
        return want
