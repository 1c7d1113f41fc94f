"""Membership that trusts only signed records and never compares two machines' clocks.

Real `tablecast serve` processes and a real broker: a forged member record or
tombstone written straight to `<app>.members` is ignored, a replayed record of
a killed node does not bring it back, and nodes whose clocks are 30 s apart
(libfaketime) still see each other.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tablecast import serde
from tablecast.cluster.liveness import CHALLENGE_HEADER, SIGNATURE_HEADER, health_body
from tablecast.cluster.signing import Signer
from tablecast.kafka.broker import free_port
from tablecast.kafka.topics import members_topic

from ..support.apt import FAKETIME_LIB, faketime
from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .tables import make_table

pytestmark = pytest.mark.integration

SECRET = "membership-test-secret"
PARTITIONS = 4
CND_SHIM = Path(__file__).parent.parent / "support" / "cnd_shim.c"


def members(node: NodeProcess) -> set[str]:
    return {n["id"] for n in node.get("/v1/cluster").json()["nodes"]}


def start(app: str, bootstrap: str, logs: Path, count: int, *extra: str) -> list[NodeProcess]:
    nodes = [
        start_node(app, bootstrap, logs, "--cluster-secret", SECRET, *extra) for _ in range(count)
    ]
    for n in nodes:
        n.wait_ready()
    return nodes


def node_id(node: NodeProcess) -> str:
    return node.url.split("://", 1)[1]


def never(check, seconds: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert not check()
        time.sleep(0.1)


class FakeNode:
    """An HTTP server answering /healthz as node `ghost` would, signing with `secret`."""

    def __init__(self, node: str, incarnation: str) -> None:
        self.signer = Signer(None)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = health_body(node, incarnation, "reachable")
                self.send_response(200)
                challenge = self.headers.get(CHALLENGE_HEADER)
                if challenge and fake.signer.enabled:
                    self.send_header(SIGNATURE_HEADER, fake.signer.sign(body, challenge.encode()))
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def record(node: str, url: str, signer: Signer | None, inc: str, seq: int) -> tuple:  # type: ignore[type-arg]
    key = node.encode()
    value = orjson.dumps(
        {
            "id": node,
            "url": url,
            "ready": True,
            "replicas": [
                {"table": "kv", "partition": p, "caught_up": True, "offset": 10**6, "lag": 0}
                for p in range(PARTITIONS)
            ],
        }
    )
    headers = [("tc-inc", inc.encode()), ("tc-seq", str(seq).encode())]
    if signer is not None:
        headers.append(
            ("tc-sig", signer.sign(key, value, inc.encode(), str(seq).encode()).encode())
        )
    return key, value, headers


def test_forged_member_records_and_tombstones_are_ignored(
    bootstrap: str, unique: str, logs: Path
) -> None:
    make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    nodes = start(unique, bootstrap, logs, 2)
    ghost = FakeNode("ghost", "g1")
    producer = Producer({"bootstrap.servers": bootstrap})
    topic = members_topic(unique)
    try:
        eventually(lambda: members(nodes[0]) == {node_id(n) for n in nodes}, timeout=30)
        # a stranger without the secret: unsigned records, records signed with another
        # secret, and a tombstone for a real node
        wrong = Signer("not-the-secret")
        for seq in range(1, 16):
            for signer in (None, wrong):
                key, value, headers = record("ghost", ghost.url, signer, "g1", seq)
                producer.produce(topic, key=key, value=value, headers=headers)
            producer.produce(topic, key=node_id(nodes[1]).encode(), value=None)
            producer.flush(10)
            time.sleep(0.2)
        never(lambda: any("ghost" in members(n) for n in nodes), 3.0)
        assert all(node_id(nodes[1]) in members(n) for n in nodes)
        for n in nodes:
            body = n.get("/v1/cluster").json()
            assert body["membership"]["rejected_records"] >= 30
            assert "without a valid signature" in n.log_file.read_text()
        # the control: the same records signed with the secret, and a fake node that can
        # sign its answers, are believed, so the refusals above were the signature's doing
        right = Signer(SECRET)
        ghost.signer = Signer(SECRET)
        for seq in range(100, 110):
            key, value, headers = record("ghost", ghost.url, right, "g1", seq)
            producer.produce(topic, key=key, value=value, headers=headers)
            producer.flush(10)
            time.sleep(0.2)
        eventually(lambda: "ghost" in members(nodes[0]), timeout=10)
    finally:
        ghost.close()
        stop_all(nodes)


def test_a_replayed_record_does_not_bring_a_killed_node_back(
    bootstrap: str, unique: str, logs: Path
) -> None:
    make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    nodes = start(unique, bootstrap, logs, 3)
    topic = members_topic(unique)
    extra: list[NodeProcess] = []
    try:
        ids = {node_id(n) for n in nodes}
        eventually(lambda: members(nodes[0]) == ids, timeout=30)
        victim = nodes.pop()
        victim_id = node_id(victim)
        # a few heartbeats to replay (a node killed right after it joined had written 2)
        eventually(lambda: len(read_records(bootstrap, topic, victim_id)) >= 3, timeout=30)
        victim.stop(signal.SIGKILL)  # no tombstone
        # every survivor has to see it gone: each prunes on its own clock
        eventually(lambda: all(victim_id not in members(n) for n in nodes), timeout=15)
        # everything the killed node ever wrote, written again verbatim
        captured = read_records(bootstrap, topic, victim_id)
        assert len(captured) >= 3
        producer = Producer({"bootstrap.servers": bootstrap})
        for key, value, headers in captured[-10:]:
            producer.produce(topic, key=key, value=value, headers=headers)
        producer.flush(10)
        never(lambda: any(victim_id in members(n) for n in nodes), 4.0)
        # a node started now reads the replays as history: it must not believe them either
        extra.append(*start(unique, bootstrap, logs, 1))
        never(lambda: victim_id in members(extra[0]), 4.0)
        assert members(extra[0]) == {node_id(n) for n in (*nodes, *extra)}
    finally:
        stop_all((*nodes, *extra))


def read_records(bootstrap: str, topic: str, key: str) -> list[tuple]:  # type: ignore[type-arg]
    """Every heartbeat of `key` in `topic`, with its headers, oldest first."""
    return [
        (m.key(), m.value(), m.headers())
        for m in read_topic(bootstrap, topic)
        if m.key() == key.encode() and m.value() is not None
    ]


def read_topic(bootstrap: str, topic: str) -> list:  # type: ignore[type-arg]
    """The topic's records up to its end as of now (heartbeats keep coming after)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{time.time()}"})
    try:
        _, end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, 0)])
        out = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not out or out[-1].offset() < end - 1):
            out.extend(m for m in c.consume(1000, 0.3) if m.error() is None)
        return out
    finally:
        c.close()


