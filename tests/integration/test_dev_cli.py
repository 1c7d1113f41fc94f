"""`tablecast dev` on the stock-price example: up, answering, and Ctrl-C stops every process."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tablecast.contract.partitioner import partition_for
from tablecast.kafka.broker import free_port

from ..support.procs import eventually, free_port_run

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stock_prices.py"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_dev_serves_the_stock_example_and_stops_cleanly(bootstrap: str, tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "dev.out"
    with open(out, "wb") as sink:
        dev = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tablecast.cli.main",
                "dev",
                str(EXAMPLE),
                "--generate",
                "--bootstrap-servers",
                bootstrap,
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "dev"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        eventually(lambda: dev.poll() is None and "is up" in out.read_text(), timeout=240)
        url = f"http://127.0.0.1:{port}"

        def aapl() -> dict | None:
            r = httpx.get(f"{url}/v1/tables/prices/keys/AAPL", timeout=5)
            return r.json() if r.status_code == 200 else None

        body = eventually(aapl, timeout=60)
        assert body["key"] == "AAPL"
        board = body["value"]  # exchange -> its latest quote
        assert board and all(set(q) == {"price", "time"} for q in board.values())
        assert body["partition"] == partition_for(b"AAPL", 30)
        # the generator keeps ticking: the answer moves on
        eventually(lambda: (aapl() or {}).get("offset", -1) > body["offset"], timeout=60)
        # the welcome's live line: a watch of that key, its snapshot, then its changes
        watch = re.search(r"curl -N (\S+/watch\?key=\S+)", out.read_text())
        assert watch, out.read_text()[-2000:]
        kinds = []
        with httpx.stream("GET", watch.group(1), timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    kinds.append(line[7:])
                if "change" in kinds:
                    break
        assert kinds[:2] == ["snapshot", "ready"] and kinds[-1] == "change"
        children = [int(p) for p in re.findall(r"\(pid (\d+),", out.read_text())]
        assert len(children) == 3  # generator, pipeline, node
    finally:
        dev.send_signal(signal.SIGINT)
        code = dev.wait(90)
    assert code == 0, out.read_text()[-3000:]
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in children) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in children)


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
