"""Both store backends against a plain-dict model of a compacted table."""

from __future__ import annotations

import sys
import threading
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


#: (backend, read-cache bytes): a cache big enough for every key, and one so small
#: that it keeps dropping entries
BACKENDS = [("memory", 0), ("rocksdb", 0), ("rocksdb", 1 << 20), ("rocksdb", 600)]


@pytest.fixture(params=BACKENDS, ids=["memory", "rocksdb", "rocksdb-cached", "rocksdb-tiny-cache"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    made: list[PartitionStore] = []
    counter = iter(range(10**6))
    kind, cache_bytes = request.param

    def factory() -> PartitionStore:
        store = open_store(kind, tmp_path / f"s{next(counter)}", cache_bytes)
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
        # read between batches too, so a read cache is filled and must be refreshed by the next
        for key, _ in batch:
            assert store.get(key) == model.get(key)
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
    # counts of a span (what a policy lets a caller count) agree with the model
    for lo, hi in ((None, None), (b"\x01", None), (None, b"\x80"), (b"\x10", b"\x10\x00")):
        inside = [k for k in every if (lo is None or k >= lo) and (hi is None or k < hi)]
        assert store.count_range(lo, hi) == len(inside)
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


def test_a_record_left_out_counts_as_applied(make) -> None:  # type: ignore[no-untyped-def]
    store = make()
    store.apply([Write(b"a", b"1", 0, 10), Write(b"b", b"2", 1, 11)])
    store.skip_past(3)  # offsets 2 and 3 were records left out as bad
    assert store.applied_offset == 3
    store.skip_past(2)  # never backwards
    assert store.applied_offset == 3
    assert (len(store), store.get(b"a")) == (2, Record(b"1", 0, 10))


def test_rocksdb_resumes_past_records_left_out(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path / "p0")
    store.apply([Write(b"a", b"1", 0, 10)])
    store.skip_past(5)
    store.close()
    again = RocksDBStore(tmp_path / "p0")
    assert (again.applied_offset, len(again)) == (5, 1)
    again.close()


def test_cached_reads_never_lag_the_applied_offset(tmp_path: Path) -> None:
    """A reader racing the applying thread never gets a value older than the applied offset.

    That is what ``min_offset`` promises: once offset O is applied, a read
    returns the value of O or later, never an older one held in the cache.
    """
    store = open_store("rocksdb", tmp_path / "p0", 1 << 20)
    hot = [b"k%d" % i for i in range(8)]
    rounds = 10_000
    done = threading.Event()

    def write() -> None:
        for n in range(rounds):
            store.apply([Write(k, b"%d" % n, n * len(hot) + i, n) for i, k in enumerate(hot)])
        done.set()

    writer = threading.Thread(target=write)
    # switch threads as often as CPython allows, so that the reader is often
    # interrupted between reading RocksDB and filling the cache
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer.start()
    stale = []
    try:
        while not done.is_set():
            for i, k in enumerate(hot):
                applied = store.applied_offset
                record = store.get(k)
                if applied >= i:  # the last write of k at or before `applied`
                    newest = applied - (applied - i) % len(hot)
                    if record is None or record.offset < newest:
                        stale.append((k, applied, record))
    finally:
        writer.join()
        sys.setswitchinterval(interval)
    assert not stale, stale[:5]
    for i, k in enumerate(hot):
        assert store.get(k) == Record(b"%d" % (rounds - 1), (rounds - 1) * len(hot) + i, rounds - 1)
    store.close()


def test_replica_reads_are_exact_at_the_position_they_report(make) -> None:  # type: ignore[no-untyped-def]
    """A read through :meth:`Replica.read` racing the applying thread answers exactly what the
    topic holds below the position it reports: no later record (a key that appeared or
    vanished after that position) and no earlier one. This is what an answer's
    ``X-Tablecast-Position`` promises, and what lets a 404 be judged exactly."""
    from tablecast.cluster.replica import Replica
    from tablecast.contract.table_info import TableInfo

    info = TableInfo("t", "t-topic", 1, {"format": "bytes"}, {"format": "bytes"})
    replica = Replica(info, 0, make())
    hot = [b"k%d" % i for i in range(6)]
    # round n writes every hot key, deleting the odd ones on odd rounds: at any position a
    # key's state is known from the offset alone
    rounds = 6000

    def state_at(key_index: int, position: int) -> bytes | None:
        """The value of hot[key_index] with every record below `position` applied."""
        last = position - 1 - (position - 1 - key_index) % len(hot)  # its last record below
        if last < 0:
            return None
        n = last // len(hot)
        return None if (n % 2 and key_index % 2) else b"%d" % n

    done = threading.Event()

    def write() -> None:
        for n in range(rounds):
            replica.apply(
                [
                    Write(k, None if (n % 2 and i % 2) else b"%d" % n, n * len(hot) + i, n)
                    for i, k in enumerate(hot)
                ]
            )
        done.set()

    writer = threading.Thread(target=write)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    writer.start()
    wrong = []
    reads = 0
    try:
        while not done.is_set():
            for i, k in enumerate(hot):
                record, position = replica.read(lambda k=k: replica.store.get(k), k)
                got = None if record is None else record.value
                reads += 1
                if got != state_at(i, position):
                    wrong.append((k, position, got, state_at(i, position)))
    finally:
        writer.join()
        sys.setswitchinterval(interval)
    assert reads > 100
    assert not wrong, wrong[:5]


def test_the_block_cache_is_sized_before_the_first_store_opens(tmp_path: Path) -> None:
    """``serve --block-cache-mb``: the node's one block cache takes the size set before any
    store opens, and refuses another size once stores share it (a fresh interpreter: this
    one's cache may be open already)."""
    import subprocess

    script = f"""
from tablecast.store import rocksdb
rocksdb.set_block_cache_bytes(8 << 20)
store = rocksdb.RocksDBStore({str(tmp_path / "s")!r})
assert rocksdb._cache is not None and rocksdb._cache_bytes == 8 << 20
rocksdb.set_block_cache_bytes(8 << 20)  # the same size: nothing changes
try:
    rocksdb.set_block_cache_bytes(16 << 20)
except RuntimeError:
    print("refused")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "refused", done.stderr


def test_a_full_read_cache_drops_its_oldest_eighth_and_stays_nearly_full(tmp_path: Path) -> None:
    from tablecast.store.cache import ENTRY_OVERHEAD, CachedStore

    size = 2 + 10 + ENTRY_OVERHEAD  # each key below, its value and the overhead
    store = open_store("rocksdb", tmp_path / "p0", 100 * size)
    assert isinstance(store, CachedStore)
    keys = [b"%02d" % i for i in range(100)]
    store.apply([Write(k, b"v" * 10, i, 0) for i, k in enumerate(keys)])
    for k in keys:  # fills it exactly
        store.get(k)
    assert len(store._records) == 100
    extra = [b"x%d" % i for i in range(3)]
    store.apply([Write(k, b"w" * 9, 100 + i, 0) for i, k in enumerate(extra)])
    for k in extra:
        assert store.get(k) == Record(b"w" * 9, 100 + extra.index(k), 0)
    # one drop of the oldest eighth made room for all three: the rest stayed
    assert list(store._records) == keys[12:] + extra
    assert store._bytes == 88 * size + 3 * (2 + 9 + ENTRY_OVERHEAD)
    for k in keys[12:]:  # hits: still there, and still right
        assert store.get(k) == Record(b"v" * 10, keys.index(k), 0)
    assert store.hits == 88
    store.close()
