"""The serving tier through a Kafka outage, and leaving on SIGTERM.

Three nodes, no standbys, the broker stopped for 25 s while a reader queries
random nodes: every read must succeed with the right value and say how stale it
is, every /readyz stay 200, and after Kafka returns new writes show, reads are fresh
again and no partition is restored again.
The broker here is the test's own: stopping the session broker would break the
tests sharing it.
"""

from __future__ import annotations

import random
import re
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from bench.background import Background
from tablecast import serde
from tablecast.kafka.broker import Broker, free_port

from ..support.procs import NodeProcess, eventually, start_node, stop_all
from .tables import TableModel, make_table

pytestmark = pytest.mark.integration

PARTITIONS = 6
KEYS = 600
OUTAGE_S = 25.0


def settled(node: NodeProcess, expect: int, standbys: int = 0) -> bool:
    nodes = node.get("/v1/cluster").json()["nodes"]
    if len(nodes) != expect or not all(n["state"] == "ready" for n in nodes):
        return False
    roles = Counter((r["partition"], r["role"]) for n in nodes for r in n["replicas"])
    return all(
        roles[(p, "active")] == 1
        and roles[(p, "standby")] == standbys
        and roles[(p, "warming")] == 0
        for p in range(PARTITIONS)
    )


class Reader(Background):
    """Reads random keys from random nodes (about 100 a second); probes every node's
    /readyz."""

    def __init__(self, nodes: list[NodeProcess], model: TableModel) -> None:
        self.nodes, self.model = nodes, model
        self.keys = [k.decode() for k in model.rows]
        self.reads: list[tuple[float, bool]] = []  # (monotonic time, ok)
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.unready: list[str] = []
        self.readyz_seen: list[dict] = []
        super().__init__(self._read, self._ready)

    def _read(self) -> None:
        rng = random.Random(7)
        with httpx.Client(timeout=10) as http:
            for _ in self._paced(100.0):
                key = rng.choice(self.keys)
                node = rng.choice(self.nodes)
                now = time.monotonic()
                try:
                    r = http.get(f"{node.url}/v1/tables/kv/keys/{quote(key, safe='')}")
                except httpx.HTTPError as e:
                    self.reads.append((now, False))
                    self.errors.append(f"{node.url} {key}: {e!r}")
                    continue
                if r.status_code != 200:
                    self.reads.append((now, False))
                    self.errors.append(f"{node.url} {key}: {r.status_code} {r.text[:200]}")
                    continue
                self.reads.append((now, True))
                if r.json()["value"] != self.model.rows[key.encode()]:
                    self.wrong.append(f"{key}: {r.text[:200]}")

    def _ready(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._stop.is_set():
                for node in self.nodes:
                    try:
                        r = http.get(f"{node.url}/readyz")
                        self.readyz_seen.append(r.json())
                        if r.status_code != 200:
                            self.unready.append(f"{node.url}: {r.status_code} {r.text[:300]}")
                    except httpx.HTTPError as e:
                        self.unready.append(f"{node.url}: {e!r}")
                self._stop.wait(0.2)

    def between(self, start: float, end: float) -> tuple[int, int]:
        window = [ok for t, ok in self.reads if start <= t <= end]
        return len(window), sum(not ok for ok in window)


def restores(node: NodeProcess) -> int:
    """Partitions the node has begun restoring, from its log."""
    found = re.findall(r"restoring (\d+) partition\(s\): ", node.log_file.read_text())
    return sum(int(n) for n in found)


@pytest.fixture
def own_broker():  # type: ignore[no-untyped-def]
    data = Path(tempfile.mkdtemp(prefix="tablecast-test-outage-kafka-"))
    b = Broker(data, free_port())
    b.start()
    try:
        yield b
    finally:
        b.stop()
        shutil.rmtree(data, ignore_errors=True)


def test_reads_and_readiness_survive_a_kafka_outage(own_broker: Broker, unique: str, logs: Path):
    bootstrap = own_broker.bootstrap_servers
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    rng = random.Random(3)
    model.write(bootstrap, [(f"key-{i}", {"i": i, "r": rng.randrange(10**6)}) for i in range(KEYS)])
    nodes: list[NodeProcess] = []
    try:
        for _ in range(3):
            nodes.append(start_node(unique, bootstrap, logs))
        for n in nodes:
            n.wait_ready()
        eventually(lambda: settled(nodes[0], 3), timeout=60)
        before = [restores(n) for n in nodes]
        with Reader(nodes, model) as reader:
            time.sleep(2)
            own_broker.stop()
            down = time.monotonic()
            # each node notices: its readiness says Kafka is unreachable, and it stays ready
            eventually(
                lambda: all(n.get("/readyz").json()["kafka"] == "unreachable" for n in nodes),
                timeout=10,
            )
            cluster = nodes[0].get("/v1/cluster").json()
            time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
            # a read says how long its replica has not heard from Kafka, and that it was
            # not behind when it last did
            stale = [n.get(f"/v1/tables/kv/keys/key-{i}") for i, n in enumerate(nodes)]
            up = time.monotonic()
            own_broker.start()
            time.sleep(3)
        total, failed = reader.between(down, up)
        print(f"during the {up - down:.1f} s outage: {total} reads, {failed} failed")
        assert failed == 0, reader.errors[:10]
        assert total > 100
        assert not reader.wrong, reader.wrong[:10]
        assert not reader.unready, reader.unready[:10]
        assert cluster["kafka"] == "unreachable" and len(cluster["nodes"]) == 3
        assert all(n["direct_check_age_ms"] is not None for n in cluster["nodes"])
        assert any(r.get("stale") for r in reader.readyz_seen)
        for r in stale:
            assert r.status_code == 200 and int(r.headers["x-tablecast-staleness-ms"]) > 2000
            assert r.headers["x-tablecast-lag"] == "0"
        # Kafka is back: writes show on every node, and nothing was restored again
        eventually(
            lambda: all(n.get("/readyz").json()["kafka"] == "reachable" for n in nodes),
            timeout=30,
        )
        model.write(bootstrap, [(f"key-{i}", {"i": i, "after": True}) for i in range(0, KEYS, 7)])
        model.write(bootstrap, [("new-key", {"new": True})])

        def fresh() -> bool:
            for n in nodes:
                for key in ("new-key", "key-7", "key-595"):
                    r = n.get(f"/v1/tables/kv/keys/{key}")
                    if r.status_code != 200 or r.json()["value"] != model.rows[key.encode()]:
                        return False
            return True

        eventually(fresh, timeout=30)
        for n in nodes:
            eventually(
                lambda n=n: (
                    n.get("/v1/tables/kv/keys/key-2").headers["x-tablecast-staleness-ms"] == "0"
                ),
                30,
            )
        assert settled(nodes[0], 3)
        assert [restores(n) for n in nodes] == before
    finally:
        stop_all(nodes)


def test_sigterm_leaves_at_once(bootstrap: str, unique: str, logs: Path) -> None:
    """SIGTERM: the node says at once that it is leaving, hands its partitions over, and
    is dropped by its tombstone (with --cluster-secret, a signed one), not after the 3 s a
    silent node takes."""
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"key-{i}", {"i": i}) for i in range(100)])
    nodes = [start_node(unique, bootstrap, logs, "--cluster-secret", "s") for _ in range(3)]
    try:
        for n in nodes:
            n.wait_ready()
        eventually(lambda: settled(nodes[0], 3), timeout=60)
        leaving = nodes.pop()
        leaving_id = leaving.url.split("://", 1)[1]

        def states() -> dict[str, str]:
            cluster = nodes[0].get("/v1/cluster").json()["nodes"]
            return {n["id"]: n["state"] for n in cluster}

        started = time.monotonic()
        leaving.proc.send_signal(signal.SIGTERM)
        eventually(lambda: states().get(leaving_id) == "leaving", 10, 0.05)
        said_after = time.monotonic() - started
        assert leaving.get("/readyz").status_code == 503  # load balancers stop sending
        eventually(lambda: leaving_id not in states(), 10, 0.05)
        gone_after = time.monotonic() - started
        leaving.proc.wait(30)
        exited_after = time.monotonic() - started
        print(
            f"leaving after {said_after:.2f} s, out of the view after {gone_after:.2f} s, "
            f"process exited after {exited_after:.2f} s"
        )
        assert said_after < 1.5
        assert exited_after < 5.0
        eventually(lambda: settled(nodes[0], 2), timeout=30)
        log = nodes[0].log_file.read_text()
        assert f"node {leaving_id} left" in log and f"node {leaving_id} is dead" not in log
    finally:
        stop_all([*nodes, leaving])


