"""Debezium's PostgreSQL connector in a standalone Kafka Connect worker (jars from Maven
Central, tests/support/jvm/debezium-connect): the change topics a real database makes,
with Kafka Connect's JSON converter, or Apicurio's Avro converter writing through a Schema
Registry in Confluent's wire format, partitioned as Kafka Connect partitions (murmur2)."""

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


def _json(schemas: bool) -> dict[str, object]:
    return {
        f"{side}.converter{k}": v
        for side in ("key", "value")
        for k, v in (
            ("", "org.apache.kafka.connect.json.JsonConverter"),
            (".schemas.enable", str(schemas).lower()),
        )
    }


def _avro(registry: str) -> dict[str, object]:
    """Apicurio's converter as Confluent's writes: the schema's id (its content id, which
    the Confluent API serves) in the record's first bytes, not in headers."""
    return {
        f"{side}.converter{k}": v
        for side in ("key", "value")
        for k, v in (
            ("", "io.apicurio.registry.utils.converter.AvroConverter"),
            (".apicurio.registry.url", f"{registry}/apis/registry/v2"),
            (".apicurio.registry.auto-register", "true"),
            (".apicurio.registry.as-confluent", "true"),
            (".apicurio.registry.use-id", "contentId"),
            (".apicurio.registry.headers.enabled", "false"),
        )
    }


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
        registry: str | None = None,
    ) -> None:
        """`registry`: an Apicurio Registry's root URL: keys and values in Avro through it."""
        super().__init__("tablecast-connect-", "connect.log")
        self.prefix = prefix
        port = free_port()
        self.worker = _properties(
            self.dir / "worker.properties",
            {
                "bootstrap.servers": bootstrap,
                **(_json(schemas) if registry is None else _avro(registry)),
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
