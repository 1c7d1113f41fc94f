"""materialize(history=, indexes=): checked when the App is defined, announced in the catalog
entry as the nodes expect it (the catalog's own check judges), and the callable path's header
is the contract's (docs/table-topics.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest

import tablecast as tc
from tablecast.contract.index_codec import BadIndex, decode_header
from tablecast.contract.table_info import TableInfo
from tablecast.pipeline.compile.index import header_of
from tablecast.pipeline.plan import queries as planner
from tablecast.pipeline.run.pipeline import table_info
from tablecast.pipeline.run.trigger import blockers


def entry(app: tc.App, name: str) -> TableInfo:
    """The entry the pipeline publishes for `name`, passed through the nodes' check."""
    out = app.materialized[name]
    topic = planner.plan_output(app.id, out, list(app.materialized.values()))[-1].output.topic
    info = table_info(out, topic, 3)
    return TableInfo.checked(name, info.to_json())


def test_the_catalog_entry_carries_history_and_index_names() -> None:
    from pyspark.sql import functions as F

    app = tc.App("shop")
    rows = app.table("bookings")
    rows.materialize(
        "bookings",
        history=timedelta(hours=2),
        indexes={"train": lambda k, v: v["train"], "stops.all": F.col("value.stops")},
    )
    rows.materialize("plain")
    app.global_table("trains").materialize("trains", history=timedelta(seconds=1))
    info = entry(app, "bookings")
    assert info.extra == {"history_ms": 7_200_000, "indexes": ["train", "stops.all"]}
    assert info.views.history_ms == 7_200_000 and info.indexes == ("train", "stops.all")
    assert entry(app, "plain").extra == {}
    assert entry(app, "trains").extra == {"history_ms": 1000} and entry(app, "trains").is_global
    (q,) = planner.plan_output(app.id, app.materialized["bookings"], [])
    assert [n for n, _ in q.indexes] == ["train", "stops.all"]
    assert "history_ms=7200000" in app.explain() and "'train':" in app.explain()
    # the callable index runs in a Python UDF, which Real-time Mode cannot run
    assert [r for r in blockers(q) if "index" in r] == [
        "Python index 'train' test_the_catalog_entry_carries_history_and_index_names.<locals>."
        "<lambda> (ArrowEvalPythonExec)"
    ]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"history": timedelta(0)}, ValueError),
        ({"history": timedelta(seconds=-1)}, ValueError),
        ({"history": 60}, TypeError),
        ({"indexes": {"": lambda k, v: 1}}, ValueError),
        ({"indexes": {"a/b": lambda k, v: 1}}, ValueError),
        ({"indexes": {"x" * 65: lambda k, v: 1}}, ValueError),
        ({"indexes": {"a": "value.a"}}, TypeError),
        ({"indexes": [("a", lambda k, v: 1)]}, TypeError),
    ],
)
def test_bad_history_or_indexes_are_refused_at_definition(kwargs: Any, error: type) -> None:
    app = tc.App("a")
    with pytest.raises(error):
        app.table("t").materialize("t", **kwargs)
    assert app.materialized == {}


def test_window_tables_refuse_history_and_indexes() -> None:
    app = tc.App("a")
    counts = app.stream("ev").group_by_key().windowed_by(tc.windows.tumbling("1 minute")).count()
    with pytest.raises(ValueError, match="key-value tables only"):
        counts.materialize("w", history=timedelta(hours=1))
    with pytest.raises(ValueError, match="key-value tables only"):
        counts.materialize("w", indexes={"n": lambda k, v: v})
    counts.materialize("w")
    assert entry(app, "w").extra == {"size_ms": 60_000}


def test_callable_index_headers_follow_the_contract() -> None:
    fns = [
        ("train", lambda k, v: v["train"]),
        ("stops", lambda k, v: v["stops"]),
        ("n", lambda k, v: v.get("n")),
    ]
    raw = header_of(fns, "B1", {"train": "IC 1", "stops": ["Bern", None, "Biel"], "n": 2.5})
    assert raw is not None
    assert orjson.loads(raw) == {"train": "IC 1", "stops": ["Bern", "Biel"], "n": 2.5}
    assert decode_header(raw)["stops"] == ["Bern", "Biel"]
    # no value under any index: no header at all
    assert header_of(fns, "B1", {"train": None, "stops": [None]}) is None
    for refused in (True, float("nan"), {"a": 1}, [["x"]], "x" * 1025, 2**63):
        with pytest.raises(BadIndex):
            header_of([("i", lambda k, v, r=refused: r)], "B1", {})
