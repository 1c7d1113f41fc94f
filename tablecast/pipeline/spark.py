"""Starting Spark for a pipeline: Kafka connector on ``spark.jars``, RocksDB state, loopback."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from tablecast import jvm

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def session(
    app_name: str,
    master: str | None = None,
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession set up for tablecast (or the active one, with our settings applied)."""
    # Python workers must be this interpreter, which has pandas/pyarrow/grpc
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # the driver would otherwise advertise the machine's outward address
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    master = master or os.environ.get("TABLECAST_MASTER") or "local[2]"
    log.info("starting Spark (%s) ...", master)
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.jars", ",".join(str(p) for p in jvm.jars("spark-kafka")))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.adaptive.enabled", "false")
        # a Column expression that fails on one record (a bad cast) must yield
        # null for it, not fail the query: bad records never stop the pipeline
        .config("spark.sql.ansi.enabled", "false")
        # RocksDB state commits upload a changelog, not a snapshot, per batch
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("TABLECAST_SPARK_LOG_LEVEL", "WARN"))
    # shuffle partitions are tied to the topics' partitions per App; a shared
    # session (tests) gets the value of the App that starts last
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    return spark


def ensure_active(master: str | None = None) -> None:
    """Start a tablecast SparkSession unless one is active already."""
    from pyspark import SparkContext

    if SparkContext._active_spark_context is None:
        session("tablecast", master)


def check_master(spark: SparkSession, master: str | None) -> None:
    """Warn when a requested master differs from the running session's."""
    if master and spark.sparkContext.master != master:
        log.warning(
            "Spark is already running on %s, not %s: set TABLECAST_MASTER before the App "
            "is defined (defining an App starts Spark)",
            spark.sparkContext.master,
            master,
        )
