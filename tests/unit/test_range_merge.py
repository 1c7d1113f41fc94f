"""A range page reads about what it returns from the stores, not partitions × limit, and each
partition's rows come from one read exact at the position reported for it."""

from __future__ import annotations

from typing import Any

from tablecast import serde
from tablecast.cluster.replica import Replica
from tablecast.contract.table_info import TableInfo
from tablecast.query.local import MIN_CHUNK, read_page
from tablecast.query.policy import KeyScope
from tablecast.query.scans import Scan
from tablecast.store import MemoryStore, Write

PARTITIONS = 12
INFO = TableInfo("t", "app.table.t", PARTITIONS, serde.string().spec(), serde.json().spec())


class Counting(MemoryStore):
    """Counts the rows its scans hand out."""

    def __init__(self) -> None:
        super().__init__()
        self.read = 0

    def scan(self, start: Any, end: Any, limit: int) -> Any:
        rows = super().scan(start, end, limit)
        self.read += len(rows)
        return rows


def _replicas(keys_of: dict[int, list[bytes]]) -> list[Replica]:
    out = []
    for p in range(PARTITIONS):
        store = Counting()
        store.apply([Write(k, b"1", i, 0) for i, k in enumerate(keys_of.get(p, []))])
        out.append(Replica(INFO, p, store))
    return out


def _page(replicas: list[Replica], limit: int, scope: KeyScope | None = None) -> list[bytes]:
    rows, positions = read_page(INFO, replicas, Scan(INFO, scope), None, None, limit)
    assert positions == [r.position for r in replicas]
    return [k for k, _ in rows]


def _read(replicas: list[Replica]) -> int:
    return sum(r.store.read for r in replicas)  # type: ignore[attr-defined]


def test_even_keys_are_read_about_once() -> None:
    keys = {p: [b"k%05d" % (i * PARTITIONS + p) for i in range(500)] for p in range(PARTITIONS)}
    replicas = _replicas(keys)
    page = _page(replicas, 1000)
    assert page == sorted(k for ks in keys.values() for k in ks)[:1000]
    assert _read(replicas) <= 2 * 1000  # reading 1000 of every partition first: 12,000


def test_skewed_keys_double_the_chunk_of_the_busy_partition() -> None:
    keys = {0: [b"a%05d" % i for i in range(5000)], 5: [b"z"]}
    replicas = _replicas(keys)
    assert _page(replicas, 1000) == keys[0][:1000]
    # the busy partition is read again from the start, each time 4 times as much
    assert _read(replicas) <= 2 * 1000 + PARTITIONS * MIN_CHUNK


def test_only_the_granted_spans_are_read() -> None:
    keys = {p: [b"%s/%03d" % (u, p * 100 + i) for u in (b"al", b"bo") for i in range(50)]
            for p in range(PARTITIONS)}  # fmt: skip
    replicas = _replicas(keys)
    page = _page(replicas, 100, KeyScope([b"bo/"]))
    assert page == sorted(k for ks in keys.values() for k in ks if k.startswith(b"bo/"))[:100]
    assert _read(replicas) <= 2 * 100 + PARTITIONS * MIN_CHUNK
