"""A broker fails under load: three brokers (RF 3, min ISR 2), a table
pipeline, two nodes with a standby, steady input and steady reads; the broker leading most
of the table's partitions is stopped, then brought back. The pipeline and nodes go on,
every acknowledged record reaches the table, and no read fails, over HTTP or SQL.

Run with ``-s`` to see the figures (reads, failed, slowest read) reported in BENCHMARKS.md.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

import tablecast as tc
from bench.background import paced
from tablecast.cli.supervisor import stop_process
from tablecast.kafka.broker import free_port
from tablecast.kafka.dev_cluster import KafkaCluster
from tablecast.kafka.topics import ensure_topic

from ..support.procs import eventually, free_port_run, start_node, stop_all, tls

pytestmark = pytest.mark.integration

RUN = [sys.executable, "-m", "tablecast.cli.main", "run"]
PARTITIONS = 6
KEYS = 300
APP = """
import tablecast as tc

app = tc.App("{app}")
app.table("{topic}", key=tc.serde.string(), value=tc.serde.json()).materialize("kv")
"""


def test_leader_broker_stops_and_returns(unique: str, tmp_path: Path) -> None:
    data = Path(tempfile.mkdtemp(prefix="tablecast-test-kafka-cluster-"))
    cluster = KafkaCluster.create(data, free_port_run(3), 3)
    procs: list[subprocess.Popen[bytes]] = []
    nodes = []
    stop = threading.Event()
    try:
        cluster.start()
        bootstrap = cluster.bootstrap_servers
        topic = f"{unique}-in"
        ensure_topic(bootstrap, topic, PARTITIONS)
        app_file = tmp_path / "app.py"
        app_file.write_text(APP.format(app=unique, topic=topic))
        state = str(tmp_path / "state")
        with open(tmp_path / "pipeline.log", "wb") as out:
            procs.append(
                subprocess.Popen(
                    [*RUN, str(app_file), "--bootstrap-servers", bootstrap, "--state-dir", state],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        pg_ports = [free_port() for _ in range(2)]
        nodes = [
            start_node(unique, bootstrap, tmp_path, "--standby-replicas", "1", "--pg-port", str(p))
            for p in pg_ports
        ]
        for n in nodes:
            n.wait_ready(180)
        # ready with no table yet: the pipeline publishes it, then each node checks its topic
        # and answers 503 (retry) meanwhile; reads are counted from when both serve it
        eventually(
            lambda: all(n.get("/v1/tables/kv/count").status_code == 200 for n in nodes),
            timeout=180,
        )

        acked: dict[str, int] = {}
        producer = tc.producer(bootstrap, {"linger.ms": 5})

        def on_delivery(err, msg) -> None:  # type: ignore[no-untyped-def]
            if err is None:
                key = msg.key().decode()
                acked[key] = max(acked.get(key, -1), orjson.loads(msg.value())["seq"])

        def produce() -> None:
            seq = 0
            while not stop.is_set():
                key = f"k{random.randrange(KEYS):03d}"
                producer.produce(
                    topic,
                    key=key.encode(),
                    value=orjson.dumps({"seq": seq}),
                    on_delivery=on_delivery,
                )
                producer.poll(0)
                seq += 1
                time.sleep(0.005)

        outcomes: Counter[str] = Counter()
        why: list[str] = []
        t0 = time.monotonic()
        slowest = [0.0]

        def read() -> None:
            with httpx.Client(timeout=10) as http:
                # 100 reads a second a reader: thousands while the broker is away
                for _ in paced(stop, 100.0):
                    url = random.choice(nodes).url
                    started = time.monotonic()
                    try:
                        r = http.get(f"{url}/v1/tables/kv/keys/k{random.randrange(KEYS):03d}")
                        outcomes[str(r.status_code)] += 1
                        if r.status_code not in (200, 404) and len(why) < 5:
                            # which answer, from where and when: the assertion shows them
                            why.append(f"{time.monotonic() - t0:.1f}s {url} {r.text[:200]}")
                    except httpx.HTTPError as e:
                        outcomes[type(e).__name__] += 1
                    slowest[0] = max(slowest[0], time.monotonic() - started)

        def read_sql() -> None:
            """The same reads over SQL, on a connection to each node."""
            conns = [
                psycopg.connect(
                    f"host=127.0.0.1 port={p} dbname=tablecast user=t sslmode=disable",
                    autocommit=True,
                )
                for p in pg_ports
            ]
            try:
                for _ in paced(stop, 100.0):
                    conn, key = random.choice(conns), f"k{random.randrange(KEYS):03d}"
                    started = time.monotonic()
                    try:
                        conn.execute("SELECT value FROM kv WHERE key = %s", (key,)).fetchall()
                        outcomes["sql ok"] += 1
                    except psycopg.Error as e:
                        outcomes[f"sql {e.sqlstate}"] += 1
                        if len(why) < 5:
                            why.append(f"{time.monotonic() - t0:.1f}s SQL {e.sqlstate} {e}")
                    slowest[0] = max(slowest[0], time.monotonic() - started)
            finally:
                for conn in conns:
                    conn.close()

        producer_thread = threading.Thread(target=produce, daemon=True)
        producer_thread.start()
        # one reader over HTTP, one over SQL
        readers = [threading.Thread(target=f, daemon=True) for f in (read, read_sql)]
        for t in readers:
            t.start()
        eventually(lambda: outcomes["200"] > 100, timeout=180)

        leaders = Counter(
            p.leader
            for p in AdminClient({"bootstrap.servers": bootstrap})
            .list_topics(f"{unique}.table.kv", timeout=10)
            .topics[f"{unique}.table.kv"]
            .partitions.values()
        )
        victim = leaders.most_common(1)[0][0] - 1  # node ids are 1-based
        before = sum(outcomes.values())
        why.append(f"{time.monotonic() - t0:.1f}s broker {victim} stops")
        cluster.stop(victim)
        time.sleep(10)
        cluster.start(victim)
        time.sleep(5)
        during = sum(outcomes.values()) - before
        stop.set()
        producer_thread.join(10)
        for t in readers:
            t.join(15)
        assert producer.flush(60) == 0

        differing: list[str] = []

        def converged() -> bool:
            keys = sorted(acked)
            r = httpx.post(
                f"{nodes[0].url}/v1/tables/kv/keys:batchGet",
                json={"keys": keys},
                timeout=10,
                verify=tls(),
            )
            if r.status_code != 200:
                differing[:] = [f"batchGet answered {r.status_code}: {r.text[:200]}"]
                return False
            got = {i["key"]: i["value"]["seq"] if i["found"] else None for i in r.json()["results"]}
            differing[:] = [
                f"{k}: acked {acked[k]}, node {got[k]}" for k in keys if got[k] != acked[k]
            ]
            return not differing

        try:
            eventually(converged, timeout=180, interval=2)
        except AssertionError:
            log = (tmp_path / "pipeline.log").read_text(errors="replace").splitlines()
            progress = [ln for ln in log if "rows/s processed" in ln or "ERROR" in ln][-5:]
            pytest.fail(f"{len(differing)} keys differ: {differing[:10]}; pipeline: {progress}")
        failed = sum(n for status, n in outcomes.items() if status not in ("200", "404", "sql ok"))
        print(
            f"\nbroker failure: {sum(outcomes.values())} reads ({during} while broker "
            f"{victim} was down or rejoining), {failed} failed, slowest read "
            f"{slowest[0] * 1000:.0f} ms, {len(acked)} keys acked, 0 lost; {dict(outcomes)}"
        )
        assert failed == 0, (outcomes, why)
    finally:
        stop.set()
        stop_all(nodes)
        for p in procs:
            stop_process(p, signal.SIGTERM, 60)
        cluster.stop()
        shutil.rmtree(data, ignore_errors=True)  # outside pytest's temp dirs: ours to remove
