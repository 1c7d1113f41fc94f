"""Starting Spark for a pipeline: Kafka connector on ``spark.jars``, RocksDB state, and,
on a cluster, tablecast itself shipped to the executors.

Local mode (the default, ``local[2]``) binds the driver to loopback. On a
cluster (``spark://``, ``yarn``, ``k8s://``) executors run elsewhere and must
reach the driver and import tablecast's code: the driver advertises
``TABLECAST_DRIVER_HOST`` (default loopback, right only for a cluster on this
machine), and the tablecast package is zipped at start and added with
``addPyFile``, so workers need PySpark's own Python dependencies and
tablecast's few runtime imports (see :data:`EXECUTOR_IMPORTS`), not tablecast.
Under ``spark-submit`` the launcher has set the driver's address and shipped
``--py-files`` already, and nothing of that is overridden.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from tablecast import jvm
from tablecast.pipeline.run import checkpoints

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LOOPBACK = "127.0.0.1"
#: how long a real-time shuffle writer may hold a partly filled buffer (see session())
STREAMING_SHUFFLE_WAIT_MS = "5"

#: what the executors' Python workers import for tablecast's callables, beyond
#: tablecast itself: PySpark's pandas/pyarrow/numpy, JSON, and Avro if used
EXECUTOR_IMPORTS = ("pandas", "pyarrow", "numpy", "orjson", "fastavro (Avro serdes only)")

_shipped: dict[str, str] = {}


def is_local(master: str) -> bool:
    return master.startswith("local")


def under_spark_submit() -> bool:
    """Whether this driver was launched by spark-submit (which set the driver's conf)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session(
    app_name: str,
    master: str | None = None,
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession set up for tablecast (or the active one, with our settings applied)."""
    submitted = under_spark_submit()
    if not submitted:
        # Python workers must be this interpreter, which has pandas/pyarrow/grpc
        # (on a cluster: the same path on every worker, or PYSPARK_PYTHON set to theirs)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        # the driver would otherwise advertise the machine's outward address
        os.environ.setdefault("SPARK_LOCAL_IP", os.environ.get("TABLECAST_DRIVER_HOST", LOOPBACK))
    end_deferred_columns()
    from pyspark.sql import SparkSession

    if submitted:
        master = master or os.environ.get("TABLECAST_MASTER")
    else:
        master = master or os.environ.get("TABLECAST_MASTER") or "local[2]"
    log.info("starting Spark (%s) ...", master or "master from spark-submit")
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    if submitted:
        _check_submitted_jars()
    else:
        builder = builder.config("spark.jars", ",".join(str(p) for p in jvm.jars("spark-kafka")))
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "false")
        # a Column expression that fails on one record (a bad cast) must yield
        # null for it, not fail the query: bad records never stop the pipeline
        .config("spark.sql.ansi.enabled", "false")
        # a real-time query's shuffle (a count, a table group_by's fold) holds a partly
        # filled buffer this long before sending it on: Spark's 50 ms was most of a record's
        # way through such a query
        .config("spark.shuffle.streaming.networkBufferMaxWaitTimeMs", STREAMING_SHUFFLE_WAIT_MS)
        # RocksDB state commits upload a changelog, not a snapshot, per batch
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # PySpark records the Python call site of every DataFrame and Column call (four JVM
        # round trips each) for error messages; a pipeline's calls are tablecast's own
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
    )
    for k, v in driver_address(submitted).items():
        builder = builder.config(k, v)
    if not submitted and is_local(master or ""):  # checkpoint files without a process per rename
        own = jvm.hadoop_jar()
        conf = checkpoints.session_conf(None if own is None else str(own), conf)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("TABLECAST_SPARK_LOG_LEVEL", "WARN"))
    # shuffle partitions are tied to the topics' partitions per App; a shared
    # session (tests) gets the value of the App that starts last
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    if not is_local(spark.sparkContext.master):
        ship_package(spark)
    return spark


def shuffle_partitions(spark: SparkSession, partitions: int, realtime: bool) -> int:
    """How many partitions a new query's stateful steps shuffle into (a checkpoint keeps the
    count it started with): as many as its topics have, but on one machine (local[N]) no
    more than it runs tasks at once (:func:`machine_tasks`). Each shuffle partition is a
    task every micro-batch, its state store loaded and committed even when no key of the
    batch falls in it; in Real-time Mode each is a task for the whole batch, beside one per
    topic partition, and each of its state stores commits at every checkpoint."""
    if not is_local(spark.sparkContext.master):
        return partitions
    return max(1, min(partitions, machine_tasks(spark)))


def read_tasks(spark: SparkSession, realtime: bool) -> int:
    """How many tasks a new query's micro-batches read each topic in: on one machine no more
    than it runs at once (0: one per topic partition, Spark's way). A task per partition is
    scheduled every batch even when it reads nothing; a real-time query keeps one per
    partition, each polling for its whole batch."""
    if realtime or not is_local(spark.sparkContext.master):
        return 0
    return machine_tasks(spark)


def machine_tasks(spark: SparkSession) -> int:
    """Tasks a local session runs at once: its slots (local[N]), but no more than the cores
    this process may use. N may exceed them for Real-time Mode, whose tasks mostly wait for
    records; a micro-batch's tasks and a real-time shuffle's beyond the cores only take
    turns on them."""
    slots = spark.sparkContext.defaultParallelism
    return max(1, min(slots, len(os.sched_getaffinity(0))))


def timestamp_interceptor(spark: SparkSession) -> str | None:
    """The producer interceptor class that stamps each written record with the time of
    its input (see tablecast/_jvm/interceptors), if Spark's jars hold it."""
    if "tablecast-interceptors" in (spark.sparkContext.getConf().get("spark.jars") or ""):
        return jvm.TIMESTAMP_INTERCEPTOR
    log.warning(
        "Spark's jars lack tablecast's producer interceptor (python -m tablecast.jvm "
        "spark-kafka lists it): table records carry the time they were written, not the "
        "time of the input that produced them"
    )
    return None


def _check_submitted_jars() -> None:
    """spark-submit loaded the driver's classpath from its --jars already: jars added
    now would reach the executors but not the driver, so name what is missing."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    given = SparkConf().get("spark.jars", "") or ""
    if "spark-sql-kafka" not in given:
        log.warning(
            "spark-submit was given no Spark Kafka connector: pass --jars "
            "$(python -m tablecast.jvm spark-kafka) (the list of its jars)"
        )


def driver_address(submitted: bool) -> dict[str, str]:
    """spark.driver.host / bindAddress: loopback unless TABLECAST_DRIVER_HOST (and
    TABLECAST_DRIVER_BIND_ADDRESS, e.g. 0.0.0.0 in a container) say otherwise;
    nothing under spark-submit, whose --conf settings stand."""
    if submitted:
        return {}
    host = os.environ.get("TABLECAST_DRIVER_HOST") or LOOPBACK
    bind = os.environ.get("TABLECAST_DRIVER_BIND_ADDRESS") or host
    return {"spark.driver.host": host, "spark.driver.bindAddress": bind}


def package_zip(directory: Path) -> Path:
    """The tablecast package as a zip for executors' ``sys.path`` (its Python files only:
    the poms and examples stay behind)."""
    root = Path(__file__).resolve().parents[2]  # the tablecast package
    target = directory / "tablecast.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root.parent)
            if "__pycache__" in rel.parts or rel.parts[1] in ("_examples", "_jvm"):
                continue
            z.write(path, rel.as_posix())
    return target


def ship_package(spark: SparkSession) -> None:
    """Add tablecast to the executors' Python path, once per SparkContext."""
    sc = spark.sparkContext
    key = sc.applicationId
    if key in _shipped:
        return
    # this module's own path tells whether tablecast was loaded from a zip
    if ".zip" in __file__ or "tablecast.zip" in sc.getConf().get("spark.submit.pyFiles", ""):
        _shipped[key] = "by spark-submit"  # --py-files tablecast.zip: Spark ships it
        return
    work = Path(tempfile.mkdtemp(prefix="tablecast-pyfiles-"))
    atexit.register(shutil.rmtree, work, True)
    archive = package_zip(work)
    sc.addPyFile(str(archive))
    _shipped[key] = str(archive)
    log.info(
        "tablecast shipped to the executors (%d kB); their Python needs %s",
        archive.stat().st_size // 1024,
        ", ".join(EXECUTOR_IMPORTS),
    )


