"""`tablecast serve` and `dev` refuse bad options in one line, before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tablecast.kafka.broker import free_port

from ..support.procs import free_port_run

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stock_prices.py"


def _one_error_line(argv: list[str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "tablecast.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    errors = [line for line in done.stderr.splitlines() if line.startswith("tablecast: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.returncode, errors[0], took


def test_a_busy_port_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """`serve` and `dev` refuse a port another process listens on at once, in one line, before
    Kafka is asked anything (the broker here does not exist) or any process is started."""
    port = free_port_run(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", port + 1))
        busy.listen()
        nowhere = f"127.0.0.1:{free_port()}"
        code, line, took = _one_error_line(
            ["serve", "--app", "busy", "--bootstrap-servers", nowhere, "--port", str(port + 1),
             "--data-dir", str(tmp_path / "node")]
        )  # fmt: skip
        assert code != 0 and took < 30 and f"cannot listen on 127.0.0.1:{port + 1}" in line
        code, line, took = _one_error_line(
            ["dev", str(EXAMPLE), "--nodes", "2", "--bootstrap-servers", nowhere,
             "--port", str(port), "--data-dir", str(tmp_path / "dev")]
        )  # fmt: skip
        assert code != 0 and took < 30 and f"{port + 1}" in line and "(node-1)" in line
        assert not (tmp_path / "dev" / "logs").exists() or not any(
            (tmp_path / "dev" / "logs").iterdir()
        )


def test_a_listener_count_out_of_range_is_one_line(tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    for count in ("0", "65"):
        code, line, _ = _one_error_line(
            ["serve", "--app", "x", "--bootstrap-servers", nowhere, "--listeners", count,
             "--data-dir", str(tmp_path / "node")]
        )  # fmt: skip
        assert code != 0 and f"--listeners: 1 to 64, not {count}" in line
