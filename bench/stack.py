"""A throwaway stack for benchmarks: its own broker, table topics filled with synthetic rows,
and pinned serving-node processes, all stopped by pid at the end."""

from __future__ import annotations

import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from confluent_kafka import Producer

from bench.common import SERVER_CPU, pinned, wait_http
from tablecast import serde
from tablecast.kafka import catalog
from tablecast.kafka.broker import Broker, free_port
from tablecast.kafka.partitioner import PRODUCER_CONFIG
from tablecast.kafka.topics import COMPACTED, ensure_topic, table_topic

log = logging.getLogger("bench")

APP = "bench"


def value_of(i: int) -> bytes:
    """A 100-byte JSON value."""
    body = b'{"id":%d,"price":%d.25,"exchange":"NASDAQ","pad":"' % (i, i % 1000)
    return body + b"x" * (98 - len(body)) + b'"}'


class Stack:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tablecast-bench-"))
        self.broker = Broker(self.dir / "kafka", free_port())
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Stack:
        self.broker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            self.stop(p)
        self.broker.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    def table(self, name: str, rows: int, partitions: int = 12, store: str = "rocksdb") -> str:
        """A table topic with keys k0000000.. and 100-byte JSON values, in the catalog."""
        info = catalog.TableInfo(
            name=name,
            topic=table_topic(APP, name),
            partitions=partitions,
            key=serde.string().spec(),
            value=serde.json().spec(),
            store=store,  # type: ignore[arg-type]
        )
        ensure_topic(self.bootstrap, info.topic, partitions, COMPACTED)
        catalog.publish(self.bootstrap, APP, [info])
        p = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 2_000_000,
                "compression.type": "lz4",
                **PRODUCER_CONFIG,
            }
        )
        started = time.monotonic()
        for i in range(rows):
            while True:
                try:
                    p.produce(info.topic, key=b"k%07d" % i, value=value_of(i))
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 100_000 == 0:
                p.poll(0)
                if i:
                    log.info("produced %d of %d rows to %s", i, rows, info.topic)
        assert p.flush(120) == 0
        log.info("produced %d rows in %.1fs", rows, time.monotonic() - started)
        return info.topic

    def node(
        self, data_dir: Path, port: int | None = None, *extra: str
    ) -> tuple[subprocess.Popen[bytes], str]:
        port = port or free_port()
        log_file = open(self.dir / f"node-{port}.log", "ab")  # noqa: SIM115 - lives as long as the node
        proc = subprocess.Popen(
            pinned(
                SERVER_CPU,
                [
                    sys.executable,
                    "-m",
                    "tablecast.cli.main",
                    "serve",
                    "--app",
                    APP,
                    "--bootstrap-servers",
                    self.bootstrap,
                    "--port",
                    str(port),
                    "--data-dir",
                    str(data_dir),
                    *extra,
                ],
            ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        return proc, f"http://127.0.0.1:{port}"

    def baseline(self, stack: str) -> tuple[subprocess.Popen[bytes], str]:
        port = free_port()
        proc = subprocess.Popen(
            pinned(SERVER_CPU, [sys.executable, "-m", "bench.baselines", stack, str(port)]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/", proc=proc)
        return proc, url

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def applied(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return next(
        float(x.split()[-1])
        for x in text.splitlines()
        if x.startswith("tablecast_records_applied_total")
    )
