"""A real Schema Registry: Apicurio Registry 2.6 (from Maven Central, in-memory storage),
whose Confluent-compatible API (``/apis/ccompat/v7``) confluent-kafka's serializers and
tablecast's nodes use as they would Confluent's."""

from __future__ import annotations

import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import httpx

from tablecast import jvm
from tablecast.kafka.broker import free_port

from .jvm_service import JvmService

POMS = Path(__file__).resolve().parent / "jvm"


def _unpacked() -> Path:
    """The registry's runner jar, unpacked once beside the zip Maven fetched."""
    (archive,) = jvm.jar_dir("apicurio-registry", POMS).glob("*.zip")
    home = archive.with_suffix("")
    if not (home / ".complete").exists():
        partial = home.with_name(home.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(archive) as z:
            z.extractall(partial)
        (partial / ".complete").touch()
        shutil.rmtree(home, ignore_errors=True)
        partial.rename(home)
    (runner,) = home.glob("*-runner.jar")
    return runner


class SchemaRegistry(JvmService):
    def __init__(self) -> None:
        super().__init__("tablecast-registry-", "registry.log")
        self.port = free_port()

    @property
    def url(self) -> str:
        """The Confluent-compatible API's root, as clients are given it."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v7"

    def start(self, timeout: float = 120.0) -> SchemaRegistry:
        java = jvm.require_java()
        runner = _unpacked()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    str(java),
                    "-Xmx256m",
                    "-XX:TieredStopAtLevel=1",
                    f"-Dquarkus.http.port={self.port}",
                    "-Dquarkus.http.host=127.0.0.1",
                    "-jar",
                    str(runner),
                ],
                cwd=self.dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                if httpx.get(self.url + "/subjects", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"schema registry not up; log:\n{self.log_tail()}")
