"""The retraction's column-wise bucket runner (keyed.latest_bucketed) against the row-wise
one (keyed.bucketed): same output rows in the same order, same state, on batches with
bad rows, null keys, failing selectors, several Arrow chunks and rows out of order."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from tablecast.pipeline.compile import envelope as env
from tablecast.pipeline.compile import keyed
from tablecast.pipeline.compile.aggregate import retract
from tablecast.pipeline.plan.wire import pack_pair

OUT = env.schema(env.OLD, env.RID, env.SRC).fieldNames()


class GroupState:
    """What the bucket functions use of Spark's GroupState (no Spark here: the same
    functions run under it in the integration tests)."""

    def __init__(self, blob: bytes | None) -> None:
        self.blob = blob

    @property
    def exists(self) -> bool:
        return self.blob is not None

    @property
    def get(self) -> tuple[bytes]:
        assert self.blob is not None
        return (self.blob,)

    def update(self, value: tuple[bytes]) -> None:
        self.blob = value[0]

    def remove(self) -> None:
        self.blob = None


def select(kb: bytes | None, vb: bytes | None) -> tuple[bytes | None, str | None]:
    # a value ending in "!" fails; "-" selects no group (the row leaves the aggregation)
    assert vb is not None
    if vb.endswith((b"!", b"}")):
        return None, f"select_group: ValueError: {vb!r}"
    if vb.endswith(b"-"):
        return None, None
    return pack_pair(b"g" + vb[:1], vb), None


row_st = st.tuples(
    st.sampled_from([b"a", b"b", b"c", b"d", None]),  # key (None: a null key)
    st.sampled_from([b"1", b"2", b"3", b"4!", b"5-", b"6", b"7}"]),  # 7}: not JSON
    st.sampled_from([None, None, None, None, "value is not json"]),
    st.integers(0, 2),  # partition
)


def frames(rows: list[tuple[Any, ...]], chunks: int, selecting: bool = True) -> list[pd.DataFrame]:
    cells = []
    for off, (k, v, err, part) in enumerate(rows):
        if not selecting:  # selected upstream: the value is the packed selection or null
            v = select(k, v)[0]
        cells.append((k, v, err, None, None, None, part, off, 0, 1000 + off, 7))
    cells.reverse()  # Spark promises no order within a group
    pdf = pd.DataFrame(cells, columns=[*env.COLUMNS, keyed.BUCKET])
    size = max(1, len(cells) // chunks)
    return [pdf.iloc[i : i + size].reset_index(drop=True) for i in range(0, len(cells), size)]


def run(fn: Any, batches: list[list[pd.DataFrame]]) -> tuple[list[list[Any]], Any]:
    state = GroupState(None)
    outs = []
    for pdfs in batches:
        got = list(fn((7,), iter(pdfs), state))
        outs.append([] if not got else got[0].values.tolist())
    return outs, None if state.blob is None else pickle.loads(state.blob)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(row_st, max_size=25), min_size=1, max_size=4),
    st.integers(1, 3),
    st.booleans(),
    st.booleans(),
)
def test_latest_bucketed_matches_bucketed(
    batches: list[list[tuple[Any, ...]]], chunks: int, selecting: bool, check_json: bool
) -> None:
    core = retract(select if selecting else None, "input", check_json and selecting)
    assert isinstance(core, keyed.LatestFirst)
    given_batches = [frames(rows, chunks, selecting) for rows in batches if rows]
    assert run(keyed.latest_bucketed(core, OUT), given_batches) == run(
        keyed.bucketed(core, OUT), given_batches
    )


def test_latest_bucketed_selects_only_what_it_must() -> None:
    """A key's superseded records are never built or selected; a failing latest one is
    dead-lettered and the one before it is selected."""
    calls: list[bytes] = []

    def counting(kb: bytes | None, vb: bytes | None) -> tuple[bytes | None, str | None]:
        assert vb is not None
        calls.append(vb)
        return select(kb, vb)

    rows = [(b"a", b"1", None, 0), (b"a", b"2", None, 0), (b"a", b"3", None, 1)]
    rows += [(b"b", b"1", None, 0), (b"b", b"4!", None, 1)]
    (out,), store = run(keyed.latest_bucketed(retract(counting, "input"), OUT), [frames(rows, 2)])
    assert calls == [b"3", b"4!", b"1"]
    assert [(r[0], r[1], r[2]) for r in out] == [
        (b"g3", b"3", None),
        (b"b", b"4!", "select_group: ValueError: b'4!'"),
        (b"g1", b"1", None),
    ]
    assert out[1][5] == "input"  # a lean row gets its topic back when dead-lettered
    assert set(store) == {b"a", b"b"}


def test_every_record_is_checked_as_json_and_refused_ones_keep_their_bytes() -> None:
    """With check_json (the JVM left the values unchecked), a superseded record that is
    not JSON is dead-lettered too, with its raw bytes and topic; the row's latest good
    record still makes its change."""
    rows = [(b"a", b"1", None, 0), (b"a", b"7}", None, 0), (b"a", b"3", None, 0)]
    rows += [(b"b", b"2", None, 1), (b"b", b"7}", "key is not string", 1)]
    core = retract(select, "input", check_json=True)
    (out,), _ = run(keyed.latest_bucketed(core, OUT), [frames(rows, 1)])
    assert [(r[0], r[2], r[3], r[4], r[5]) for r in out] == [
        (b"a", "value is not json", b"a", b"7}", "input"),
        (b"g3", None, None, None, "input"),
        (b"b", "key is not string", None, None, None),  # the JVM's verdict stands
        (b"g2", None, None, None, "input"),
    ]
    (plain,), _ = run(keyed.latest_bucketed(retract(select, "input"), OUT), [frames(rows, 1)])
    assert [r[0] for r in plain] == [b"g3", b"b", b"g2"]  # unchecked: nothing refused
