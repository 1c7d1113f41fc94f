"""The Kafka Streams interactive-queries reference app, built and run as processes.

``kafka-streams-iq/`` holds a small Java app (see its README): a KTable in a
RocksDB store behind ``GET /keys/{k}``, forwarding to the owning instance found
with ``KafkaStreams.queryMetadataForKey``. This module builds its fat jar with
Maven (once; rebuilt only when a source or the pom is newer than the jar),
starts N instances on free loopback ports against a broker and topic, waits
until every instance is RUNNING and sees all the others, and stops them by pid.

    from bench.peers import kafka_streams as ks
    with ks.start(bootstrap, "prices", n=2, work_dir=tmp) as cluster:
        cluster.wait_caught_up(bootstrap)
        httpx.get(cluster.urls[0] + "/keys/AAPL").json()  # {"key": "AAPL", "value": {...}}
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx

from tablecast.cli.supervisor import reap, stop_process

log = logging.getLogger(__name__)

APP_DIR = Path(__file__).resolve().parent / "kafka-streams-iq"
JAR = APP_DIR / "target" / "kafka-streams-iq.jar"
# Spark's and other parent poms name repositories this network cannot reach;
# the settings file mirrors every lookup to Maven Central
MAVEN_SETTINGS = Path(__file__).resolve().parents[2] / "tablecast" / "_jvm" / "settings.xml"

READY_TIMEOUT_S = 180.0


def _sources() -> list[Path]:
    return [APP_DIR / "pom.xml", *sorted((APP_DIR / "src").rglob("*"))]


def _fresh() -> bool:
    if not JAR.exists():
        return False
    newest = max(p.stat().st_mtime for p in _sources() if p.is_file())
    return JAR.stat().st_mtime >= newest


def build(force: bool = False) -> Path:
    """The app's fat jar, running ``mvn package`` unless the jar is newer than every source."""
    # two harnesses or test workers building at once would clobber target/, and the jar is
    # judged fresh under the lock only: Maven writes a plain jar before the shaded one
    # replaces it, and a look in between would take a jar without its main class
    lock_file = APP_DIR / "target" / ".build.lock"
    lock_file.parent.mkdir(exist_ok=True)
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and _fresh():
            return JAR  # built by whoever held the lock
        return _mvn_package()