def test_a_starting_pipeline_waits_out_a_broker_outage(own_broker: Broker, unique: str) -> None:
    """Kafka going away after `tablecast run` checked it (a driver restarted while a broker
    restarts) is waited out, not a crash: the start looks for its source topic until the
    broker is back (the chaos soak's driver died of this), and App.run starts again on
    any outage error."""
    from confluent_kafka import KafkaError, KafkaException

    import tablecast as tc
    from tablecast.kafka.topics import ensure_topic
    from tablecast.pipeline.run.pipeline import wait_for_topic

    bootstrap = own_broker.bootstrap_servers
    ensure_topic(bootstrap, f"{unique}-in", 3)
    own_broker.stop()
    found: list[int] = []
    waiter = threading.Thread(
        target=lambda: found.append(wait_for_topic(bootstrap, f"{unique}-in", timeout=120))
    )
    waiter.start()
    time.sleep(8)
    assert waiter.is_alive() and not found  # still waiting, not crashed
    own_broker.start()
    waiter.join(120)
    assert found == [3]

    # the whole start: outage errors are retried, anything else ends the run at once
    app = tc.App(unique)
    attempts: list[int] = []

    def flaky_start(*_: object) -> object:
        attempts.append(1)
        if len(attempts) < 3:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker away"))
        raise ValueError("a real mistake")

    app.start = flaky_start  # type: ignore[method-assign]
    with pytest.raises(ValueError, match="a real mistake"):
        app.run(bootstrap)
    assert len(attempts) == 3
