"""Three nodes, 12 partitions, one standby: any node answers any key, and queries keep
succeeding through kill -9, a node joining, and rolling restarts (one with reads sent to the
node being stopped, as a load balancer would)."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

import tablecast as tc
from bench.background import Background
from bench.balancer import Balancer
from tablecast import serde
from tablecast.kafka.broker import free_port

from ..support.procs import NodeProcess, eventually, start_node, stop_all, tls
from .tables import TableModel, make_table

pytestmark = pytest.mark.integration

PARTITIONS = 12
KEYS = 400


class Cluster:
    def __init__(self, app: str, bootstrap: str, logs: Path) -> None:
        self.app, self.bootstrap, self.logs = app, bootstrap, logs
        self.nodes: dict[str, NodeProcess] = {}
        self.ports: dict[str, int] = {}
        self.starting: list[NodeProcess] = []  # every process started, for the cleanup
        self.lock = threading.Lock()

    def start(self, name: str) -> NodeProcess:
        port = self.ports.setdefault(name, free_port())
        node = start_node(
            self.app,
            self.bootstrap,
            self.logs,
            "--standby-replicas",
            "1",
            "--data-dir",
            str(self.logs / f"data-{name}"),
            port=port,
        )
        self.starting.append(node)
        node.wait_ready()  # clients send to it only once it is ready
        with self.lock:
            self.nodes[name] = node
        return node

    def live_urls(self) -> list[str]:
        with self.lock:
            return [n.url for n in self.nodes.values()]

    def take_out(self, name: str) -> NodeProcess:
        """Stop sending to `name` before it goes away: the test's clients query live nodes."""
        with self.lock:
            node = self.nodes.pop(name)
        time.sleep(0.5)  # let requests already sent to it finish
        return node

    def settled(self, expect_nodes: int) -> bool:
        url = self.live_urls()[0]
        nodes = httpx.get(f"{url}/v1/cluster", timeout=5, verify=tls()).json()["nodes"]
        if len(nodes) != expect_nodes:
            return False
        roles = Counter(
            (r["table"], r["partition"], r["role"]) for n in nodes for r in n["replicas"]
        )
        return all(
            roles[("kv", p, "active")] == 1
            and roles[("kv", p, "standby")] == 1
            and roles[("kv", p, "warming")] == 0
            for p in range(PARTITIONS)
        )


#: each load thread's reads a second: hundreds over each hand-over, and the machine's CPU
#: left to the nodes under test
READS_PER_S = 100.0


class Load(Background):
    """Clients querying random keys, counting failures and wrong answers."""

    def __init__(self, cluster: Cluster, model: TableModel) -> None:
        self.cluster, self.model = cluster, model
        self.keys = [k.decode() for k in model.rows]
        self.ok = self.failed = self.wrong = 0
        self.errors: list[str] = []
        super().__init__(self._smart, self._plain, self._monotonic)

    def _check(self, key: str, value: object) -> None:
        if value == self.model.rows[key.encode()]:
            self.ok += 1
        else:
            self.wrong += 1
            self.errors.append(f"wrong answer for {key}: {value!r}")

    def _smart(self) -> None:
        """tablecast.Client: asks owners directly, fails over itself."""
        rng = random.Random(1)
        with tc.Client(self.cluster.live_urls()) as client:
            for _ in self._paced(READS_PER_S):
                key = rng.choice(self.keys)
                try:
                    record = client.get("kv", key)
                    self._check(key, record and record["value"])
                except Exception as e:
                    self.failed += 1
                    self.errors.append(f"client: {key}: {e!r}")

    def _plain(self) -> None:
        """A plain HTTP client on whichever live node: the nodes forward and fail over."""
        rng = random.Random(2)
        with httpx.Client(timeout=10) as http:
            for _ in self._paced(READS_PER_S):
                key = rng.choice(self.keys)
                url = rng.choice(self.cluster.live_urls())
                try:
                    r = http.get(f"{url}/v1/tables/kv/keys/{quote(key, safe='')}")
                    if r.status_code != 200:
                        self.failed += 1
                        self.errors.append(f"plain: {url} {key}: {r.status_code} {r.text}")
                    else:
                        self._check(key, r.json()["value"])
                except Exception as e:
                    self.failed += 1
                    self.errors.append(f"plain: {url} {key}: {e!r}")

    def _monotonic(self) -> None:
        """Read a key, then again elsewhere with min_offset at what the first read saw:
        the waits in consistency.reach meet replicas released under them."""
        rng = random.Random(3)
        with httpx.Client(timeout=10) as http:
            for _ in self._paced(READS_PER_S):
                key = rng.choice(self.keys)
                path = f"/v1/tables/kv/keys/{quote(key, safe='')}"
                try:
                    r = http.get(rng.choice(self.cluster.live_urls()) + path)
                    if r.status_code == 200:
                        seen = r.json()
                        r = http.get(
                            rng.choice(self.cluster.live_urls()) + path,
                            params={"min_offset": f"{seen['partition']}:{seen['offset']}"},
                        )
                    if r.status_code != 200:
                        self.failed += 1
                        self.errors.append(f"min_offset: {key}: {r.status_code} {r.text}")
                    else:
                        self._check(key, r.json()["value"])
                except Exception as e:
                    self.failed += 1
                    self.errors.append(f"min_offset: {key}: {e!r}")

    def assert_clean(self) -> None:
        assert self.failed == 0 and self.wrong == 0, self.errors[:10]
        assert self.ok > 100


