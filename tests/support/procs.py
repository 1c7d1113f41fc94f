"""Serving nodes as real `tablecast serve` processes, started and stopped by pid."""

from __future__ import annotations

import functools
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tablecast.cli.supervisor import reap, stop_process
from tablecast.kafka.broker import free_port
from tablecast.kafka.topics import end_offsets


@functools.cache
def tls(verify: bool | str = True) -> ssl.SSLContext | bool:
    """What to pass httpx as ``verify`` (True, False, or a CA file): a context made once.
    httpx otherwise builds one per client from certifi's bundle, a few milliseconds of
    CPU each, which tests that make a client per request spent by the minute."""
    if verify is False:
        return False
    import certifi

    return ssl.create_default_context(cafile=certifi.where() if verify is True else verify)


@dataclass
class NodeProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_file: Path

    #: sent with every request of the test's own (e.g. a bearer token when auth is on)
    headers: dict[str, str] = field(default_factory=dict)
    #: the CA file for an https:// node
    verify: Any = True

    def get(self, path: str, **kw: Any) -> httpx.Response:
        headers = {**self.headers, **kw.pop("headers", {})}
        verify = self.verify
        if isinstance(verify, (bool, str, Path)):  # else a context the test made
            verify = tls(verify if isinstance(verify, bool) else str(verify))
        return httpx.get(self.url + path, timeout=10.0, headers=headers, verify=verify, **kw)

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node exited: {self.log_file.read_text()[-3000:]}")
            try:
                if self.get("/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"node {self.url} not ready; log:\n{self.log_file.read_text()[-3000:]}")

    def applied(self) -> dict[tuple[str, int], int]:
        """(table, partition) -> the lowest applied offset among the replicas that answer
        for it (active or standby) on any node of the cluster, from /v1/cluster."""
        nodes = self.get("/v1/cluster").json()["nodes"]
        lowest: dict[tuple[str, int], int] = {}
        for n in nodes:
            for r in n["replicas"]:
                if r["role"] in ("active", "standby"):
                    slot = (r["table"], r["partition"])
                    lowest[slot] = min(lowest.get(slot, r["offset"]), r["offset"])
        return lowest

    def wait_caught_up(self, bootstrap: str, table: str, topic: str, timeout: float = 60.0) -> None:
        """Wait until the cluster this node sees has applied everything `topic` holds now."""
        ends = end_offsets(bootstrap, topic)
        assert ends, f"{topic}: no such topic"

        def caught_up() -> bool:
            applied = self.applied()
            return all(applied.get((table, p), -1) >= end - 1 for p, end in ends.items())

        eventually(caught_up, timeout)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self.proc, sig, 30)


def stop_all(nodes: Iterable[NodeProcess], timeout: float = 30.0) -> None:
    """SIGTERM to every node at once, then each reaped (SIGKILL past `timeout`): nodes
    stopped together leave at once, where one stopped after another first hands its
    partitions over to those still running."""
    nodes = list(nodes)
    for node in nodes:
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for node in nodes:
        reap(node.proc, max(0.1, deadline - time.monotonic()))


def start_node(
    app_id: str, bootstrap: str, log_dir: Path, *extra: str, port: int | None = None
) -> NodeProcess:
    """A node on a free port (or `port`), its data under `log_dir` unless --data-dir is given:
    a directory of its own, also when an earlier node of the test had the same port (a
    store restored by that node would make this one ready without reading a record)."""
    port = port or free_port()
    if "--data-dir" not in extra:
        data = log_dir / f"node-{port}-data"
        n = 1
        while data.exists():
            n += 1
            data = log_dir / f"node-{port}-data-{n}"
        extra = (*extra, "--data-dir", str(data))
    log_file = log_dir / f"node-{port}.log"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tablecast.cli.main",
                "serve",
                "--app",
                app_id,
                "--bootstrap-servers",
                bootstrap,
                "--port",
                str(port),
                *extra,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    scheme = "https" if "--tls-cert" in extra else "http"
    return NodeProcess(proc, f"{scheme}://127.0.0.1:{port}", log_file)


def free_port_run(n: int) -> int:
    """The first of `n` consecutive loopback ports that are all free right now (for
    `tablecast dev --nodes n --port P`, whose node i listens on P + i)."""
    from tablecast.http.listen import cannot_listen

    while True:
        first = free_port()
        if first + n <= 65536 and not any(cannot_listen("127.0.0.1", first + i) for i in range(n)):
            return first


def eventually(check, timeout: float = 60.0, interval: float = 0.25):  # type: ignore[no-untyped-def]
    """Call `check` until it returns a truthy value (returned) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except AssertionError as e:
            last = e
        time.sleep(interval)
    raise AssertionError(f"not true within {timeout}s: last result {last!r}")