def test_nodes_with_clocks_30_s_apart_see_each_other(
    bootstrap: str, unique: str, logs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node b's clock runs 30 s ahead, c's 30 s behind (libfaketime on the whole process)."""
    if faketime() is None or shutil.which("cc") is None:
        pytest.skip("needs libfaketime (apt-get install libfaketime, as root) and a C compiler")
    make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    shim = logs / "cnd_shim.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(CND_SHIM)], check=True)
    nodes: list[NodeProcess] = []
    try:
        for skew in (None, "+30s", "-30s"):
            if skew:
                monkeypatch.setenv("LD_PRELOAD", f"{shim} {FAKETIME_LIB}")
                monkeypatch.setenv("FAKETIME", skew)
                # wall clocks differ between hosts; each host's monotonic clock is its own
                monkeypatch.setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            nodes.append(start_node(unique, bootstrap, logs, "--cluster-secret", SECRET))
            monkeypatch.delenv("LD_PRELOAD", raising=False)
            monkeypatch.delenv("FAKETIME", raising=False)
        for n in nodes:
            n.wait_ready()
        ids = {node_id(n) for n in nodes}
        for n in nodes:
            eventually(lambda n=n: members(n) == ids, timeout=30)
        # the skew is real: Kafka holds their heartbeats stamped 30 s apart
        stamps = latest_timestamps(bootstrap, members_topic(unique))
        base = stamps[node_id(nodes[0])]
        assert stamps[node_id(nodes[1])] - base > 20_000
        assert base - stamps[node_id(nodes[2])] > 20_000
        # and every node keeps every other alive, heard by receipt
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            for n in nodes:
                body = n.get("/v1/cluster").json()
                assert {x["id"] for x in body["nodes"]} == ids
                for x in body["nodes"]:
                    assert x["heartbeat_age_ms"] is not None and x["heartbeat_age_ms"] < 3000
            time.sleep(0.3)
        for n in nodes:
            assert n.get("/readyz").status_code == 200
    finally:
        stop_all(nodes)


def latest_timestamps(bootstrap: str, topic: str) -> dict[str, int]:
    """node -> the Kafka timestamp of its latest heartbeat (its own clock's reading)."""
    return {
        m.key().decode(): m.timestamp()[1]
        for m in read_topic(bootstrap, topic)
        if m.key() is not None and m.value() is not None
    }
