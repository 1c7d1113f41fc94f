"""How a stateful query's state is laid out, recorded beside its checkpoint.

A per-key step hashes keys into buckets (:mod:`tablecast.pipeline.compile.keyed`)
and a windowed aggregation keeps one state per task (a partition of its input):
state written under one layout means nothing under another. So the layout a
query's state was first written with is recorded in ``tablecast-state.json``
in its checkpoint directory, and every later start uses it, whatever
``BUCKETS_PER_PARTITION`` says by then: changing that constant changes new
queries only. What cannot be carried over — another state format, or a window
query whose input gained partitions — is refused with what to do about it.
A grouped stream's count kept by Spark's own aggregation records engine
"spark"; a checkpoint whose count Python kept stays with Python (the runner
plans that chain so), since neither reads the other's state.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from tablecast.pipeline.compile.keyed import BUCKETS_PER_PARTITION

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FILE = "tablecast-state.json"
#: the state format the per-key steps write; 1: a pickled dict of the keys' states per bucket
FORMAT = 1
#: the buckets per partition of the tablecast versions that recorded no layout
LEGACY_BUCKETS_PER_PARTITION = 16


class LayoutError(RuntimeError):
    """A checkpoint's state cannot be read with this App's layout."""


#: whose state a query keeps: the per-key Python steps', or Spark's own aggregation's
PYTHON, SPARK = "python", "spark"


@dataclass(frozen=True)
class Layout:
    format: int
    buckets: int
    #: the input's partitions (a windowed aggregation's tasks)
    partitions: int
    #: PYTHON or SPARK (layouts recorded before there was a choice: PYTHON)
    engine: str = PYTHON


def local_path(location: str) -> Path | None:
    """A checkpoint location as a local path: a plain path or a ``file:`` URI; None for
    other file systems (hdfs://, s3a://…), which only Spark reads."""
    parsed = urlparse(location)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if len(parsed.scheme) <= 1:  # none, or a Windows drive letter
        return Path(location)
    return None


class Files:
    """Small files under a checkpoint location: local ones directly, others through
    Spark's Hadoop file system (hdfs://, s3a://, ...)."""

    def __init__(self, spark: SparkSession | None = None) -> None:
        self.spark = spark

    def _hadoop(self, location: str) -> tuple[Any, Any]:
        assert self.spark is not None, f"{location}: a remote checkpoint needs Spark"
        jvm = self.spark._jvm  # type: ignore[attr-defined]
        path = jvm.org.apache.hadoop.fs.Path(location)
        return path, path.getFileSystem(self.spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]

    def read(self, location: str) -> bytes | None:
        local = local_path(location)
        if local is not None:
            return local.read_bytes() if local.exists() else None
        path, fs = self._hadoop(location)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            jvm = self.spark._jvm  # type: ignore[union-attr]
            return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def exists(self, location: str) -> bool:
        local = local_path(location)
        if local is not None:
            return local.exists()
        path, fs = self._hadoop(location)
        return bool(fs.exists(path))

    def write(self, location: str, data: bytes) -> None:
        local = local_path(location)
        if local is not None:
            local.parent.mkdir(parents=True, exist_ok=True)
            tmp = local.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(local)
            return
        path, fs = self._hadoop(location)
        out = fs.create(path, True)
        try:
            out.write(bytearray(data))
        finally:
            out.close()


def _recorded(files: Files, checkpoint: str, partitions: int) -> tuple[Layout | None, bool]:
    """The layout the checkpoint's state was written with (None: it has no state yet),
    and whether its file records it."""
    stored = files.read(f"{checkpoint.rstrip('/')}/{FILE}")
    if stored is not None:
        return Layout(**json.loads(stored)), True
    if files.exists(f"{checkpoint.rstrip('/')}/offsets"):
        # state from a tablecast that recorded no layout: its fixed bucket count, Python's
        return Layout(FORMAT, LEGACY_BUCKETS_PER_PARTITION * partitions, partitions), False
    return None, False


def stored_engine(files: Files, checkpoint: str) -> str | None:
    """Whose state the query whose checkpoint is `checkpoint` keeps (None: it has none yet)."""
    layout, _ = _recorded(files, checkpoint, 0)
    return None if layout is None else layout.engine


def settle(
    files: Files,
    checkpoint: str,
    partitions: int,
    query: str,
    windowed: bool,
    engine: str = PYTHON,
) -> Layout:
    """The layout of the stateful query whose checkpoint is `checkpoint` (recorded there
    on its first start), given its input's `partitions` now and the `engine` planned."""
    layout, in_file = _recorded(files, checkpoint, partitions)
    if layout is None:
        layout = Layout(FORMAT, BUCKETS_PER_PARTITION * partitions, partitions, engine)
    if layout.engine != engine:
        raise LayoutError(
            f"query {query}: its state in {checkpoint} was kept by {layout.engine}, this "
            f"plan keeps it in {engine}. Delete that checkpoint directory to rebuild the "
            "state from the input topics, or run the tablecast version that wrote it."
        )
    if layout.format != FORMAT:
        raise LayoutError(
            f"query {query}: its state in {checkpoint} has format {layout.format}, this "
            f"tablecast reads format {FORMAT}. Delete that checkpoint directory to rebuild "
            "the state from the input topics (they must still hold all of it), or run the "
            "tablecast version that wrote it."
        )
    if windowed and layout.partitions != partitions:
        raise LayoutError(
            f"query {query}: its window state in {checkpoint} is kept per input partition, "
            f"{layout.partitions} of them, and the input has {partitions} now. Delete that "
            "checkpoint directory to rebuild the windows from the input topics."
        )
    if not in_file:
        files.write(f"{checkpoint.rstrip('/')}/{FILE}", json.dumps(asdict(layout)).encode())
    return layout
