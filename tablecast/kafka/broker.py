"""A single-node Apache Kafka broker (KRaft) for development and tests.

The broker runs from the jars of ``tablecast/_jvm/kafka-broker`` in a data directory that
holds everything about it: ``server.properties``, the formatted log dir,
``broker.pid`` and ``broker.log``. ``start`` is idempotent: a broker already
running on that data dir is reused.
"""

from __future__ import annotations

import base64
import logging
import os
import random
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from tablecast import jvm, lifetime
from tablecast.kafka.config import KafkaConfig
from tablecast.kafka.secure import SecureMaterial

log = logging.getLogger(__name__)

DEFAULT_PORT = 9092
READY_PROBE = "__tablecast_ready"
START_TIMEOUT_S = 90.0

_LOG4J2 = """\
Configuration:
  status: warn
  Appenders:
    File:
      name: file
      fileName: "{log_file}"
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: info
      AppenderRef:
        - ref: file
"""


@dataclass(frozen=True)
class Broker:
    """A broker's data directory and ports; the process itself is found by its pid file."""

    data_dir: Path
    port: int = DEFAULT_PORT
    #: SASL_SSL (SCRAM-SHA-512) only, with a CA of its own; see :mod:`tablecast.kafka.secure`
    secure: bool = False
    #: as one of several brokers (see :mod:`tablecast.kafka.dev_cluster`): its id, every voter's
    #: (id, controller port), the shared cluster id and TLS material, and the RF of internal topics
    node_id: int = 1
    voters: tuple[tuple[int, int], ...] = ()
    cluster_id: str | None = None
    tls_dir: Path | None = None
    replication: int = 1
    #: the address clients reach it on (the controller stays on loopback)
    host: str = "127.0.0.1"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def material(self) -> SecureMaterial:
        return SecureMaterial(self.tls_dir or self.data_dir / "tls")

    @property
    def client_properties(self) -> Path | None:
        """The client settings to pass as ``--kafka-config`` (None for a plaintext broker)."""
        path = self.material.client_properties
        return path if path.exists() else None

    def client_config(self) -> KafkaConfig:
        path = self.client_properties
        return KafkaConfig.load(path) if path is not None else KafkaConfig()

    @property
    def _dumped_classes(self) -> Path:
        """Where a broker started before its classpath had an archive writes one at exit."""
        return self.data_dir / "classes.jsa"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def pid(self) -> int | None:
        """The pid of the running broker, or None (a stale pid file is removed)."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None
        if _alive(pid):
            return pid
        self.pid_file.unlink(missing_ok=True)
        return None

    def start(self, timeout: float = START_TIMEOUT_S, die_with_parent: bool = False) -> int:
        """Start the broker (or reuse a running one) and wait until it takes requests.

        `die_with_parent`: the broker gets SIGKILL if the starting process dies
        (``tablecast dev``); ``tablecast kafka start`` leaves it running on purpose.
        """
        pid = self.launch(die_with_parent)
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return pid

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> None:
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"the Kafka broker is not running; see {self.log_file}")
        _wait_ready(self, timeout, pid)

    def launch(self, die_with_parent: bool = False) -> int:
        """Start the broker process (or find the running one) without waiting for it."""
        pid = self.pid()
        if pid is not None:
            return pid
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.secure:
            self.material.ensure()
        props = self._write_config(self._controller_port())
        classpath = jvm.classpath("kafka-broker")
        if not (self.data_dir / "logs" / "meta.properties").exists():
            self._format(classpath, props)
        log.info("starting Kafka broker on %s (log: %s)", self.bootstrap_servers, self.log_file)
        with open(self.data_dir / "broker.stdout", "ab") as out:
            proc = subprocess.Popen(
                [
                    "java",
                    *jvm.class_archive_options(classpath, dump_to=self._dumped_classes),
                    "-Xms256m",
                    "-Xmx1g",
                    f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.yaml'}",
                    "-cp",
                    classpath,
                    "kafka.Kafka",
                    str(props),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # its own session: a Ctrl-C meant for `tablecast dev` must not
                # kill the broker before the pipeline and nodes have stopped
                start_new_session=True,
                preexec_fn=lifetime.die_with_parent if die_with_parent else None,
            )
        self.pid_file.write_text(f"{proc.pid}\n")
        return proc.pid

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker cleanly (SIGTERM, then SIGKILL after `timeout`). False if none ran."""
        pid = self.pid()
        if pid is None:
            return False
        log.info("stopping Kafka broker (pid %d)", pid)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            while _alive(pid):
                time.sleep(0.05)
            self._dumped_classes.unlink(missing_ok=True)  # perhaps cut off while written
        self.pid_file.unlink(missing_ok=True)
        if self._dumped_classes.exists():
            try:
                jvm.keep_class_archive(jvm.classpath("kafka-broker"), self._dumped_classes)
            except (OSError, jvm.JavaMissing) as e:  # the archive only quickens later starts
                log.warning("could not keep the broker's class archive: %s", e)
        return True

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        mode = "SASL_SSL" if self.client_properties else "PLAINTEXT"
        text = f"running (pid {pid}) on {self.bootstrap_servers} ({mode})"
        if self.client_properties:
            text += f"\nclient settings (--kafka-config): {self.client_properties}"
        return text

    def _controller_port(self) -> int:
        if self.voters:
            return dict(self.voters)[self.node_id]
        # KRaft records the controller's endpoint when the log dir is formatted,
        # so a restarted broker must keep the controller port it was born with
        props = self.data_dir / "server.properties"
        if props.exists():
            for line in props.read_text().splitlines():
                if line.startswith("controller.quorum.bootstrap.servers="):
                    return int(line.rsplit(":", 1)[1])
        return _free_port()

    def _write_config(self, controller_port: int) -> Path:
        props = self.data_dir / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},"
            f"CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": str(self.replication),
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": str(self.replication),
            "transaction.state.log.min.isr": str(min(2, self.replication)),
            "share.coordinator.state.topic.replication.factor": str(self.replication),
            "share.coordinator.state.topic.min.isr": str(min(2, self.replication)),
            "default.replication.factor": str(self.replication),
            "min.insync.replicas": str(min(2, self.replication)),
            # a dev broker serves one machine: joining consumers need not wait
            "group.initial.rebalance.delay.ms": "0",
            # how often the controller appends a no-op record to the metadata log: Kafka's
            # 500 ms keeps an idle broker busy, and nothing of a one-machine broker waits on it
            "metadata.max.idle.interval.ms": "5000",
            # topics are created with their partition counts by tablecast;
            # a typo in a topic name should fail, not make a 1-partition topic
            "auto.create.topics.enable": "false",
        }
        if self.voters:  # a static quorum of every broker of the cluster
            del settings["controller.quorum.bootstrap.servers"]
            settings["controller.quorum.voters"] = ",".join(
                f"{i}@127.0.0.1:{port}" for i, port in self.voters
            )
        if self.secure:
            # clients get SASL_SSL only; the controller listener stays plaintext on loopback
            settings.update(self.material.broker_settings(self.port))
            settings["listeners"] += f",CONTROLLER://127.0.0.1:{controller_port}"
            settings["listener.security.protocol.map"] = "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
        props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        (self.data_dir / "log4j2.yaml").write_text(_LOG4J2.format(log_file=self.log_file))
        return props

    def _format(self, classpath: str, props: Path) -> None:
        cluster_id = self.cluster_id or new_cluster_id()
        log.info("formatting KRaft log dir %s", self.data_dir / "logs")
        subprocess.run(
            [
                "java",
                *jvm.class_archive_options(classpath),
                "-cp",
                classpath,
                f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.yaml'}",
                "kafka.tools.StorageTool",
                "format",
                *([] if self.voters else ["--standalone"]),
                "-t",
                cluster_id,
                "-c",
                str(props),
                *(self.material.scram_format_args() if self.secure else []),
            ],
            check=True,
            capture_output=True,
        )


