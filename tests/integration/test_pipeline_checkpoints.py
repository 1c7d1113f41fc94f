"""Local checkpoints go through a local file system without checksums, one rename per file
(tablecast.pipeline.run.checkpoints); other locations keep Spark's default manager.
Recovery from them after kill -9 is tested in test_pipeline_restart.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tablecast as tc
from tablecast.pipeline.run import checkpoints

from .test_pipeline_support import read_table, running_app

STR = tc.serde.string()


def test_a_stateful_app_checkpoints_locally_with_one_rename_per_file(
    bootstrap: str, spark: Any, tmp_path_factory: Any
) -> None:
    def build(app: tc.App, topic: str) -> None:
        rows = app.table(topic, key=tc.serde.string(), value=tc.serde.json())
        rows.group_by(lambda k, v: (v["g"], 1), value=tc.serde.long()).reduce(
            lambda a, b: a + b, lambda a, b: a - b
        ).materialize("sizes")

    with running_app(bootstrap, spark, tmp_path_factory, "ckpt", build) as run:
        assert spark.conf.get(checkpoints.MANAGER_KEY) in checkpoints.MANAGERS
        run.feed(bootstrap, [(f"k{i}", {"g": f"g{i % 3}"}) for i in range(30)])
        run.feed(bootstrap, [(f"k{i}", {"g": "g0"}) for i in range(10)])
        sizes = read_table(bootstrap, f"{run.app.id}.table.sizes", STR, tc.serde.long())
        # k1, k4, k7 (from g1) and k2, k5, k8 (from g2) moved to g0
        assert sizes == {"g0": 16, "g1": 7, "g2": 7}
        root = Path(run.app.resolve_checkpoint_dir())
        written = [p for p in root.rglob("*") if p.is_file()]
        # offsets and commits of both queries, and the state stores' changelogs
        assert any(p.parent.name == "commits" for p in written)
        assert any(p.suffix == ".changelog" for p in written)
        # no checksum side files: each file was written once and renamed once
        assert [p for p in written if p.suffix == ".crc"] == []
        # and no temporary file was left behind
        assert [p for p in written if p.name.endswith(".tmp")] == []


def test_a_remote_checkpoint_location_keeps_sparks_default_manager(spark: Any) -> None:
    assert checkpoints.choose_manager(spark, "/tmp/somewhere") in checkpoints.MANAGERS
    assert checkpoints.choose_manager(spark, "hdfs://namenode:8020/tablecast/app") is None
    # the manager set for a local App before is not carried over to this one
    assert spark.conf.get(checkpoints.MANAGER_KEY, None) is None
    assert checkpoints.choose_manager(spark, "file:///tmp/somewhere") in checkpoints.MANAGERS


def test_rocksdb_state_snapshots_reach_a_local_checkpoint(
    bootstrap: str, spark: Any, tmp_path_factory: Any
) -> None:
    # without changelog checkpointing RocksDB uploads a snapshot at every commit, through
    # FileSystem.copyFromLocalFile: on Hadoop's raw local file system (tablecast's before)
    # that failed, so the query stopped here and snapshot maintenance never succeeded
    assert checkpoints.session_conf("x.jar")["spark.hadoop.fs.file.impl"] == (
        checkpoints.UNCHECKED_LOCAL_FS
    )
    key = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
    spark.conf.set(key, "false")

    def build(app: tc.App, topic: str) -> None:
        rows = app.table(topic, key=tc.serde.string(), value=tc.serde.json())
        rows.group_by(lambda k, v: (v["g"], 1), value=tc.serde.long()).reduce(
            lambda a, b: a + b, lambda a, b: a - b
        ).materialize("sizes")

    try:
        with running_app(bootstrap, spark, tmp_path_factory, "snap", build) as run:
            run.feed(bootstrap, [(f"k{i}", {"g": f"g{i % 2}"}) for i in range(20)])
            sizes = read_table(bootstrap, f"{run.app.id}.table.sizes", STR, tc.serde.long())
            assert sizes == {"g0": 10, "g1": 10}
            root = Path(run.app.resolve_checkpoint_dir())
            written = [p for p in root.rglob("*") if p.is_file()]
            assert any(p.suffix == ".zip" for p in written)  # the snapshots
            assert [p for p in written if p.suffix == ".crc"] == []
    finally:
        spark.conf.set(key, "true")
