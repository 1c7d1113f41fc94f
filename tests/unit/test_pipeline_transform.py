"""transform_values and repartition without Spark: the planner's cuts, explain, and the
per-key transform step against the reference model."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tablecast as tc
from tablecast.pipeline.compile.keyed import KeyState
from tablecast.pipeline.compile.transform import ValueState, transform_values
from tablecast.pipeline.plan import queries as planner
from tests import reference_model as ref

STR, LONG, JSON = tc.serde.string(), tc.serde.long(), tc.serde.json()


def running_total(k: str, v: int, state: Any) -> dict[str, Any]:
    """Order-dependent on purpose: the last three values travel in the state."""
    s = state.get({"total": 0, "last": []})
    if v == 13:
        s["total"] = -1  # changed, then the record fails: the change must not stick
        raise ValueError("unlucky")
    s = {"total": s["total"] + v, "last": [*s["last"], v][-3:]}
    state.set(None if v == 0 else s)  # a 0 forgets the key's state
    return None if v == 7 else s


def cut_at(name: str, fn: Any = running_total) -> tuple[tc.App, list[planner.Query]]:
    app = tc.App("pos")
    ev = app.stream("ev", value=LONG)
    ev.repartition(8, lambda k, v, n: 1).transform_values(fn).to_table().materialize(name)
    out = app.materialized[name]
    return app, planner.plan_output(app.id, out, [out])


def test_repartition_cuts_the_query_at_an_internal_topic() -> None:
    app, (first, second) = cut_at("points")
    assert first.output.topic == "pos.repartition.points-0" and first.output.role == "through"
    assert first.partitions == 8 and first.partitioner is not None and first.writes_batches
    assert second.reads_batches  # records carry batch and record ids: copies are dropped
    assert first.output.key == STR and first.output.value == LONG
    assert second.input == first.output and not second.input.external
    assert [s.what for s in second.steps] == ["transform_values", "op"] and second.stateful
    assert second.partitioner is None and second.output.topic == "pos.table.points"
    text = app.explain()
    assert "writes pos.repartition.points-0 [through, 8 partitions, partitioner" in text
    assert "transform_values(running_total) [applyInPandasWithState by key" in text
    # without a per-key step after it, the topic is a plain Kafka sink's
    app.stream("ev").repartition().to_table().materialize("plain")
    plain = app.materialized["plain"]
    plain_first, plain_second = planner.plan_output(app.id, plain, [plain])
    assert not plain_first.writes_batches and not plain_second.reads_batches


def test_a_stateful_step_after_transform_values_goes_through_a_stream_changelog() -> None:
    app = tc.App("a")
    app.stream("ev").transform_values(running_total).group_by_key().count().materialize("n")
    first, second = planner.plan_output(app.id, app.materialized["n"], [])
    assert first.output.role == "changelog" and first.output.kind == "stream"
    assert [s.what for s in second.steps] == ["stream_aggregate"]


def test_dsl_checks_transform_values_and_repartition_arguments() -> None:
    from pyspark.sql import Column

    ev = tc.App("a").stream("ev")
    with pytest.raises(TypeError):
        ev.transform_values("not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ev.transform_values(Column.__new__(Column))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ev.repartition(0)
    with pytest.raises(TypeError):
        ev.repartition(partitioner=3)  # type: ignore[arg-type]


def rows_of(records: list[tuple[str | None, int]]) -> list[tuple[Any, ...]]:
    return [
        (None if k is None else k.encode(), LONG.serialize(v), None, b"rk", b"rv", "t", 0, i, 0, i)
        for i, (k, v) in enumerate(records)
    ]


KEYS = st.sampled_from(["a", "b", "c"])


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(KEYS, st.integers(0, 15)), max_size=12), max_size=4))
def test_transform_step_matches_the_reference_across_micro_batches(
    batches: list[list[tuple[str, int]]],
) -> None:
    core = transform_values(running_total, STR, LONG, JSON)
    store: dict[Any, Any] = {}
    got: list[tuple[str, Any]] = []
    failed: list[tuple[str, int]] = []
    for batch in batches:  # the state between calls is what the state store keeps
        for key in sorted({k for k, _ in batch}):
            mine = [(k, v) for k, v in batch if k == key]
            for row in core(key.encode(), rows_of(mine), KeyState(store, key.encode())):
                if row[2] is None:
                    got.append(
                        (row[0].decode(), None if row[1] is None else JSON.deserialize(row[1]))
                    )
                else:
                    assert row[2].startswith("transform_values: ValueError: unlucky")
                    assert row[3:5] == (b"rk", b"rv")  # dead-lettered as it was read
                    failed.append((key, LONG.deserialize(row[1])))
    history = [r for batch in batches for r in batch]
    want, want_failed = ref.transform_values(history, running_total)
    per_key = lambda rs: {k: [v for kk, v in rs if kk == k] for k in "abc"}  # noqa: E731
    assert per_key(got) == per_key(want)
    assert sorted(failed) == sorted(want_failed)


def test_transform_step_dead_letters_unencodable_states_and_null_keys() -> None:
    def bad_state(k: str, v: int, state: Any) -> int:
        state.set({1, 2} if v == 2 else v)
        return v

    core = transform_values(bad_state, STR, LONG, LONG)
    store: dict[Any, Any] = {}
    out = core(b"a", rows_of([("a", 1), ("a", 2), ("a", 3)]), KeyState(store, b"a"))
    assert [r[2] is None for r in out] == [True, False, True]
    assert "not JSON-able" in out[1][2]
    assert ValueState(store[b"a"][0]).get() == 3
    (null,) = core(None, rows_of([(None, 1)]), KeyState(store, None))
    assert null[2] == "transform_values: null key"


def test_copies_a_restarted_upstream_query_wrote_again_are_transformed_once() -> None:
    from tablecast.pipeline.compile.keyed import deduplicated

    core = deduplicated(transform_values(running_total, STR, LONG, JSON))
    store: dict[Any, Any] = {}

    def through(values: list[int], batch: int, first_offset: int) -> list[tuple[Any, ...]]:
        # as read from a repartition topic: envelope + (old, batch, rid, src); rid names
        # the source record
        rows = rows_of([("a", v) for v in values])
        return [
            (*row[:7], first_offset + i, 0, row[9], None, batch, b"src-%d" % v, None)
            for i, (v, row) in enumerate(zip(values, rows, strict=True))
        ]

    def totals(rows: list[tuple[Any, ...]]) -> list[int]:
        out = core(b"a", rows, KeyState(store, b"a"))
        return [JSON.deserialize(r[1])["total"] for r in out]

    assert totals(through([1, 2], batch=4, first_offset=0)) == [1, 3]
    # the restarted upstream batch 4 written again (new offsets), then batch 5
    again = [*through([1, 2], 4, 2), *through([3], 5, 4)]
    assert totals(again) == [6]
    # a late copy of batch 4 changes nothing; one record made two rows (seq 0, 1): both count
    split = through([4, 4], 6, 5)
    split[1] = (*split[1][:8], 1, *split[1][9:])
    assert totals([*through([1], 4, 7), *split]) == [10, 14]
