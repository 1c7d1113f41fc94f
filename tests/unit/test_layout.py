"""A stateful query keeps the state layout its checkpoint started with (run/layout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tablecast.pipeline.compile import keyed
from tablecast.pipeline.run.layout import (
    FILE,
    PYTHON,
    SPARK,
    Files,
    LayoutError,
    settle,
    stored_engine,
)


def test_a_new_query_records_its_layout_and_keeps_it_when_the_constant_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = str(tmp_path / "q")
    first = settle(Files(), ck, 4, "q", windowed=False)
    assert first.buckets == keyed.BUCKETS_PER_PARTITION * 4
    assert json.loads((tmp_path / "q" / FILE).read_text())["buckets"] == first.buckets
    import tablecast.pipeline.run.layout as layout

    monkeypatch.setattr(layout, "BUCKETS_PER_PARTITION", 64)
    assert settle(Files(), ck, 4, "q", windowed=False) == first  # the checkpoint's count
    assert settle(Files(), str(tmp_path / "fresh"), 4, "q", windowed=False).buckets == 256


def test_a_checkpoint_from_before_layouts_gets_the_old_fixed_count(tmp_path: Path) -> None:
    (tmp_path / "q" / "offsets").mkdir(parents=True)
    assert settle(Files(), f"file://{tmp_path}/q", 3, "q", windowed=False).buckets == 48
    assert (tmp_path / "q" / FILE).exists()


def test_what_cannot_be_carried_over_is_refused_with_what_to_do(tmp_path: Path) -> None:
    ck = tmp_path / "w"
    settle(Files(), str(ck), 3, "shop.w", windowed=True)
    with pytest.raises(LayoutError, match=r"input has 4 now\. Delete that checkpoint"):
        settle(Files(), str(ck), 4, "shop.w", windowed=True)
    (ck / FILE).write_text(json.dumps({"format": 99, "buckets": 3, "partitions": 3}))
    with pytest.raises(LayoutError, match="has format 99"):
        settle(Files(), str(ck), 3, "shop.w", windowed=True)


def test_a_checkpoint_remembers_whose_state_it_holds(tmp_path: Path) -> None:
    """A count kept by Python (recorded, or from before layouts) stays Python's: the runner
    asks stored_engine() and plans the chain so; a mismatch is refused, not misread."""
    files = Files()
    assert stored_engine(files, str(tmp_path / "new")) is None  # no state yet: either
    settle(files, str(tmp_path / "s"), 2, "a.counts", windowed=False, engine=SPARK)
    assert stored_engine(files, str(tmp_path / "s")) == SPARK
    settle(files, str(tmp_path / "p"), 2, "a.counts", windowed=False)
    assert stored_engine(files, str(tmp_path / "p")) == PYTHON
    (tmp_path / "old" / "offsets").mkdir(parents=True)
    assert stored_engine(files, str(tmp_path / "old")) == PYTHON
    # a layout file from before engines were recorded reads as Python's
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / FILE).write_text(json.dumps({"format": 1, "buckets": 8, "partitions": 2}))
    assert stored_engine(files, str(tmp_path / "v1")) == PYTHON
    with pytest.raises(LayoutError, match="kept by python, this plan keeps it in spark"):
        settle(files, str(tmp_path / "p"), 2, "a.counts", windowed=False, engine=SPARK)


def test_a_count_python_kept_in_a_checkpoint_is_planned_in_python_again(tmp_path: Path) -> None:
    import tablecast as tc
    from tablecast.pipeline.run.pipeline import _plan

    app = tc.App("a")
    app.stream("ev").group_by_key().count().materialize("counts")
    (out,) = app.outputs()
    fresh = _plan(app, out, Files(), str(tmp_path))
    assert [(q.name, [s.what for s in q.steps]) for q in fresh] == [
        ("a.counts.dlq", []),
        ("a.counts", ["spark_aggregate"]),
    ]
    settle(Files(), str(tmp_path / "a.counts"), 1, "a.counts", windowed=False)  # Python's
    kept = _plan(app, out, Files(), str(tmp_path))
    assert [(q.name, [s.what for s in q.steps]) for q in kept] == [
        ("a.counts", ["stream_aggregate"])
    ]
