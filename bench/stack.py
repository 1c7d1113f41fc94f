"""A throwaway stack for benchmarks: its own broker, table topics filled with synthetic rows,
and pinned serving-node processes, all stopped by pid at the end."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from confluent_kafka import Producer

from bench.common import SERVER_CPU, pinned, wait_http
from tablecast import serde
from tablecast.cli.supervisor import stop_process
from tablecast.contract.partitioner import PRODUCER_CONFIG
from tablecast.contract.table_info import TableInfo
from tablecast.kafka import catalog
from tablecast.kafka.broker import Broker, free_port
from tablecast.kafka.produce import produce_waiting
from tablecast.kafka.topics import COMPACTED, catalog_topic, ensure_topic, table_topic

log = logging.getLogger("bench")

APP = "bench"


def short_key(i: int) -> bytes:
    """The i-th key of the serving and cluster benchmarks: ``k0000012``."""
    return b"k%07d" % i


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

    def table(
        self,
        name: str,
        rows: int,
        partitions: int = 12,
        store: str = "rocksdb",
        *,
        app: str = APP,
        key_of: Callable[[int], bytes] = short_key,
    ) -> str:
        """A table topic of `app` with keys ``key_of(i)`` and 100-byte JSON values, in the catalog.

        Another `app` id keeps the table away from nodes of other apps (a node
        loads every table of its app's catalog), e.g. for memory per key.
        """
        info = TableInfo(
            name=name,
            topic=table_topic(app, name),
            partitions=partitions,
            key=serde.string().spec(),
            value=serde.json().spec(),
            store=store,  # type: ignore[arg-type]
        )
        self.topic(info.topic, partitions, COMPACTED)
        # created here first: publish's own create can find the new topic not yet in the
        # broker's metadata (ensure_topic asserts then); an existing topic is just looked up
        self.topic(catalog_topic(app), 1, COMPACTED)
        catalog.publish(self.bootstrap, app, [info])
        self.fill(info.topic, rows, key_of)
        return info.topic

    def topic(self, name: str, partitions: int, config: dict[str, str] | None = None) -> None:
        """Create a topic, waiting out the moment after creation when metadata does not list it."""
        for attempt in range(20):
            try:
                ensure_topic(self.bootstrap, name, partitions, config)
                return
            except AssertionError:
                if attempt == 19:
                    raise
                time.sleep(0.25)

    def producer(self, **config: object) -> Producer:
        """A producer partitioning like Java's, batching for bulk loads unless `config` says otherwise."""
        return Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 50,
                "batch.size": 1_000_000,
                "queue.buffering.max.messages": 2_000_000,
                "compression.type": "lz4",
                **PRODUCER_CONFIG,
                **config,
            }
        )

    def fill(self, topic: str, rows: int, key_of: Callable[[int], bytes] = short_key) -> None:
        """Produce rows ``key_of(i)`` -> ``value_of(i)`` for i < `rows` and wait until acknowledged."""
        p = self.producer()
        started = time.monotonic()
        for i in range(rows):
            produce_waiting(p, topic, key=key_of(i), value=value_of(i))
            if i % 100_000 == 0:
                p.poll(0)
                if i:
                    log.info("produced %d of %d rows to %s", i, rows, topic)
        assert p.flush(120) == 0
        log.info("produced %d rows to %s in %.1fs", rows, topic, time.monotonic() - started)

    def node(
        self,
        data_dir: Path,
        port: int | None = None,
        *extra: str,
        app: str = APP,
        cpus: str = SERVER_CPU,
        env: dict[str, str] | None = None,
    ) -> tuple[subprocess.Popen[bytes], str]:
        port = port or free_port()
        log_file = open(self.dir / f"node-{port}.log", "ab")  # noqa: SIM115 - lives as long as the node
        proc = subprocess.Popen(
            pinned(
                cpus,
                [
                    sys.executable,
                    "-m",
                    "tablecast.cli.main",
                    "serve",
                    "--app",
                    app,
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
            env={**os.environ, **env} if env else None,
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
        stop_process(proc, sig, 20)


def applied(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=5).text
    return next(
        float(x.split()[-1])
        for x in text.splitlines()
        if x.startswith("tablecast_records_applied_total")
    )
