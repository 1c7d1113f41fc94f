"""A real Kafka Streams application with a key-value, a windowed and a session store
(tests/support/jvm/kafka-streams-stores/StoresApp.java, run by ``java`` as a single-file
program against Kafka Streams' jars from Maven Central), and its own interactive
queries' view of those stores."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from tablecast import jvm

from .jvm_service import JvmService

POMS = Path(__file__).resolve().parent / "jvm"
SOURCE = POMS / "kafka-streams-stores" / "StoresApp.java"
#: the store names StoresApp gives: their changelogs are ``<app id>-<store>-changelog``
STORES = ("latest", "per-window", "sessions")


class StoresApp(JvmService):
    """One instance of StoresApp reading `topic` (String values; String keys, or with
    `byte_keys` the keys' bytes as they are, which its dumps give in hex)."""

    def __init__(
        self,
        bootstrap: str,
        app_id: str,
        topic: str,
        window_ms: int,
        gap_ms: int,
        byte_keys: bool = False,
    ) -> None:
        super().__init__("tablecast-streams-", "streams.log")
        self.args = [bootstrap, app_id, topic, str(self.dir / "state"), str(window_ms), str(gap_ms)]
        if byte_keys:
            self.args.append("bytes")
        self.app_id = app_id
        self._lines: queue.Queue[str] = queue.Queue()

    def changelog(self, store: str) -> str:
        return f"{self.app_id}-{store}-changelog"

    def start(self, timeout: float = 120.0) -> StoresApp:
        java = jvm.require_java(compiler=True)
        jars = sorted(jvm.jar_dir("kafka-streams-stores", POMS).glob("*.jar"))
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [
                    str(java),
                    "-Xmx256m",
                    "-XX:TieredStopAtLevel=1",
                    "-cp",
                    os.pathsep.join(str(j) for j in jars),
                    str(SOURCE),
                    *self.args,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        threading.Thread(target=self._read, daemon=True).start()
        self._expect(lambda line: line == "RUNNING", timeout)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.decode().strip())

    def _expect(self, wanted: Any, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc is not None and self.proc.poll() is not None:
                    break
                continue
            if wanted(line):
                return line
        raise TimeoutError(f"Kafka Streams app: nothing expected came; log:\n{self.log_tail()}")

    def stores(self) -> dict[str, Any]:
        """Every store's content as the app's interactive queries give it:
        {"latest": {key: value}, "windows": [[key, start, end, count]], "sessions": [...]}."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"dump\n")
        self.proc.stdin.flush()
        return orjson.loads(self._expect(lambda line: line.startswith("{"), 60.0))
