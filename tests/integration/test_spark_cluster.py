"""The pipeline on a Spark standalone cluster (2 workers), one of them killed mid-stream.

A master and two workers (1 core, 1 GB each) from PySpark's own
``spark-class`` run on free loopback ports; ``tablecast run --master
spark://… --checkpoint-dir file://…`` drives a table group_by/reduce on them
while records arrive steadily. The test kills one worker's whole process
group (worker, executor, Python workers: a lost machine) with SIGKILL; Spark
reruns the lost tasks on the other executor, which restores the RocksDB
state from the shared checkpoint directory. The table must end exactly as the
reference computes it, and an ``origin`` table, computed by a callable on the
executors, shows that they imported tablecast from the zip the driver
shipped, not from an installation.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import tablecast as tc
from tablecast.kafka.topics import ensure_topic
from tablecast.pipeline.run.standalone import StandaloneCluster
from tests import reference_model as ref

from ..support.procs import eventually
from .test_pipeline_restart import Row, batch, json_sender, kill_group, sel
from .test_pipeline_support import end_offsets, read_table

pytestmark = [pytest.mark.integration, pytest.mark.spark_cluster]

GROUPING_APP = """
import tablecast as tc

app = tc.App({app!r}, trigger="500 milliseconds")
rows = app.table({topic!r}, key=tc.serde.string(), value=tc.serde.json())
rows.group_by(lambda k, v: (v["g"], v["n"]), value=tc.serde.long()).reduce(
    lambda a, b: a + b, lambda a, b: a - b
).materialize("sums")
# the same records as a stream, counted per key by Spark's own aggregation (no Python)
app.stream({topic!r}, key=tc.serde.string(), value=tc.serde.json()).group_by_key().count(
).materialize("counts")
# where the executors' Python found tablecast
rows.filter(lambda k, v: k == "r0").map_values(
    lambda k, v: __import__("tablecast").__file__
).materialize("origin")
"""
LONG, STR = tc.serde.long(), tc.serde.string()


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_stream_leaves_the_table_exact(
    bootstrap: str, unique: str, tmp_path: Path
) -> None:
    topic = f"{unique}-rows"
    ensure_topic(bootstrap, topic, 2)
    app_file = tmp_path / "app.py"
    app_file.write_text(GROUPING_APP.format(app=unique, topic=topic))
    checkpoints = tmp_path / "shared-checkpoints"
    log = tmp_path / "pipeline.log"
    rng = random.Random(11)
    history: list[Row] = []
    stop_sending = threading.Event()
    send = json_sender(bootstrap, topic, history)

    def steady() -> None:  # ~400 records/s until told to stop
        while not stop_sending.wait(0.5):
            send(batch(rng, 200))

    with StandaloneCluster(tmp_path / "spark", workers=2, cores=1, memory="1g") as cluster:
        send(batch(rng, 1000))
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tablecast.cli.main", "run", str(app_file)),
                    *("--bootstrap-servers", bootstrap, "--state-dir", str(tmp_path / "state")),
                    *("--master", cluster.url, "--checkpoint-dir", checkpoints.as_uri()),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own group: the driver and its JVM
            )
        sender = threading.Thread(target=steady, daemon=True)
        try:
            sums = f"{unique}.table.sums"
            eventually(lambda: sum(end_offsets(bootstrap, sums).values()) > 0, 300, 1.0)
            sender.start()
            time.sleep(8)  # a few batches over both executors
            assert proc.poll() is None, log.read_text()[-3000:]
            cluster.worker("worker-1").kill(signal.SIGKILL)
            eventually(lambda: cluster.alive_workers() == 1, 120, 1.0)
            time.sleep(12)  # the stream goes on on the one executor left
            stop_sending.set()
            sender.join(30)
            send(batch(rng, 500))
            want = ref.table_group_reduce(history, sel, lambda a, b: a + b, lambda a, b: a - b)
            eventually(lambda: read_table(bootstrap, sums, STR, LONG) == want, 420, 3.0)
            counts = f"{unique}.table.counts"
            eventually(
                lambda: read_table(bootstrap, counts, STR, LONG) == ref.stream_count(history)
            )
            assert proc.poll() is None, log.read_text()[-3000:]
            origin = read_table(bootstrap, f"{unique}.table.origin", STR, tc.serde.json())
            assert origin, "the origin table is empty"
            assert all("tablecast.zip" in str(v) for v in origin.values()), origin
            # the query checkpoints are where --checkpoint-dir said
            assert (checkpoints / unique).is_dir()
        finally:
            stop_sending.set()
            kill_group(proc, signal.SIGTERM)
