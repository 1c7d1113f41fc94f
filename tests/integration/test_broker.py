"""`tablecast kafka start|status|stop` runs a real broker in its data dir."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tablecast import jvm
from tablecast.kafka.broker import free_port

pytestmark = pytest.mark.integration


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tablecast.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_kafka_start_status_stop(tmp_path: Path) -> None:
    port = str(free_port())
    where = ["--port", port, "--data-dir", str(tmp_path / "k")]
    assert cli("kafka", "status", *where).returncode == 3
    started = cli("kafka", "start", *where)
    try:
        assert started.returncode == 0, started.stderr
        assert (tmp_path / "k" / "broker.pid").exists()
        assert cli("kafka", "status", *where).stdout.startswith("running")
        # starting again reuses the running broker
        assert cli("kafka", "start", *where).returncode == 0
        md = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
        assert md.brokers
    finally:
        stopped = cli("kafka", "stop", *where)
    assert stopped.stdout.strip() == "stopped"
    assert not (tmp_path / "k" / "broker.pid").exists()
    assert cli("kafka", "status", *where).returncode == 3
    # the first broker on this classpath has left its class-data archive (or found one)
    archive = jvm.class_archive(jvm.classpath("kafka-broker"))
    assert archive.exists()
    assert not (tmp_path / "k" / "classes.jsa").exists()
    # and a restart on the same (formatted) data dir comes back, its classes mapped from it
    try:
        assert cli("kafka", "start", *where).returncode == 0
        pid = int((tmp_path / "k" / "broker.pid").read_text())
        assert str(archive) in Path(f"/proc/{pid}/maps").read_text()
    finally:
        cli("kafka", "stop", *where)
