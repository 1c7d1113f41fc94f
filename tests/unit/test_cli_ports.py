"""A port another process holds is refused in one line, before anything starts, naming the
port, the flag and the variables that choose another.

JAVA_HOME and PATH point at empty directories: were the port not refused, the Java check
would fail next, and no broker could start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablecast.cli import main as cli
from tablecast.kafka import config as kafka_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("TABLECAST_") and name != "TABLECAST_NO_JVM":
            monkeypatch.delenv(name)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-programs"))
    monkeypatch.setattr(kafka_config, "_current", kafka_config._current)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def busy() -> Iterator[int]:
    """A loopback port another socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def second_busy() -> Iterator[int]:
    """P such that P is free and P+1 is held by another socket."""
    port = free_pair()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port + 1))
        s.listen()
        yield port


def free_pair() -> int:
    """P such that P and P+1 are both free right now."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def error_line(code: int, err: str) -> str:
    lines = err.splitlines()
    assert code == 1, lines
    errors = [line for line in lines if line.startswith("tablecast: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, lines
    return errors[0]


def test_kafka_start_on_a_busy_port(
    capsys: pytest.CaptureFixture[str], busy: int, tmp_path: Path
) -> None:
    code = cli.main(["kafka", "start", "--port", str(busy), "--data-dir", str(tmp_path / "k")])
    line = error_line(code, capsys.readouterr().err)
    assert f"cannot listen on 127.0.0.1:{busy}" in line
    assert "choose another --port (or TABLECAST_KAFKA_START_PORT or TABLECAST_KAFKA_PORT)" in line


def test_kafka_start_of_a_cluster_names_the_busy_broker(
    capsys: pytest.CaptureFixture[str], second_busy: int, tmp_path: Path
) -> None:
    argv = ["kafka", "start", "--port", str(second_busy), "--brokers", "2"]
    code = cli.main([*argv, "--data-dir", str(tmp_path / "k")])
    line = error_line(code, capsys.readouterr().err)
    assert f"127.0.0.1:{second_busy + 1}" in line and "(broker 1)" in line and "--port" in line


def test_serve_on_a_busy_port(
    capsys: pytest.CaptureFixture[str], busy: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TABLECAST_PORT", str(busy))
    code = cli.main(["serve", "--app", "a", "--bootstrap-servers", "127.0.0.1:1"])
    line = error_line(code, capsys.readouterr().err)
    assert f"cannot listen on 127.0.0.1:{busy}" in line
    assert "choose another --port (or TABLECAST_SERVE_PORT or TABLECAST_PORT)" in line
    monkeypatch.delenv("TABLECAST_PORT")
    port = free_pair()
    code = cli.main(["serve", "--app", "a", "--port", str(port), "--grpc-port", str(busy)])
    line = error_line(code, capsys.readouterr().err)
    assert f"127.0.0.1:{busy}" in line and "--grpc-port (or TABLECAST_SERVE_GRPC_PORT)" in line


def dev(tmp: Path, *argv: str) -> tuple[int, str]:
    """`tablecast dev` as a child process (it sets its own signal handlers)."""
    app = tmp / "app.py"
    app.write_text("import tablecast as tc\n\napp = tc.App('ports')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TABLECAST_")}
    env.update(PYTHONPATH=str(ROOT), JAVA_HOME=str(tmp / "no-java"), PATH=str(tmp / "none"))
    done = subprocess.run(
        [sys.executable, "-m", "tablecast.cli.main", "dev", str(app), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp,
    )
    return done.returncode, done.stderr


def test_dev_on_a_busy_node_port(second_busy: int, tmp_path: Path) -> None:
    code, err = dev(tmp_path, "--nodes", "2", "--port", str(second_busy), "--data-dir", "d")
    line = error_line(code, err)
    assert f"127.0.0.1:{second_busy + 1}" in line and "(node-1)" in line
    assert "choose another --port (or TABLECAST_DEV_PORT or TABLECAST_PORT)" in line
    assert not (tmp_path / "d" / "logs").exists()


def test_dev_on_a_busy_broker_port(busy: int, tmp_path: Path) -> None:
    port = free_pair()
    code, err = dev(tmp_path, "--port", str(port), "--kafka-port", str(busy), "--data-dir", "d")
    line = error_line(code, err)
    assert f"127.0.0.1:{busy}" in line and "(the broker)" in line
    assert "choose another --kafka-port (or TABLECAST_DEV_KAFKA_PORT)" in line
