"""History and indexes of both store backends against a reference model: out-of-order
timestamps, deletes, index values that move, and RocksDB stores closed and reopened between
batches."""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tablecast.contract import index_codec as ix
from tablecast.store import PartitionStore, Version, Views, Write, open_store

HISTORY_MS = 50
VIEWS = Views(HISTORY_MS, ("train", "stop"))
KEYS = [b"a", b"b", b"a\x00", b"c\x00\xff", b""]

index_values = st.one_of(
    st.integers(-3, 3), st.sampled_from([1.5, -0.0, 2.0, 1e300]), st.sampled_from(["x", "y", ""])
)
records = st.tuples(
    st.sampled_from(KEYS),
    st.one_of(st.none(), st.binary(min_size=1, max_size=3)),
    st.integers(0, 200),  # timestamps out of order, often equal
    st.fixed_dictionaries(
        {},
        optional={
            "train": st.one_of(st.none(), index_values, st.lists(index_values, max_size=3)),
            "stop": index_values,
            "unknown": index_values,
        },
    ),
)
batches = st.lists(st.lists(records, min_size=1, max_size=8), min_size=1, max_size=8)


class Model:
    """What the topic implies: every record in offset order, judged from scratch."""

    def __init__(self) -> None:
        self.records: list[tuple[bytes, bytes | None, int, int, dict[str, Any]]] = []

    def add(self, key: bytes, value: bytes | None, ts: int, header: dict[str, Any]) -> Write:
        offset = len(self.records)
        self.records.append((key, value, offset, ts, header))
        raw = ix.encode_header(header) if header else None
        return Write(key, value, offset, ts, ix.entries(raw, VIEWS.indexes))

    @property
    def cutoff(self) -> int:
        return max(r[3] for r in self.records) - HISTORY_MS

    def rows(self) -> dict[bytes, tuple[bytes, dict[str, Any]]]:
        out: dict[bytes, tuple[bytes, dict[str, Any]]] = {}
        for key, value, _, _, header in self.records:
            if value is None:
                out.pop(key, None)
            else:
                out[key] = (value, header)
        return out

    def by_time(self, key: bytes) -> dict[int, Version]:
        """The key's versions by timestamp: of one timestamp, the last record; a record
        older than the cutoff as it arrives (stream time of the records before it, less
        the retention) is not in the history."""
        out: dict[int, Version] = {}
        stream_time = -(2**63)
        for k, value, offset, ts, _ in self.records:
            if k == key and ts >= stream_time - HISTORY_MS:
                out[ts] = Version(value, offset, ts)
            stream_time = max(stream_time, ts)
        return out

    def as_of(self, key: bytes, at: int) -> Version | None:
        versions = self.by_time(key)
        before = [t for t in versions if t <= at]
        return versions[max(before)] if before else None

    def kept(self, key: bytes) -> list[Version]:
        """Every version after the cutoff, and the one valid at it unless a delete."""
        cutoff = self.cutoff
        versions = self.by_time(key)
        out = [versions[t] for t in sorted(versions) if t > cutoff]
        valid = self.as_of(key, cutoff)
        return ([valid] if valid is not None and valid.value is not None else []) + out

    def index(self, name: str) -> list[tuple[bytes, bytes]]:
        """(encoded value + key, value) of every current row under index `name`, in order."""
        out = set()
        for key, (value, header) in self.rows().items():
            got = header.get(name)
            for v in got if isinstance(got, list) else ([] if got is None else [got]):
                out.add((ix.encode_value(v) + key, value))
        return sorted(out)