def new_cluster_id() -> str:
    cluster_id = "-"
    while cluster_id.startswith("-"):  # the tool would read a leading '-' as an option
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster_id


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still answers kill(0); reap it if it is ours
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


#: listening ports are picked from here up to where the kernel's ports for outgoing
#: connections begin (ip_local_port_range): an outgoing connection never takes one between
#: its pick and its listen, nor while its broker restarts (a KRaft controller keeps its port)
LISTEN_PORTS_FROM = 10_000
_pick = random.SystemRandom()


def _outgoing_ports_from() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _free_port() -> int:
    below = _outgoing_ports_from()
    if below - LISTEN_PORTS_FROM >= 1000:
        for _ in range(100):
            port = _pick.randrange(LISTEN_PORTS_FROM, below)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    with socket.socket() as s:  # no such range here: any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port() -> int:
    """A TCP port on loopback that is free right now, outside the range the kernel hands
    out to outgoing connections."""
    return _free_port()


def _last_error(log_file: Path) -> str:
    """The log's last ERROR line, for the message of a start that failed (the log may be
    gone by the time someone reads it, a test's temporary directory removed)."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line for line in lines if " ERROR " in line or "Exception" in line]
    return f"; its last error: {errors[-1][:500]}" if errors else ""


def _wait_ready(broker: Broker, timeout: float, pid: int) -> None:
    """Wait until the broker can create a topic, showing progress.

    Answering metadata is not enough: a KRaft broker lists itself while still
    fenced, and creating a topic then fails with INVALID_REPLICATION_FACTOR.
    """
    from confluent_kafka.admin import AdminClient, NewTopic

    deadline = time.monotonic() + timeout
    port, log_file = broker.port, broker.log_file
    conf = {**broker.client_config().librdkafka, "log_level": 0}
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers, **conf})
    last_note = time.monotonic()
    while True:
        if not _alive(pid):
            raise RuntimeError(
                f"the Kafka broker exited during start; see {log_file}{_last_error(log_file)}"
            )
        try:
            md = admin.list_topics(timeout=2)
            # a fenced broker (still catching up with the quorum) is left out of metadata
            if broker.node_id in md.brokers and READY_PROBE in md.topics:
                return
            if broker.node_id in md.brokers:
                admin.create_topics([NewTopic(READY_PROBE, 1, 1)])[READY_PROBE].result(5)
                return
        except Exception:  # not up yet: the client raises while it cannot connect or is fenced
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the Kafka broker did not come up in {timeout:.0f}s; see {log_file}"
            )
        if time.monotonic() - last_note > 5:
            log.info("waiting for the Kafka broker on port %d ...", port)
            last_note = time.monotonic()
        time.sleep(0.3)
