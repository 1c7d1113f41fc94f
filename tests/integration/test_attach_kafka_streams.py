"""A real Kafka Streams application's state served from its changelogs, no pipeline: its
key-value store as a table, its windowed and session counts as window tables, compared
key by key and window by window with what the application's own interactive queries
answer, as its input grows, and after a node is killed with SIGKILL."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tablecast.kafka.config import client_conf
from tablecast.kafka.topics import end_offsets, ensure_topic

from ..support.kafka_streams import STORES, StoresApp
from ..support.procs import NodeProcess, eventually, start_node

pytestmark = pytest.mark.integration

PARTITIONS = 4
WINDOW_MS = 60_000
GAP_MS = 30_000
KEYS = [f"user-{i}" for i in range(30)]
#: a window-aligned start an hour ago, so windows are whole minutes. Not older: a window
#: changelog deletes records by their time (the store's retention plus a day), and
#: records older than a segment's age (7 days) roll a segment each, which the broker's
#: retention check then deletes under the test
BASE_MS = int(time.time() * 1000) - 3_600_000
BASE_MS -= BASE_MS % WINDOW_MS


def _cli(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tablecast.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _produce(bootstrap: str, topic: str, first: int, n: int) -> int:
    """`n` clicks from record `first` on, 700 ms apart in event time, on random keys:
    each key gets a click every ~20 s, so its sessions (30 s gap) grow and merge. Written
    with Java's partitioner, as a Java service writes: the changelogs keep the input's
    partitions."""
    rng = random.Random(first)
    producer = Producer(client_conf(bootstrap, {"partitioner": "murmur2_random"}))
    for i in range(first, first + n):
        key = rng.choice(KEYS)
        producer.produce(
            topic, key=key.encode(), value=f"click-{i}".encode(), timestamp=BASE_MS + i * 700
        )
    assert producer.flush(60) == 0
    return first + n


def _counted(stores: dict[str, Any]) -> int:
    return sum(count for *_, count in stores["windows"])


def _served(node: NodeProcess) -> dict[str, Any]:
    """What the node answers for every key, in the shape of the app's own dump."""
    latest: dict[str, str] = {}
    windows: list[list[Any]] = []
    sessions: list[list[Any]] = []
    for key in KEYS:
        r = node.get(f"/v1/tables/latest/keys/{key}")
        if r.status_code == 200:
            latest[key] = r.json()["value"]
        else:
            assert r.status_code == 404, r.text
        for table, into in (("per-window", windows), ("sessions", sessions)):
            r = node.get(f"/v1/tables/{table}/keys/{key}/windows", params={"from": 0})
            assert r.status_code == 200, r.text
            into += [[key, w["start"], w["end"], w["value"]] for w in r.json()["items"]]
    return {"latest": latest, "windows": sorted(windows), "sessions": sorted(sessions)}


def _theirs(streams: StoresApp) -> dict[str, Any]:
    s = streams.stores()
    return {**s, "windows": sorted(s["windows"]), "sessions": sorted(s["sessions"])}


def _same(node: NodeProcess, streams: StoresApp, bootstrap: str) -> None:
    # Kafka Streams' producer sends a changelog record up to its linger (100 ms) after the
    # store holds it, so the changelogs' ends read once may miss the last records the
    # interactive queries already show: catch up to the ends again until both agree
    deadline = time.monotonic() + 60
    while True:
        for store in STORES:
            try:
                node.wait_caught_up(bootstrap, store, streams.changelog(store), timeout=120)
            except AssertionError as e:
                replicas = [
                    {k: r.get(k) for k in ("table", "partition", "role", "offset", "error")}
                    for n in node.get("/v1/cluster").json()["nodes"]
                    for r in n["replicas"]
                ]
                ends = end_offsets(bootstrap, streams.changelog(store))
                raise AssertionError(
                    f"{store}: {e}; ends {ends}; replicas {replicas}; node log:\n"
                    f"{node.log_file.read_text(errors='replace')[-3000:]}"
                ) from None
        theirs, served = _theirs(streams), _served(node)
        if served == theirs or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert served == theirs
    assert len(theirs["latest"]) == len(KEYS)
    assert len(theirs["windows"]) > len(KEYS)  # several minutes of windows per key
    assert max(count for *_, count in theirs["sessions"]) > 1  # sessions the app merged


def test_kafka_streams_stores_served_as_its_interactive_queries_answer(
    bootstrap: str, unique: str, logs: Path
) -> None:
    topic, app = f"{unique}.clicks", f"{unique}-tc"
    ensure_topic(bootstrap, topic, PARTITIONS)
    streams = StoresApp(bootstrap, f"{unique}-streams", topic, WINDOW_MS, GAP_MS).start()
    node: NodeProcess | None = None
    try:
        produced = _produce(bootstrap, topic, 0, 600)
        eventually(lambda: _counted(streams.stores()) == produced, 60)
        _cli(
            "attach",
            "latest",
            "--app",
            app,
            "--topic",
            streams.changelog("latest"),
            "--key",
            "string",
            "--value",
            "string",
            "--bootstrap-servers",
            bootstrap,
        )
        _cli(
            "attach",
            "per-window",
            "--app",
            app,
            "--topic",
            streams.changelog("per-window"),
            "--key",
            "kafka-streams-window:string",
            "--value",
            "long",
            "--window-size",
            "60s",
            "--bootstrap-servers",
            bootstrap,
        )
        _cli(
            "attach",
            "sessions",
            "--app",
            app,
            "--topic",
            streams.changelog("sessions"),
            "--key",
            "kafka-streams-session:string",
            "--value",
            "long",
            "--bootstrap-servers",
            bootstrap,
        )
        data = logs / "node-data"
        node = start_node(app, bootstrap, logs, "--data-dir", str(data))
        node.wait_ready()
        tables = {t["name"]: t for t in node.get("/v1/tables").json()["tables"]}
        assert tables["per-window"]["kind"] == tables["sessions"]["kind"] == "window"
        assert tables["per-window"]["partitioner"] == "murmur2"
        _same(node, streams, bootstrap)

        # more clicks: windows grow, sessions merge (the app deletes the sessions it merges)
        produced = _produce(bootstrap, topic, produced, 300)
        eventually(lambda: _counted(streams.stores()) == produced, 60)
        _same(node, streams, bootstrap)

        node.stop(signal.SIGKILL)
        produced = _produce(bootstrap, topic, produced, 100)
        eventually(lambda: _counted(streams.stores()) == produced, 60)
        node = start_node(app, bootstrap, logs, "--data-dir", str(data))
        node.wait_ready()
        _same(node, streams, bootstrap)
    finally:
        if node is not None:
            node.stop()
        streams.stop()