def ship_file(spark: SparkSession, path: str | os.PathLike[str]) -> None:
    """Make a user's file (the App file) importable on the executors, on a cluster."""
    if not is_local(spark.sparkContext.master):
        spark.sparkContext.addPyFile(str(Path(path).resolve()))


#: PySpark builds Spark Connect Columns (no JVM needed) while this is in the environment
CONNECT_COLUMNS = "SPARK_CONNECT_MODE_ENABLED"


def defer_columns() -> None:
    """Let Column expressions be built before Spark runs (defining an App starts nothing).

    Until a SparkContext exists, PySpark builds Spark Connect Columns: expression
    trees in plain Python, which the compiler rebuilds as classic Columns once
    Spark runs (see :mod:`tablecast.pipeline.compile.columns`). :func:`session`
    turns this off before it starts Spark.
    """
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:
        os.environ[CONNECT_COLUMNS] = "1"


def end_deferred_columns() -> None:
    """Columns built from now on are classic ones; and with Spark Connect's switch in the
    environment, getOrCreate() would make a Spark Connect session (see defer_columns)."""
    os.environ.pop(CONNECT_COLUMNS, None)


def ensure_active(master: str | None = None) -> None:
    """Start a tablecast SparkSession unless one is active already."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:
        session("tablecast", master)


def check_master(spark: SparkSession, master: str | None) -> None:
    """Warn when a requested master differs from the running session's."""
    if master and spark.sparkContext.master != master:
        log.warning(
            "Spark is already running on %s, not %s: set TABLECAST_MASTER before Spark is "
            "started (App.run starts it unless a session is running)",
            spark.sparkContext.master,
            master,
        )