@pytest.fixture(params=["memory", "rocksdb", "rocksdb-cached"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _open(kind: str, path: Path, views: Views = VIEWS) -> PartitionStore:
    return open_store(
        "memory" if kind == "memory" else "rocksdb",
        path,
        1 << 20 if kind == "rocksdb-cached" else 0,
        views,
    )


_dirs = itertools.count()


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=batches, reopen=st.lists(st.booleans(), min_size=8, max_size=8))
def test_history_and_indexes_match_the_model(
    kind: str, tmp_path: Path, batches: list, reopen: list[bool]
) -> None:
    path = tmp_path / f"s{next(_dirs)}"
    store = _open(kind, path)
    model = Model()
    try:
        for batch, again in zip(batches, reopen, strict=False):
            store.apply([model.add(*r) for r in batch])
            if again and kind != "memory":  # a restart: what is on disk is all there is
                store.close()
                store = _open(kind, path)
            check(store, model)
    finally:
        store.close()


def check(store: PartitionStore, model: Model) -> None:
    cutoff = model.cutoff
    assert store.history_floor == cutoff
    for key in KEYS:
        assert store.versions(key, -(2**62), 2**62, 10_000) == model.kept(key), key
        for at in range(cutoff, cutoff + HISTORY_MS + 3, 7):
            # a delete and no version read alike: the key had no value then
            assert _live(store.as_of(key, at)) == _live(model.as_of(key, at)), (key, at)
    for at in range(cutoff, cutoff + HISTORY_MS + 3, 11):
        want = []
        for key in sorted(KEYS):
            v = model.as_of(key, at)
            if v is not None and v.value is not None:
                want.append((key, v))
        assert store.scan_as_of(None, None, at, 10_000) == want
        assert (
            store.scan_as_of(b"a", b"b", at, 1) == [kv for kv in want if b"a" <= kv[0] < b"b"][:1]
        )
    for name in ("train", "stop"):
        got = [(c, r.value) for c, r in store.index_scan(name, None, None, 10_000)]
        assert got == model.index(name)
        lookup = ix.encode_value(1)
        end = lookup[:-1] + bytes([lookup[-1] + 1])
        assert [c for c, _ in store.index_scan(name, lookup, end, 10_000)] == [
            c for c, _ in model.index(name) if c.startswith(lookup)
        ]


def _live(v: Version | None) -> Version | None:
    return v if v is not None and v.value is not None else None


def test_a_store_opened_for_other_views_starts_over(tmp_path: Path) -> None:
    store = _open("rocksdb", tmp_path / "p")
    store.apply([Write(b"k", b"v", 0, 10)])
    store.close()
    same = _open("rocksdb", tmp_path / "p")
    assert same.applied_offset == 0 and same.as_of(b"k", 10) == Version(b"v", 0, 10)
    same.close()
    other = _open("rocksdb", tmp_path / "p", Views(HISTORY_MS, ("train",)))
    assert other.applied_offset == -1 and other.get(b"k") is None
    other.close()


def test_history_stays_bounded_as_time_passes(kind: str, tmp_path: Path) -> None:
    """Many versions of few keys: about one retention's worth stays, and a key deleted
    longer ago than the retention is gone from the history."""
    store = _open(kind, tmp_path / "p", Views(100, ()))
    store.apply([Write(b"gone", b"v", 0, 0), Write(b"gone", None, 1, 10)])
    offset = 2
    for t in range(20, 20_000, 10):
        store.apply([Write(b"k%d" % (t % 7), b"v", offset, t)])
        offset += 1
    assert store.versions(b"gone", -(2**62), 2**62, 10) == []
    per_key = [len(store.versions(b"k%d" % i, -(2**62), 2**62, 10_000)) for i in range(7)]
    # written every 70 ms: at most two inside the 100 ms, and the one valid at the cutoff
    assert all(n <= 3 for n in per_key), per_key
    store.close()


# -- the index value encoding -----------------------------------------------------------
scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)


def _order(v: Any) -> tuple[int, Any]:
    return (1, v.encode()) if isinstance(v, str) else (0, Fraction(v))


@given(a=scalars, b=scalars)
def test_encoded_index_values_sort_as_the_values_do(a: Any, b: Any) -> None:
    ea, eb = ix.encode_value(a), ix.encode_value(b)
    assert (ea < eb) == (_order(a) < _order(b))
    assert (ea == eb) == (_order(a) == _order(b))
    value, end = ix.decode_value(ea + b"key")
    assert end == len(ea) and _order(value) == _order(a)
    assert ix.split(ea + b"row") == (value, b"row")


@pytest.mark.parametrize(
    "v", [True, False, float("nan"), float("inf"), {"a": 1}, b"x", 2**63, "x" * 2000]
)
def test_values_outside_the_contract_are_refused(v: Any) -> None:
    with pytest.raises(ix.BadIndex):
        ix.encode_value(v)
    with pytest.raises(ix.BadIndex):
        ix.encode_header({"n": v})


def test_header_contract() -> None:
    raw = ix.encode_header({"train": "IC 1", "stops": ["Bern", "Bern", 3], "none": None})
    assert ix.entries(raw, ["stops"]) == tuple(
        sorted({ix.name_prefix("stops") + ix.encode_value(v) for v in ("Bern", 3)})
    )
    assert ix.entries(raw, ["other"]) == ()
    assert ix.entries(None, ["train"]) == ()
    for bad in (b"[1]", b"not json", b'{"t": {"a": 1}}', b'{"t": [[1]]}', b'{"t": true}'):
        with pytest.raises(ix.BadIndex):
            ix.entries(bad, ["t"])
    with pytest.raises(ix.BadIndex):
        ix.encode_header({"bad name/": 1})
    assert ix.parse_text("12") == 12 and ix.parse_text('"12"') == "12"
    assert ix.parse_text("IC 512") == "IC 512" and ix.parse_text("true") == "true"
    assert ix.parse_text("1.5") == 1.5
