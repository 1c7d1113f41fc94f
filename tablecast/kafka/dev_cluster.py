"""Several dev brokers as one Kafka cluster: ``tablecast kafka start --brokers N``.

N combined broker+controller nodes on ports P … P+N−1 form one KRaft quorum
(static voters), each in ``<data dir>/broker-<i>``; the layout is kept in
``cluster.json`` so ``kafka stop --broker I`` and ``kafka start --broker I``
act on one broker later. Internal topics are replicated min(3, N) times with
min.insync.replicas min(2, RF), so one broker can be stopped without losing an
acknowledged record. With ``--secure`` every broker shares one CA and user.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tablecast.kafka.broker import START_TIMEOUT_S, Broker, free_port, new_cluster_id
from tablecast.kafka.config import KafkaConfig
from tablecast.kafka.secure import SecureMaterial

LAYOUT = "cluster.json"


@dataclass(frozen=True)
class KafkaCluster:
    data_dir: Path
    brokers: tuple[Broker, ...]

    @classmethod
    def create(cls, data_dir: Path, port: int, count: int, secure: bool = False) -> KafkaCluster:
        """The cluster kept in `data_dir`, laid out on first use."""
        layout_file = data_dir / LAYOUT
        if layout_file.exists():
            return cls.load(data_dir)
        layout = {
            "port": port,
            "count": count,
            "secure": secure,
            "cluster_id": new_cluster_id(),
            "controller_ports": [free_port() for _ in range(count)],
        }
        data_dir.mkdir(parents=True, exist_ok=True)
        layout_file.write_text(json.dumps(layout, indent=2))
        return cls.load(data_dir)

    @classmethod
    def load(cls, data_dir: Path) -> KafkaCluster:
        layout = json.loads((data_dir / LAYOUT).read_text())
        count = layout["count"]
        voters = tuple((i + 1, layout["controller_ports"][i]) for i in range(count))
        brokers = tuple(
            Broker(
                data_dir / f"broker-{i}",
                layout["port"] + i,
                secure=layout["secure"],
                node_id=i + 1,
                voters=voters,
                cluster_id=layout["cluster_id"],
                tls_dir=data_dir / "tls",
                replication=min(3, count),
            )
            for i in range(count)
        )
        return cls(data_dir, brokers)

    @staticmethod
    def exists(data_dir: Path) -> bool:
        return (data_dir / LAYOUT).exists()

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.bootstrap_servers for b in self.brokers)

    @property
    def client_properties(self) -> Path | None:
        path = SecureMaterial(self.data_dir / "tls").client_properties
        return path if path.exists() else None

    def client_config(self) -> KafkaConfig:
        path = self.client_properties
        return KafkaConfig.load(path) if path is not None else KafkaConfig()

    def start(self, only: int | None = None, timeout: float = START_TIMEOUT_S) -> None:
        """Start every broker (or broker `only`): all launched first, for the quorum to form."""
        chosen = self.brokers if only is None else (self.brokers[only],)
        for b in chosen:
            b.launch()
        try:
            for b in chosen:
                b.wait_ready(timeout)
        except BaseException:
            self.stop(only)
            raise

    def stop(self, only: int | None = None) -> bool:
        chosen = self.brokers if only is None else (self.brokers[only],)
        return any([b.stop() for b in chosen])

    def status(self) -> str:
        lines = [f"broker {i}: {b.status().splitlines()[0]}" for i, b in enumerate(self.brokers)]
        if self.client_properties:
            lines.append(f"client settings (--kafka-config): {self.client_properties}")
        return "\n".join(lines)
