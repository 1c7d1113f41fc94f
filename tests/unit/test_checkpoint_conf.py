"""What a local tablecast session sets for its checkpoint files (the session itself is
tested with real Spark in tests/integration/test_pipeline_checkpoints.py)."""

from __future__ import annotations

import os

from tablecast.pipeline.run import checkpoints as cp


def test_a_session_checkpoints_through_tablecasts_file_system_with_its_jar() -> None:
    conf = cp.session_conf("/jars/tablecast-hadoop.jar")
    assert conf == {
        "spark.hadoop.fs.file.impl": cp.UNCHECKED_LOCAL_FS,
        "spark.hadoop.fs.file.impl.disable.cache": "true",
        "spark.driver.extraClassPath": "/jars/tablecast-hadoop.jar",
    }


def test_without_the_jar_hadoops_local_file_system_stays() -> None:
    # not the raw one: RocksDB's snapshot upload casts file:// to a LocalFileSystem
    assert cp.session_conf(None) == {}
    assert cp.session_conf(None, {"spark.x": "1"}) == {"spark.x": "1"}


def test_the_callers_settings_win_and_its_class_path_is_kept() -> None:
    given = {"spark.driver.extraClassPath": "/a.jar", "spark.x": "1"}
    conf = cp.session_conf("/t.jar", given)
    assert conf["spark.driver.extraClassPath"] == os.pathsep.join(["/a.jar", "/t.jar"])
    assert conf["spark.x"] == "1"
    assert conf["spark.hadoop.fs.file.impl"] == cp.UNCHECKED_LOCAL_FS
    # a file system the caller chose is theirs: nothing of ours is added
    mine = {"spark.hadoop.fs.file.impl": "org.example.Fs"}
    assert cp.session_conf("/t.jar", mine) == mine