@pytest.fixture
def cluster(bootstrap: str, unique: str, logs: Path):  # type: ignore[no-untyped-def]
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    rng = random.Random(5)
    model.write(bootstrap, [(f"key-{i}", {"i": i, "r": rng.randrange(10**6)}) for i in range(KEYS)])
    c = Cluster(unique, bootstrap, logs)
    try:
        for name in ("a", "b", "c"):
            c.start(name)
        eventually(lambda: c.settled(3), timeout=60)
        yield c, model
    finally:
        stop_all(c.starting)


def test_every_node_answers_every_key_identically(cluster) -> None:  # type: ignore[no-untyped-def]
    c, model = cluster
    served_by: Counter[str] = Counter()
    for raw, value in model.rows.items():
        answers = []
        for node in c.nodes.values():
            r = node.get(f"/v1/tables/kv/keys/{quote(raw.decode(), safe='')}")
            assert r.status_code == 200, r.text
            served_by[r.headers["x-tablecast-node"]] += 1
            answers.append(r.json())
        assert all(a == answers[0] for a in answers) and answers[0]["value"] == value
    assert len(served_by) == 3  # the work is spread: each node is active for some keys
    # fan-out queries merge every partition, wherever it lives
    node = next(iter(c.nodes.values()))
    assert node.get("/v1/tables/kv/count").json() == {"count": KEYS}
    keys = [
        item["key"]
        for item in node.get("/v1/tables/kv/range", params={"limit": 10000}).json()["items"]
    ]
    assert keys == sorted(k.decode() for k in model.rows)
    probe = ["key-3", "nope", "key-399", "key-17"]
    got = httpx.post(f"{node.url}/v1/tables/kv/keys:batchGet", json={"keys": probe}).json()[
        "results"
    ]
    assert [g["found"] for g in got] == [True, False, True, True]
    # the active and its one standby, once a replica the assignment moved is released
    meta = eventually(
        lambda: (
            (m := node.get("/v1/tables/kv/keys/key-3/metadata").json())["active"]
            and len(m["standbys"]) == 1
            and m
        ),
        timeout=30,
    )
    # a job beside every node over what it owns sees every key exactly once
    with tc.Client(c.live_urls()) as client:
        seen = Counter(
            k for n in c.nodes.values() for k, _ in client.owned(n.url, "kv", page_size=37)
        )
    assert seen == Counter(k.decode() for k in model.rows)
    # a standby answers itself when the caller accepts its lag, and honours min_offset
    standby = meta["standbys"][0]
    r = httpx.get(f"{standby['url']}/v1/tables/kv/keys/key-3", params={"max_lag": 1000})
    assert r.status_code == 200 and r.headers["x-tablecast-node"] == standby["node"]
    record = r.json()
    r = httpx.get(
        f"{standby['url']}/v1/tables/kv/keys/key-3",
        params={"min_offset": f"{record['partition']}:{record['offset']}"},
    )
    assert r.status_code == 200 and r.headers["x-tablecast-node"] == meta["active"]["node"]
    r = httpx.get(f"{node.url}/v1/tables/kv/keys/key-3?redirect=true")
    assert r.status_code in (200, 307)
    if r.status_code == 307:
        assert r.headers["location"].startswith(meta["active"]["url"])


