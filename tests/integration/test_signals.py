"""`tablecast dev` up and answering, and signals stop everything it started: SIGTERM and
SIGINT within 30 s, also when started in the background with SIGINT ignored; SIGKILL takes
its broker, pipeline (Spark JVM included), generator and nodes with it within 10 s."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tablecast.kafka.broker import free_port

from ..support.procs import eventually

pytestmark = pytest.mark.integration


APP = """
import tablecast as tc

app = tc.App("{app}")
app.table("{topic}", key=tc.serde.string(), value=tc.serde.json()).materialize("kv")


def generate(bootstrap_servers):
    import time

    from tablecast.kafka.topics import ensure_topic

    ensure_topic(bootstrap_servers, "{topic}", 2)
    producer = tc.producer(bootstrap_servers)
    i = 0
    while True:
        producer.produce("{topic}", key=f"k{{i % 50}}".encode(), value=b'{{"i": %d}}' % i)
        producer.poll(0)
        i += 1
        time.sleep(0.05)
"""


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


class Dev:
    def __init__(
        self,
        tmp: Path,
        unique: str,
        bootstrap: str | None,
        ignore_sigint: bool,
        app_file: Path | None = None,
    ) -> None:
        if app_file is None:
            app_file = tmp / "app.py"
            app_file.write_text(APP.format(app=unique, topic=f"{unique}-in"))
        self.out = tmp / "dev.out"
        self.data = tmp / "dev"
        self.port = free_port()
        argv = [
            sys.executable,
            "-m",
            "tablecast.cli.main",
            "dev",
            str(app_file),
            "--generate",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data),
        ]
        argv += (
            ["--bootstrap-servers", bootstrap] if bootstrap else ["--kafka-port", str(free_port())]
        )

        def background() -> None:
            if ignore_sigint:  # as a shell starts a background job
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        with open(self.out, "wb") as sink:
            self.proc = subprocess.Popen(
                argv,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=background,
            )

    def wait_up(self) -> set[int]:
        eventually(
            lambda: self.proc.poll() is None and "is up" in self.out.read_text(), timeout=300
        )
        return descendants(self.proc.pid)

    def logs(self) -> str:
        texts = [self.out.read_text()]
        texts += [p.read_text(errors="replace") for p in sorted(self.data.glob("logs/*.log"))]
        return "\n".join(texts)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pid in descendants(self.proc.pid):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def dev_factory(tmp_path: Path, unique: str) -> Iterator:  # type: ignore[type-arg]
    started: list[Dev] = []

    def make(
        bootstrap: str | None, ignore_sigint: bool = False, app_file: Path | None = None
    ) -> Dev:
        d = Dev(tmp_path, unique, bootstrap, ignore_sigint, app_file)
        started.append(d)
        return d

    yield make
    for d in started:
        d.kill()


def _gone_within(pids: set[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


# SIGTERM and SIGINT run the one handler (tests/unit/test_cli_signals.py), which the
# background-SIGINT test below takes through the same stop
@pytest.mark.long
def test_sigterm_stops_dev_and_everything_it_started(bootstrap: str, dev_factory) -> None:  # type: ignore[no-untyped-def]
    dev = dev_factory(bootstrap)
    tree = dev.wait_up()
    assert len(tree) >= 4  # generator, pipeline (and its Spark JVM), node
    started = time.monotonic()
    dev.proc.send_signal(signal.SIGTERM)
    assert dev.proc.wait(30) == 0, dev.logs()[-3000:]
    assert _gone_within(tree, 30 - (time.monotonic() - started)) == []
    assert "Traceback" not in dev.logs(), dev.logs()[-5000:]


def test_dev_serves_and_sigint_stops_it_in_the_background(
    bootstrap: str, dev_factory: Callable[..., Dev]
) -> None:
    """An app with a generator, started as a shell starts a background job (SIGINT ignored):
    it answers, moves on, its welcome's lines work (the key read, the live watch); SIGINT
    stops it all. (The stock example as `tablecast demo` runs it is the wheel smoke test's,
    and its pipeline test_examples'.)"""
    dev = dev_factory(bootstrap, ignore_sigint=True)
    tree = dev.wait_up()
    welcome = dev.out.read_text()
    read = re.search(r"curl (\S+/keys/\S+)", welcome)
    watch = re.search(r"curl -N (\S+/watch\?key=\S+)", welcome)
    assert read and watch, welcome[-2000:]

    def answer() -> dict | None:  # type: ignore[type-arg]
        r = httpx.get(read.group(1), timeout=5)
        return r.json() if r.status_code == 200 else None

    body = eventually(answer, timeout=60)
    assert set(body["value"]) == {"i"}
    # the generator keeps writing: the answer moves on
    eventually(lambda: (answer() or {}).get("offset", -1) > body["offset"], timeout=60)
    # the welcome's live line: a watch of that key, its snapshot, then its changes
    kinds = []
    with httpx.stream("GET", watch.group(1), timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("event: "):
                kinds.append(line[7:])
            if "change" in kinds:
                break
    assert kinds[:2] == ["snapshot", "ready"] and kinds[-1] == "change"
    children = [int(p) for p in re.findall(r"\(pid (\d+),", welcome)]
    assert len(children) == 3  # generator, pipeline, node
    dev.proc.send_signal(signal.SIGINT)
    assert dev.proc.wait(30) == 0, dev.logs()[-3000:]
    assert _gone_within(tree, 5) == []
    assert "Traceback" not in dev.logs(), dev.logs()[-5000:]


@pytest.mark.long  # its own broker, Spark and nodes for one kill: CI's time
def test_sigkill_of_dev_takes_broker_spark_and_nodes_with_it(dev_factory) -> None:  # type: ignore[no-untyped-def]
    dev = dev_factory(None)  # with its own broker
    tree = dev.wait_up()
    java = [p for p in tree if Path(f"/proc/{p}/comm").read_text().strip() == "java"]
    assert len(java) >= 2  # the broker and the Spark driver's JVM
    dev.proc.kill()
    dev.proc.wait()
    assert _gone_within(tree, 10) == []
