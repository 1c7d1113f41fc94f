"""What the tests' services (Kafka Connect, Kafka Streams, the Schema Registry, nginx in front
of it) have in common: a scratch directory with the log, and a process stopped by its pid."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tablecast.cli.supervisor import stop_process


class JvmService:
    def __init__(self, prefix: str, log_name: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.log = self.dir / log_name
        self.proc: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)
