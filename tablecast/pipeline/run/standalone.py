"""A Spark standalone cluster on this machine, from PySpark's own ``bin/spark-class``.

For tests, benchmarks and trying ``tablecast run --master spark://…`` without
installing Spark: a master and N workers as child processes on free loopback
ports (web UIs included), each worker in its own process group so that it
and the executors it starts can be stopped, or killed like a lost machine,
together.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tablecast.kafka.broker import free_port


def spark_home() -> Path:
    """The installed pyspark package: it holds ``bin/spark-class`` and ``jars/``."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env(work: Path) -> dict[str, str]:
    return {
        **os.environ,
        # without it spark-class fails with "Failed to find Spark jars directory"
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_WORKER_DIR": str(work / "work"),
        # spark-class reads conf/ under SPARK_HOME unless told otherwise
        "SPARK_CONF_DIR": str(work / "conf"),
    }


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log_file: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal its whole process group (a worker's executors and Python workers too)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
        # executors outlive a killed worker only briefly; take them down now
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


@dataclass
class StandaloneCluster:
    work: Path
    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    master: Daemon | None = None
    running: list[Daemon] = field(default_factory=list)
    url: str = ""
    ui_url: str = ""

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Daemon:
        log_file = self.work / f"{name}.log"
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**_env(self.work), **(env or {})},
                start_new_session=True,
            )
        daemon = Daemon(name, proc, log_file)
        self.running.append(daemon)
        return daemon

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        for sub in ("logs", "work", "conf"):
            (self.work / sub).mkdir(parents=True, exist_ok=True)
        port, ui = free_port(), free_port()
        self.master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)),
            ],
            # its REST submission server would take the fixed port 6066
            {"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"},
        )
        # another process may take a port between free_port() and the bind: the master then
        # takes the next one, and says which in its log
        port = self._bound(self.master, "sparkMaster", port, timeout)
        ui = self._bound(self.master, "MasterUI", ui, timeout)
        self.url, self.ui_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{ui}"
        for i in range(self.workers):
            self.add_worker(f"worker-{i}")
        self.wait_workers(self.workers, timeout)
        return self

    @staticmethod
    def _bound(daemon: Daemon, service: str, asked: int, timeout: float) -> int:
        """The port `daemon` bound `service` to (its log's "Successfully started service")."""
        said = re.compile(rf"Successfully started service '{service}' on port (\d+)")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if daemon.proc.poll() is not None:
                raise RuntimeError(f"{daemon.name} exited: {daemon.log_file.read_text()[-3000:]}")
            found = said.search(daemon.log_file.read_text(errors="replace"))
            if found:
                return int(found.group(1))
            time.sleep(0.2)
        return asked

    def add_worker(self, name: str) -> Daemon:
        return self._spawn(
            name,
            [
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                *("--host", "127.0.0.1", "--port", str(free_port())),
                *("--webui-port", str(free_port())),
                *("--cores", str(self.cores), "--memory", self.memory),
                *("--work-dir", str(self.work / "work" / name)),
            ],
        )

    def alive_workers(self) -> int:
        """How many workers the master counts as alive (its web UI's JSON)."""
        try:
            return int(httpx.get(f"{self.ui_url}/json/", timeout=5.0).json()["aliveworkers"])
        except (httpx.HTTPError, ValueError, KeyError):
            return 0

    def wait_workers(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.alive_workers() < count:
            for d in self.running:
                if d.proc.poll() is not None:
                    raise RuntimeError(f"{d.name} exited: {d.log_file.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{count} workers not alive after {timeout:.0f}s")
            time.sleep(0.5)

    def worker(self, name: str) -> Daemon:
        return next(d for d in self.running if d.name == name)

    def stop(self) -> None:
        """Workers first (their executors with them), then the master; each by its group."""
        for d in reversed(self.running):
            d.kill(signal.SIGTERM)
        self.running.clear()

    def __enter__(self) -> StandaloneCluster:
        try:
            return self.start()
        except BaseException:  # __exit__ is not called then: stop what did start
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
