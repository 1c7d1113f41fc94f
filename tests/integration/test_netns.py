"""Several hosts, not localhost: three nodes, each in its own network
namespace with its own address in 198.18.0.0/15 (the range set aside for network tests),
joined by a bridge on the host where the broker listens. Forwarding, the smart client and
hand-over work across hosts, over plain HTTP and over HTTPS with a cluster secret; a node cut
off (its link down) is routed around within seconds with no wrong answer.

The test makes every namespace, link and the bridge itself and removes them all, also on
failure. Without root (or where namespaces cannot be made) it is skipped, saying why.
"""

from __future__ import annotations

import os
import random
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import tablecast as tc
from tablecast import serde
from tablecast.cli.supervisor import stop_process
from tablecast.kafka.broker import Broker, free_port

from ..support.procs import eventually
from .tables import make_table
from .test_tls_peers import certificate_files

pytestmark = pytest.mark.integration

HOST_IP = "198.18.0.1"
NODE_IPS = ["198.18.0.11", "198.18.0.12", "198.18.0.13"]
PORT = 8080  # every node has its own address, so all may use the same port
KEYS = 120
SECRET = "netns-cluster-secret-0123456789abcdef"
ROOT = Path(__file__).resolve().parents[2]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass
class Hosts:
    """A bridge on this machine and one namespace per node, each linked to it by a veth pair."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"tcbr{self.tag}"

    def make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        _ip("addr", "add", f"{HOST_IP}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, address in enumerate(NODE_IPS):
            ns, outside, inside = f"tcns{self.tag}{i}", f"tch{self.tag}{i}", f"tcn{self.tag}{i}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            self.links.append(outside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, i: int) -> None:
        """Take node i's host off the network (its link goes down)."""
        _ip("link", "set", f"tch{self.tag}{i}", "down")

    def remove(self) -> None:
        for link in reversed(self.links):  # a veth pair goes with either end
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    h = Hosts()
    try:
        h.make()
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        h.remove()
        stderr = getattr(e, "stderr", "") or ""
        pytest.skip(f"cannot make network namespaces here: {e} {stderr.strip()}")
    try:
        yield h
    finally:
        h.remove()


@pytest.fixture(scope="module")
def bridge_broker(hosts: Hosts) -> Iterator[Broker]:
    data = Path(tempfile.mkdtemp(prefix="tablecast-test-kafka-netns-"))
    b = Broker(data, free_port(), host=HOST_IP)
    b.start()
    try:
        yield b
    finally:
        b.stop()
        shutil.rmtree(data, ignore_errors=True)  # outside pytest's temp dirs: ours to remove


@dataclass
class RemoteNode:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path


def _start(
    hosts: Hosts, i: int, app: str, bootstrap: str, tmp: Path, scheme: str, extra: list[str]
) -> RemoteNode:
    url = f"{scheme}://{NODE_IPS[i]}:{PORT}"
    log = tmp / f"node-{i}.log"
    argv = ["ip", "netns", "exec", hosts.namespaces[i], sys.executable, "-m"]
    argv += ["tablecast.cli.main", "serve", "--app", app, "--bootstrap-servers", bootstrap]
    argv += ["--host", "0.0.0.0", "--port", str(PORT), "--advertised-url", url]
    argv += ["--standby-replicas", "1", "--data-dir", str(tmp / f"data-{i}"), *extra]
    with open(log, "ab") as out:
        # `ip netns exec` execs the command: the pid is the node's own
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    return RemoteNode(proc, url, log)


@pytest.mark.parametrize("secure", [False, True], ids=["http", "https+secret"])
def test_nodes_on_three_hosts(
    hosts: Hosts, bridge_broker: Broker, tmp_path: Path, secure: bool
) -> None:
    app = f"netns{uuid.uuid4().hex[:6]}"
    bootstrap = bridge_broker.bootstrap_servers
    model = make_table(bootstrap, app, "kv", 6, serde.string(), serde.json())
    model.write(bootstrap, [(f"k{i}", {"i": i}) for i in range(KEYS)])
    scheme, extra, verify = "http", [], True
    if secure:
        ca, cert, key = certificate_files(tmp_path, NODE_IPS)
        scheme, verify = "https", ssl.create_default_context(cafile=ca)
        extra = ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca, "--cluster-secret", SECRET]
    nodes: list[RemoteNode] = []
    http = httpx.Client(timeout=5, verify=verify)
    try:
        for i in range(2):
            nodes.append(_start(hosts, i, app, bootstrap, tmp_path, scheme, extra))

        def reads_everywhere(upto: list[RemoteNode]) -> bool:
            for n in upto:
                for i in random.sample(range(KEYS), 20):
                    r = http.get(f"{n.url}/v1/tables/kv/keys/k{i}")
                    if r.status_code != 200:
                        return False
                    assert r.json()["value"] == {"i": i}  # never a wrong answer
            return True

        def cluster_size(n: RemoteNode) -> int:
            try:
                return len(http.get(f"{n.url}/v1/cluster").json()["nodes"])
            except (httpx.HTTPError, ValueError, KeyError):
                return 0

        eventually(lambda: all(cluster_size(n) == 2 for n in nodes), timeout=120)
        eventually(lambda: reads_everywhere(nodes), timeout=120)
        # a third host joins: hand-over across hosts, answers stay right meanwhile
        nodes.append(_start(hosts, 2, app, bootstrap, tmp_path, scheme, extra))
        eventually(lambda: reads_everywhere(nodes[:2]) and cluster_size(nodes[0]) == 3, 120)
        eventually(lambda: reads_everywhere(nodes), timeout=120)

        def served_by() -> set[str]:
            return {
                http.get(f"{nodes[0].url}/v1/tables/kv/keys/k{i}").headers["x-tablecast-node"]
                for i in range(KEYS)
            }

        # every host answers for some keys once the newcomer took over: reads are forwarded
        eventually(lambda: len(served_by()) == 3, timeout=120)
        ca_file = verify if not secure else str(tmp_path / "ca.pem")
        with tc.Client([n.url for n in nodes], verify=ca_file) as client:
            assert client.get("kv", "k42")["value"] == {"i": 42}

        # host 2 is cut off: the others route around it within seconds
        hosts.cut(2)
        cut_at = time.monotonic()
        failures = 0
        while time.monotonic() - cut_at < 20:
            for n in nodes[:2]:
                i = random.randrange(KEYS)
                try:
                    r = http.get(f"{n.url}/v1/tables/kv/keys/k{i}")
                except httpx.HTTPError:
                    failures += 1
                    continue
                if r.status_code == 200:
                    assert r.json()["value"] == {"i": i}
                else:
                    assert r.status_code == 503, r.text  # never wrong: unavailable at worst
                    failures += 1
        recovered = eventually(lambda: reads_everywhere(nodes[:2]), timeout=30)
        assert recovered
        print(f"\n{scheme}: after the cut, {failures} reads failed (503) before re-routing")
    finally:
        http.close()
        for n in nodes:
            stop_process(n.proc, timeout=30)
        subprocess.run(["ip", "link", "set", f"tch{hosts.tag}2", "up"], capture_output=True)
