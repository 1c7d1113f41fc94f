"""Who should hold what: a pure function of the live members.

Every (table, partition) gets an ordered list of distinct nodes: the active
first, then up to ``standby_replicas`` standbys. Nodes compute it each on
their own from the same membership, so it must be deterministic; it is
balanced (no node holds more than its share of actives, nor of standbys, plus
one) and sticky: rendezvous hashing ranks nodes per partition, so a member
joining or leaving moves mostly the partitions it wins or held.
Global tables are not assigned: every node holds them whole.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

Slot = tuple[str, int]  # (table, partition)


def rank(slot: Slot, node: str) -> int:
    digest = hashlib.blake2b(f"{slot[0]}\x00{slot[1]}\x00{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assign(
    members: Iterable[str], slots: Sequence[Slot], standby_replicas: int
) -> dict[Slot, list[str]]:
    nodes = sorted(set(members))
    if not nodes:
        return {slot: [] for slot in slots}
    copies = min(1 + standby_replicas, len(nodes))
    preference = {slot: sorted(nodes, key=lambda n: rank(slot, n), reverse=True) for slot in slots}
    result: dict[Slot, list[str]] = {slot: [] for slot in slots}
    # one round per copy: every slot's active first, then every slot's first standby, ...
    for _ in range(copies):
        cap = -(-len(slots) // len(nodes))  # ceil: a node's fair share of this round
        load = dict.fromkeys(nodes, 0)
        for slot in sorted(slots, key=lambda s: preference[s][0]):
            for node in preference[slot]:
                if node not in result[slot] and load[node] < cap:
                    result[slot].append(node)
                    load[node] += 1
                    break
            else:  # every fair-share node already holds this slot: take any other
                spare = next(n for n in preference[slot] if n not in result[slot])
                result[slot].append(spare)
                load[spare] += 1
    return result
