"""Debezium's PostgreSQL connector in a standalone Kafka Connect worker (jars from Maven
Central, tests/support/jvm/debezium-connect): the change topics a real database makes,
with Kafka Connect's JSON converter, partitioned as Kafka Connect partitions (murmur2)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tablecast import jvm
from tablecast.kafka.broker import free_port

from .jvm_service import JvmService
from .postgres import DATABASE, USER, Postgres

POMS = Path(__file__).resolve().parent / "jvm"
MAIN = "org.apache.kafka.connect.cli.ConnectStandalone"


def _properties(path: Path, settings: dict[str, object]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
    return path


class DebeziumConnect(JvmService):
    """One Connect worker running one Debezium PostgreSQL connector on `tables`, writing
    ``PREFIX.public.TABLE`` topics of `partitions` partitions (compacted)."""

    def __init__(
        self,
        bootstrap: str,
        pg: Postgres,
        prefix: str,
        tables: list[str],
        partitions: int = 4,
        schemas: bool = True,
    ) -> None:
        super().__init__("tablecast-connect-", "connect.log")
        self.prefix = prefix
        port = free_port()
        self.worker = _properties(
            self.dir / "worker.properties",
            {
                "bootstrap.servers": bootstrap,
                "key.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "key.converter.schemas.enable": str(schemas).lower(),
                "value.converter.schemas.enable": str(schemas).lower(),
                "offset.storage.file.filename": self.dir / "offsets",
                "offset.flush.interval.ms": 1000,
                "listeners": f"http://127.0.0.1:{port}",
                "plugin.discovery": "only_scan",
            },
        )
        slot = "tc_" + "".join(c if c.isalnum() else "_" for c in prefix.lower())[-40:]
        self.connector = _properties(
            self.dir / "postgres.properties",
            {
                "name": f"{prefix}-postgres",
                "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                "database.hostname": "127.0.0.1",
                "database.port": pg.port,
                "database.user": USER,
                "database.password": "unused",
                "database.dbname": DATABASE,
                "topic.prefix": prefix,
                "plugin.name": "pgoutput",
                "slot.name": slot,
                "publication.name": f"{slot}_pub",
                "publication.autocreate.mode": "filtered",
                "table.include.list": ",".join(f"public.{t}" for t in tables),
                "topic.creation.default.replication.factor": -1,
                "topic.creation.default.partitions": partitions,
                "topic.creation.default.cleanup.policy": "compact",
            },
        )

    def topic(self, table: str) -> str:
        return f"{self.prefix}.public.{table}"

    def start(self) -> DebeziumConnect:
        java = jvm.require_java()
        classpath = os.pathsep.join(
            str(j) for j in sorted(jvm.jar_dir("debezium-connect", POMS).glob("*.jar"))
        )
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(java),
                    "-Xmx384m",
                    "-XX:TieredStopAtLevel=1",
                    "-cp",
                    classpath,
                    MAIN,
                    str(self.worker),
                    str(self.connector),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return self
