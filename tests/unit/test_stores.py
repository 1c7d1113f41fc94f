"""Both store backends against a plain-dict model of a compacted table."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tablecast.store import PartitionStore, Record, Write, open_store
from tablecast.store.rocksdb import RocksDBStore

keys = st.binary(min_size=0, max_size=4)
batches = st.lists(
    st.lists(st.tuples(keys, st.one_of(st.none(), st.binary(max_size=8))), max_size=12),
    max_size=6,
)


@pytest.fixture(params=["memory", "rocksdb"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[PartitionStore] = []
    counter = iter(range(10**6))

    def factory() -> PartitionStore:
        store = open_store(request.param, tmp_path / f"s{next(counter)}")
        made.append(store)
        return store

    yield factory
    for s in made:
        s.close()


def apply_all(store: PartitionStore, batches: list) -> dict[bytes, Record]:  # type: ignore[type-arg]
    model: dict[bytes, Record] = {}
    offset = 0
    for batch in batches:
        writes = []
        for key, value in batch:
            writes.append(Write(key, value, offset, 1000 + offset))
            if value is None:
                model.pop(key, None)
            else:
                model[key] = Record(value, offset, 1000 + offset)
            offset += 1
        store.apply(writes)
    return model


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=batches)
def test_store_matches_model(make, batches) -> None:  # type: ignore[no-untyped-def]
    store = make()
    model = apply_all(store, batches)
    assert len(store) == len(model)
    every = sorted(model)
    assert store.scan(None, None, 10**6) == [(k, model[k]) for k in every]
    for k in [*model, b"absent"]:
        assert store.get(k) == model.get(k)
    probe = [*model, b"zz"]
    assert store.multi_get(probe) == [model.get(k) for k in probe]
    # bounded scans: from inclusive, to exclusive, limit respected
    if every:
        lo, hi = every[0], every[-1]
        assert [k for k, _ in store.scan(lo, hi, 10**6)] == every[:-1]
        assert [k for k, _ in store.scan(None, None, 1)] == every[:1]
    written = sum(len(b) for b in batches)
    assert store.applied_offset == (written - 1 if any(batches) else -1)


def test_rocksdb_resumes_from_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    store = RocksDBStore(path)
    store.apply([Write(b"a", b"1", 0, 10), Write(b"b", b"2", 1, 11), Write(b"a", None, 2, 12)])
    store.apply([Write(b"c", b"3", 3, 13)])
    store.close()
    again = RocksDBStore(path)
    assert again.applied_offset == 3
    assert len(again) == 2
    assert again.get(b"a") is None
    assert again.get(b"b") == Record(b"2", 1, 11)
    assert [k for k, _ in again.scan(None, None, 10)] == [b"b", b"c"]
    again.close()