def _mvn_package() -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven (mvn) is needed to build bench/peers/kafka-streams-iq")
    log.info("building %s with Maven (the first build downloads Kafka Streams) ...", JAR.name)
    started = time.monotonic()
    cmd = [mvn, "-B", "-q", "-s", str(MAVEN_SETTINGS), "-f", str(APP_DIR / "pom.xml"), "package"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 or not JAR.exists():
        raise RuntimeError(
            f"mvn package failed in {APP_DIR}:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
        )
    log.info("built %s in %.1fs", JAR, time.monotonic() - started)
    return JAR


def free_port() -> int:
    """A TCP port on loopback that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_pid(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """Stop a process we started: SIGTERM (a clean Kafka Streams close), SIGKILL after `timeout`."""
    stop_process(proc, signal.SIGTERM, timeout)


@dataclass
class Instance:
    """One running instance of the app."""

    proc: subprocess.Popen[bytes]
    port: int
    state_dir: Path
    log_file: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def host(self) -> str:
        """Its ``application.server``, as the other instances name it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def get(self, path: str, timeout: float = 10.0) -> httpx.Response:
        return httpx.get(self.url + path, timeout=timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def positions(self) -> dict[int, int]:
        """Input partition -> offset of the last record its local active store applied."""
        body = self.get("/positions").json()
        return {int(p): int(o) for p, o in body["positions"].items()}

    def stop(self, timeout: float = 20.0) -> None:
        stop_pid(self.proc, timeout)

    def kill(self) -> None:
        """kill -9, for failover measurements."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class Cluster:
    """The instances of one application id; a context manager that stops them all."""

    topic: str
    application_id: str
    instances: list[Instance] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [i.url for i in self.instances]

    @property
    def pids(self) -> list[int]:
        return [i.pid for i in self.instances]

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Wait until every instance is RUNNING and lists all instances as members.

        A lone RUNNING instance is not enough: when the next one joins, the group
        rebalances and partitions move, so this also waits for a membership in
        which every instance has been assigned (when there are enough partitions).
        """
        deadline = time.monotonic() + timeout
        started = time.monotonic()
        last_note = started
        want = {i.host for i in self.instances}
        while True:
            status = [self._status(i, want) for i in self.instances]
            if all(s == "ok" for s in status):
                log.info(
                    "kafka-streams-iq: %d instance(s) ready in %.1fs",
                    len(self.instances),
                    time.monotonic() - started,
                )
                return
            now = time.monotonic()
            if now > deadline:
                tails = "\n".join(f"--- {i.log_file}\n{i.log_tail()}" for i in self.instances)
                raise TimeoutError(
                    f"kafka-streams-iq not ready in {timeout:.0f}s: {status}\n{tails}"
                )
            if now - last_note > 5:
                log.info("waiting for kafka-streams-iq (%.0fs): %s", now - started, status)
                last_note = now
            time.sleep(0.25)

    def _status(self, inst: Instance, want: set[str]) -> str:
        if not inst.alive():
            raise RuntimeError(
                f"kafka-streams-iq on port {inst.port} exited ({inst.proc.returncode}):\n"
                + inst.log_tail()
            )
        try:
            ready = inst.get("/ready", timeout=2)
            if ready.status_code != 200:
                return f"{inst.port}: {ready.json().get('state')}"
            hosts = inst.get("/hosts", timeout=2).json()["hosts"]
        except (httpx.HTTPError, ValueError):
            return f"{inst.port}: not listening"
        seen = {h["host"] for h in hosts}
        if seen != want:
            return f"{inst.port}: sees {len(seen)} of {len(want)} instances"
        active = [p for h in hosts for p in h["active"]]
        if len(active) >= len(want) and any(not h["active"] for h in hosts):
            return f"{inst.port}: assignment not balanced yet"
        return "ok"

    def wait_caught_up(self, bootstrap: str, timeout: float = 120.0) -> None:
        """Wait until the instances' stores have applied everything the topic holds now."""
        ends = end_offsets(bootstrap, self.topic)
        deadline = time.monotonic() + timeout
        while True:
            applied: dict[int, int] = {}
            for inst in self.instances:
                # an instance restarting or rebalancing is asked again next round
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    applied.update(inst.positions())
            behind = {p: end for p, end in ends.items() if end > 0 and applied.get(p, -1) < end - 1}
            if not behind:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"kafka-streams-iq behind on {self.topic}: partitions {sorted(behind)}; "
                    f"applied {applied}, ends {ends}"
                )
            time.sleep(0.2)

    def wait_for_values(self, expected: Mapping[str, object], timeout: float = 120.0) -> None:
        """Wait until every instance answers every key in `expected` with that (decoded) value."""
        deadline = time.monotonic() + timeout
        pending = dict(expected)
        with httpx.Client(timeout=5.0) as client:
            while True:
                for key, want in list(pending.items()):
                    ok = True
                    for inst in self.instances:
                        r = client.get(f"{inst.url}/keys/{key}")
                        if r.status_code != 200 or r.json()["value"] != want:
                            ok = False
                            break
                    if ok:
                        del pending[key]
                if not pending:
                    return
                if time.monotonic() > deadline:
                    sample = dict(list(pending.items())[:5])
                    raise TimeoutError(f"{len(pending)} keys not answered as expected: {sample}")
                time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every instance by pid (in parallel: each close takes a few seconds)."""
        for inst in self.instances:
            if inst.alive():
                os.kill(inst.pid, signal.SIGTERM)
        for inst in self.instances:
            reap(inst.proc, timeout)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> end offset (the next offset to be written) of `topic`."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peers-ends-{uuid.uuid4().hex}"})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    finally:
        c.close()


def command(
    bootstrap: str,
    topic: str,
    *,
    application_id: str,
    port: int,
    state_dir: Path,
    cpus: str | None = None,
    heap: str = "512m",
    stream_threads: int = 1,
    http_threads: int | None = None,
    standby_replicas: int = 0,
    props: Mapping[str, str] | None = None,
    jvm_opts: Sequence[str] = (),
    http: str = "jdk",
    group_sums: bool = False,
) -> list[str]:
    """The command line of one instance (``taskset -c cpus`` first when `cpus` is given).

    `http` is the HTTP server: "jdk" (com.sun.net.httpserver), "jetty" (Jetty 12, seed
    001's stack) or "netty" (Reactor Netty, under seed 000's Spring reactive web).
    `group_sums`: the store holds the topic's rows {"g", "n"} grouped by g with n summed
    (a table group_by/reduce), not the rows.
    `props` are extra Kafka Streams settings (``--prop k=v``); `jvm_opts` go to
    ``java`` before ``-jar``. Under taskset the JVM sees one CPU and picks its
    collector and thread counts for that by itself.
    """
    cmd = ["taskset", "-c", cpus] if cpus else []
    cmd += [
        "java",
        f"-Xms{heap}",
        f"-Xmx{heap}",
        *jvm_opts,
        "-jar",
        str(build()),
        "--bootstrap-servers",
        bootstrap,
        "--topic",
        topic,
        "--application-id",
        application_id,
        "--port",
        str(port),
        "--application-server",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(state_dir),
        "--stream-threads",
        str(stream_threads),
        "--standby-replicas",
        str(standby_replicas),
        "--http",
        http,
    ]
    if http_threads is not None:
        cmd += ["--http-threads", str(http_threads)]
    if group_sums:
        cmd += ["--group-sums", "true"]
    for k, v in (props or {}).items():
        cmd += ["--prop", f"{k}={v}"]
    return cmd


def start_instance(
    bootstrap: str,
    topic: str,
    *,
    application_id: str,
    work_dir: Path,
    port: int | None = None,
    cpus: str | None = None,
    **options: object,
) -> Instance:
    """Start one instance (not waiting for it); its state and log go under `work_dir`.

    `options` are :func:`command`'s keywords (heap, stream_threads, http_threads,
    standby_replicas, props, jvm_opts, http). Reusing a `port` and `work_dir` restarts an
    instance on its old state, for restart-to-ready measurements.
    """
    port = port or free_port()
    state_dir = work_dir / f"ks-{port}"
    state_dir.mkdir(parents=True, exist_ok=True)
    log_file = work_dir / f"ks-{port}.log"
    cmd = command(
        bootstrap,
        topic,
        application_id=application_id,
        port=port,
        state_dir=state_dir,
        cpus=cpus,
        **options,  # type: ignore[arg-type]
    )
    log.info("starting kafka-streams-iq on port %d%s", port, f" (cpus {cpus})" if cpus else "")
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # its own session: a Ctrl-C meant for the harness must not kill the
            # instances before the harness has stopped them and read their logs
            start_new_session=True,
        )
    return Instance(proc, port, state_dir, log_file)


def start(
    bootstrap: str,
    topic: str,
    n: int = 1,
    *,
    work_dir: Path,
    application_id: str | None = None,
    cpus: str | None = None,
    ports: Sequence[int] | None = None,
    wait: bool = True,
    ready_timeout: float = READY_TIMEOUT_S,
    **options: object,
) -> Cluster:
    """Start `n` instances of one application and (by default) wait until all are ready.

    They start together, so the first assignment already spreads the partitions
    (Kafka Streams' high-availability assignor would otherwise leave them on the
    first, caught-up instance until a probing rebalance ten minutes later).
    Stops whatever it started if the wait fails.
    """
    build()
    cluster = Cluster(topic, application_id or f"ks-iq-{uuid.uuid4().hex[:8]}")
    try:
        for i in range(n):
            cluster.instances.append(
                start_instance(
                    bootstrap,
                    topic,
                    application_id=cluster.application_id,
                    work_dir=work_dir,
                    port=ports[i] if ports else None,
                    cpus=cpus,
                    **options,
                )
            )
        if wait:
            cluster.wait_ready(ready_timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
