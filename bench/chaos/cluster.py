"""The system under test: its own broker, the pipeline, three nodes and a steady producer."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

import tablecast as tc
from tablecast.cli.supervisor import stop_process
from tablecast.kafka.broker import Broker, free_port
from tablecast.kafka.produce import produce_waiting
from tablecast.kafka.topics import ensure_topic, table_topic
from tests.support.apt import FAKETIME_LIB, faketime
from tests.support.procs import NodeProcess, start_node

log = logging.getLogger("bench.chaos")

PARTITIONS = 6
KEYS = 3000
TABLE = "t"
CND_SHIM = Path(__file__).resolve().parents[2] / "tests" / "support" / "cnd_shim.c"

APP = """
import tablecast as tc

app = tc.App({app!r}, trigger="300 milliseconds")
rows = app.table({topic!r}, key=tc.serde.string(), value=tc.serde.json())
rows.filter(lambda k, v: v["n"] % 3 != 0).map_values(
    lambda k, v: {{"n": v["n"], "d": v["n"] * 2}}
).materialize({table!r})
"""


def expected_value(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """The App's logic on one input value: what the table should hold for its key."""
    if v is None or v["n"] % 3 == 0:
        return None
    return {"n": v["n"], "d": v["n"] * 2}


@dataclass
class Cluster:
    work: Path
    app_id: str = "chaos"
    faketime_node: int | None = 2
    tmpfs_node: int | None = 1
    #: a node with a read process beside it (serve --processes 2): its reads are judged too
    readers_node: int | None = 0
    broker: Broker = field(init=False)
    pipeline: subprocess.Popen[bytes] | None = None
    nodes: list[NodeProcess] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    #: each node's PostgreSQL port (serve --pg-port), the same across its restarts
    pg_ports: list[int] = field(default_factory=list)
    mounted: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: nodes started again and not ready yet
    unready: set[int] = field(default_factory=set)
    #: reads `readers_node`'s read processes answered in its lives before this one
    by_read_process_before: int | None = None

    @property
    def input_topic(self) -> str:
        return f"{self.app_id}-in"

    @property
    def table_topic(self) -> str:
        return table_topic(self.app_id, TABLE)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.broker = Broker(self.work / "broker", free_port())
        self.broker.start()
        ensure_topic(self.bootstrap, self.input_topic, PARTITIONS)
        (self.work / "app.py").write_text(
            APP.format(app=self.app_id, topic=self.input_topic, table=TABLE)
        )
        self.start_pipeline()
        self.ports = [free_port() for _ in range(3)]
        self.pg_ports = [free_port() for _ in range(3)]
        self._prepare_tmpfs()
        self._prepare_faketime()
        for i in range(3):
            self.nodes.append(self._launch(i))
        for n in self.nodes:
            n.wait_ready(180)

    # pipeline -------------------------------------------------------------
    def start_pipeline(self) -> None:
        with open(self.work / "pipeline.log", "ab") as out:
            self.pipeline = subprocess.Popen(
                [
                    *(sys.executable, "-m", "tablecast.cli.main", "run"),
                    str(self.work / "app.py"),
                    *("--bootstrap-servers", self.bootstrap),
                    *("--state-dir", str(self.work / "state")),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # the driver and its JVM, killed as one group
            )

    def kill_pipeline(self, sig: int = signal.SIGKILL) -> None:
        p = self.pipeline
        if p is None or p.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)

    # nodes ------------------------------------------------------------------
    def data_dir(self, i: int) -> Path:
        return self.work / f"node{i}-data"

    def _prepare_tmpfs(self) -> None:
        if self.tmpfs_node is None:
            return
        d = self.data_dir(self.tmpfs_node)
        d.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            self.notes.append("disk-full: skipped, not root (mount needs root)")
            self.tmpfs_node = None
            return
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(d)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            self.notes.append(f"disk-full: skipped, mount failed: {r.stderr.strip()}")
            self.tmpfs_node = None
            return
        self.mounted.append(d)

    def _prepare_faketime(self) -> None:
        if self.faketime_node is None:
            return
        if faketime() is None or shutil.which("cc") is None:
            self.notes.append("faketime: skipped, needs libfaketime and cc")
            self.faketime_node = None
            return
        self.shim = self.work / "cnd_shim.so"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O2", "-o", str(self.shim), str(CND_SHIM)], check=True
        )

    def _launch(self, i: int) -> NodeProcess:
        saved = {
            k: os.environ.get(k) for k in ("LD_PRELOAD", "FAKETIME", "FAKETIME_DONT_FAKE_MONOTONIC")
        }
        if i == self.faketime_node:
            # librdkafka waits with C11 cnd_timedwait, which libfaketime misses: the shim
            # routes it through pthread_cond_timedwait. Monotonic clocks stay real, as
            # between two hosts whose wall clocks differ.
            os.environ["LD_PRELOAD"] = f"{self.shim} {FAKETIME_LIB}"
            os.environ["FAKETIME"] = "+20s"
            os.environ["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
        try:
            return start_node(
                self.app_id,
                self.bootstrap,
                self.work,
                *("--data-dir", str(self.data_dir(i))),
                *("--standby-replicas", "1"),
                *("--pg-port", str(self.pg_ports[i])),
                *(("--processes", "2") if i == self.readers_node else ()),
                port=self.ports[i],
            )
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def restart_node(self, i: int, sig: int | None) -> None:
        """Stop node i with `sig` (None: it is already gone) and start it again."""
        n = self.nodes[i]
        if i == self.readers_node and n.proc.poll() is None:  # its count ends with it
            count = self._read_process_count()
            if count is not None:
                self.by_read_process_before = (self.by_read_process_before or 0) + count
        if sig is not None and n.proc.poll() is None:
            if sig == signal.SIGKILL:
                n.proc.kill()
                n.proc.wait(30)
            else:
                stop_process(n.proc, sig, 30)
        self.unready.add(i)
        self.nodes[i] = self._launch(i)
        self.nodes[i].wait_ready(180)
        self.unready.discard(i)

    def answered_by_read_processes(self) -> int | None:
        """Reads the read process of `readers_node` answered in the soak: in its earlier
        lives (counted as each ended) and this one (None: it has none, or never said)."""
        if self.readers_node is None:
            return None
        now = self._read_process_count()
        if now is None and self.by_read_process_before is None:
            return None
        return (self.by_read_process_before or 0) + (now or 0)

    def _read_process_count(self) -> int | None:
        """What `readers_node`'s read processes answered since it last started."""
        try:
            text = self.nodes[self.readers_node].get("/metrics").text  # type: ignore[index]
        except httpx.HTTPError:
            return None
        found = re.search(r"^tablecast_http_requests_by_read_processes_total (\S+)$", text, re.M)
        return int(float(found[1])) if found else None

    def urls(self) -> list[str]:
        """The nodes readers may send to: as behind a load balancer with a readiness probe,
        a node restarted gets traffic once its /readyz says so."""
        return [n.url for i, n in enumerate(self.nodes) if i not in self.unready]

    def sql_ports(self) -> list[int]:
        """The PostgreSQL ports readers may connect to, as :meth:`urls`."""
        return [p for i, p in enumerate(self.pg_ports) if i not in self.unready]

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc.poll() is None:
                stop_process(n.proc, signal.SIGTERM, 30)
        self.kill_pipeline(signal.SIGTERM)
        self.broker.stop()
        for d in self.mounted:
            subprocess.run(["umount", "-l", str(d)], check=False)


class Producer:
    """Upserts and deletes over KEYS keys at a steady rate; keeps what Kafka acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: int, seed: int) -> None:
        self.p = tc.producer(bootstrap, {"linger.ms": 20})
        # malformed records go through a producer of their own: flushing the shared one from
        # the injector's thread served its delivery callbacks there, out of order with the
        # producing thread's, and once left the producing thread stalled for good
        self.bad = tc.producer(bootstrap)
        self.topic, self.rate = topic, rate
        self.rng = random.Random(seed ^ 0x5EED)
        #: key -> its last acknowledged input value (None: a delete)
        self.acked: dict[str, dict[str, Any] | None] = {}
        self.sent = self.acked_n = self.failed = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def _run(self) -> None:
        tick = 0.05
        per_tick = max(1, int(self.rate * tick))
        next_at = time.monotonic()
        while not self.stopping.is_set():
            for _ in range(per_tick):
                k = f"k{self.rng.randrange(KEYS):05d}"
                v = None if self.rng.random() < 0.1 else {"n": self.rng.randrange(1000)}
                self._send(k, v)
            self.p.poll(0)
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))
        self.p.flush(120)

    def _send(self, k: str, v: dict[str, Any] | None) -> None:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                self.failed += 1
                return
            # callbacks of one partition come in offset order, so the last one wins
            self.acked[k] = v
            self.acked_n += 1

        payload = None if v is None else orjson.dumps(v)
        # waits while the queue is full (the broker away)
        produce_waiting(self.p, self.topic, 0.1, key=k.encode(), value=payload, on_delivery=done)
        self.sent += 1

    def raw(self, topic: str, key: bytes, value: bytes | None) -> None:
        """One record as given (malformed on purpose); not part of the acknowledged input."""
        self.bad.produce(topic, key=key, value=value)
        self.bad.flush(30)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(180)