def test_kill_9_join_and_rolling_restart_lose_no_query(cluster) -> None:  # type: ignore[no-untyped-def]
    c, model = cluster
    with Load(c, model) as load:
        time.sleep(2)
        # kill -9 of a node: the others take over at once
        c.take_out("b").stop(signal.SIGKILL)
        eventually(lambda: c.settled(2), timeout=60)
        c.start("b")
        eventually(lambda: c.settled(3), timeout=60)
        # a fourth node joins: it warms up before it answers
        c.start("d")
        eventually(lambda: c.settled(4), timeout=90)
        # a rolling restart of every node
        for name in ("a", "b", "c", "d"):
            c.take_out(name).stop()
            c.start(name)
            eventually(lambda: c.settled(4), timeout=90)
        time.sleep(1)
    load.assert_clean()


def test_a_rolling_restart_hands_over_before_each_node_stops(cluster) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM: the node says it is not ready, its partitions go to the others (standbys
    answer at once) while it still answers, and it stops only then: reads a load balancer
    sent it before it heard are answered. Each node comes back 2 s after it stopped and
    gets reads once ready. Not one read fails."""
    c, model = cluster
    keys = [k.decode() for k in model.rows]

    def right(key: str, answer: httpx.Response) -> bool:
        return answer.json()["value"] == model.rows[key.encode()]

    # a load balancer polling /readyz, retrying nothing (bench/balancer.py)
    with Balancer(c.live_urls, "kv", keys, right, per_second=READS_PER_S) as load:
        time.sleep(1)
        for name in ("a", "b", "c"):
            c.nodes[name].stop()  # SIGTERM, and wait until it has exited
            with c.lock:
                c.nodes.pop(name)
            time.sleep(2)
            c.start(name)  # in the load balancer's list once ready
            eventually(lambda: c.settled(3), timeout=90)
        time.sleep(1)
    assert not load.failed, (load.failed, load.samples[:10])
    # while a node leaves, the two left each restore the partitions it held, and a node
    # that is to be active for one it has not restored yet says it is not ready
    print(
        f"rolling restart: {load.ok} reads answered, none failed; "
        f"{load.failed_open} sent while no node said it was ready"
    )
    assert load.ok > 100


def test_two_nodes_started_together_answer_every_read_once_ready(
    bootstrap: str, unique: str, logs: Path
) -> None:
    """Both nodes start at the same moment. Each reports ready once the partitions it is
    active for are caught up, and learns that the other's are from the other's next
    heartbeat (every 0.5 s) and its own next tick: a read of every partition in between
    finds some without a ready replica in its view. It waits for one (rpc's
    NO_REPLICA_GRACE_S) instead of answering 503: with no wait this failed 1 of 2 runs."""
    model = make_table(bootstrap, unique, "kv", PARTITIONS, serde.string(), serde.json())
    model.write(bootstrap, [(f"key-{i}", {"i": i}) for i in range(KEYS)])
    nodes = [
        start_node(unique, bootstrap, logs, "--data-dir", str(logs / f"data-{n}"))
        for n in ("a", "b")
    ]
    try:
        for node in nodes:
            node.wait_ready()
        # the other node's heartbeat naming its partitions ready falls in this window (and
        # a handover, RELEASE_GRACE_S after a new owner caught up, when one first held all)
        deadline = time.monotonic() + 8.0
        failures: list[str] = []
        reads = 0
        with httpx.Client(timeout=10.0) as client:
            while time.monotonic() < deadline:
                for node in nodes:
                    r = client.get(f"{node.url}/v1/tables/kv/count")
                    reads += 1
                    if r.status_code != 200 or r.json() != {"count": KEYS}:
                        failures.append(f"{node.url} {r.status_code} {r.text[:200]}")
        assert reads > 20
        assert not failures, failures[:5]
    finally:
        stop_all(nodes)
