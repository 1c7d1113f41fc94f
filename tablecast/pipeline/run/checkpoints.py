"""Checkpoint files on a local disk, written without starting a process per file.

Spark writes every checkpoint file (offsets, commits, state-store changelogs)
to a temporary name and renames it into place. Its default manager renames
through Hadoop's FileContext, whose local file system asks for the link status
of both names, and Hadoop answers that by running ``readlink`` as a child
process (it has no native library here): 960 of them in 163 s of one group_by
benchmark (a JFR recording). Under a trickle of 400 records/s into a table
group_by (7 alternating rounds, each a run's median per micro-batch), the WAL
write took 138 ms with it and 18.5 ms without, the commit 108 and 20.5 ms, and a
whole stateful micro-batch 3.17 s and 2.43 s: 0.77x (interquartile range
0.67-0.80; its state-store changelogs are checkpoint files too).

For a local checkpoint location a local tablecast session therefore uses a local
file system without checksums (no ``.crc`` side files: the default manager writes
checkpoint files without them too, and with them every rename would be two
renames, which a kill -9 could split, leaving a file whose checksum does not
match) and Spark's FileSystem-based checkpoint manager over it: write to a
temporary name, then one ``rename(2)``, which is atomic on a local disk and
replaces an existing file in one step. A file that must not exist yet is
checked first, as FileContext does on a local disk. Other locations (hdfs://,
s3a://...) keep Spark's default.

That file system is tablecast's own (``tablecast/_jvm/hadoop``), not Hadoop's raw
one, which tablecast used before: RocksDB uploads its state snapshots with
``FileSystem.copyFromLocalFile``, which casts the file:// file system to a
LocalFileSystem, and the raw one is not: every snapshot failed ("Ignoring error
while performing snapshot maintenance"), so a restart replayed every state
changelog since the query began and none was ever cleaned up. Sessions on a
cluster master, under ``spark-submit``, or without a JDK to compile it keep
Hadoop's default (checksummed) local file system and Spark's default manager.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from tablecast.pipeline.run.layout import local_path

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

RAW_LOCAL_FS = "org.apache.hadoop.fs.RawLocalFileSystem"
#: tablecast's local file system without checksums (tablecast/_jvm/hadoop): unlike the
#: raw one, a LocalFileSystem, which RocksDB's snapshot upload casts file:// to
UNCHECKED_LOCAL_FS = "tablecast.hadoop.UncheckedLocalFileSystem"
UNCHECKED = (RAW_LOCAL_FS, UNCHECKED_LOCAL_FS)
CLASS_PATH = "spark.driver.extraClassPath"


def session_conf(own_jar: str | None, given: dict[str, str] | None = None) -> dict[str, str]:
    """What a local tablecast session sets before Spark starts, given tablecast's Hadoop
    jar (None: no JDK compiled it) and the settings the caller `given`, which win: the
    file:// scheme is its local file system without checksums, on the driver's class
    path (a local master's executors are the driver; a class path the caller sets is
    kept, ours added to it), and no file system object made with other settings is
    reused. Without the jar, nothing: Hadoop's raw local file system would break
    RocksDB's snapshots."""
    given = given or {}
    if own_jar is None or "spark.hadoop.fs.file.impl" in given:
        return dict(given)
    path = [p for p in given.get(CLASS_PATH, "").split(os.pathsep) if p]
    return {
        "spark.hadoop.fs.file.impl": UNCHECKED_LOCAL_FS,
        "spark.hadoop.fs.file.impl.disable.cache": "true",
        **given,
        CLASS_PATH: os.pathsep.join([*path, own_jar]),
    }


MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
#: Spark moved the class into a package of its own in 4.x
MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)


def choose_manager(spark: SparkSession, location: str) -> str | None:
    """Set the session's checkpoint manager for an App checkpointing at `location`, before
    its queries start (each query keeps the setting it started with); returns the class
    chosen, None for Spark's default."""
    chosen = _fs_manager(spark) if local_path(location) is not None else None
    if chosen is not None:
        spark.conf.set(MANAGER_KEY, chosen)
    elif spark.conf.get(MANAGER_KEY, None) in MANAGERS:
        spark.conf.unset(MANAGER_KEY)  # set for another App of this session: not for this one
    return chosen


def _fs_manager(spark: SparkSession) -> str | None:
    """The FileSystem-based manager, if this Spark has one and its file:// file system is
    the raw one (no checksum files)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), conf)
    if fs.getClass().getName() not in UNCHECKED:
        return None
    for name in MANAGERS:
        try:
            jvm.java.lang.Class.forName(name)
        except Exception:  # py4j raises Py4JJavaError for ClassNotFoundException
            continue
        return name
    log.info("no FileSystem-based checkpoint manager in this Spark: its default stays")
    return None
