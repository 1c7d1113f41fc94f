"""The cluster as one node sees it: who holds what, who answers for what, and in which role.

Ownership may overlap (replicas are read-only copies): the answering node for
a partition, its *effective active*, is the first node of the target
assignment that has caught up, or else any caught-up holder, such as the
previous owner still serving while the new one warms up. So a partition keeps
answering through rebalances.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tablecast.cluster.assignment import Slot
from tablecast.cluster.membership import Member


@dataclass(frozen=True)
class ClusterView:
    members: dict[str, Member]
    target: dict[Slot, list[str]]
    global_tables: frozenset[str] = field(default_factory=frozenset)
    _memo: dict[Slot, list[Member]] = field(default_factory=dict, compare=False, repr=False)

    def caught_up(self, node: str, slot: Slot) -> bool:
        member = self.members.get(node)
        state = member.replicas.get(slot) if member else None
        return bool(state and state.get("caught_up"))

    def candidates(self, slot: Slot) -> list[Member]:
        """Caught-up holders of `slot`, the effective active first, then the standbys."""
        # a view lives for one coordinator tick; routing asks this once per request
        memo = self._memo
        found = memo.get(slot)
        if found is None:
            found = memo[slot] = self._candidates(slot)
        return found

    def _candidates(self, slot: Slot) -> list[Member]:
        ordered = [n for n in self.target.get(slot, ()) if self.caught_up(n, slot)]
        others = sorted(
            n
            for n, m in self.members.items()
            if slot in m.replicas and n not in ordered and self.caught_up(n, slot)
        )
        return [self.members[n] for n in (*ordered, *others)]

    def effective_active(self, slot: Slot) -> str | None:
        found = self.candidates(slot)
        return found[0].id if found else None

    def role(self, node: str, slot: Slot) -> str:
        if not self.caught_up(node, slot):
            return "warming"
        if slot[0] in self.global_tables:
            return "active"
        return "active" if self.effective_active(slot) == node else "standby"
