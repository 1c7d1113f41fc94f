"""Child processes that `tablecast dev` starts and must stop, each by its pid."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tablecast.lifetime import die_with_parent

log = logging.getLogger(__name__)


def stop_process(
    proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30.0
) -> None:
    """Stop a child we started, by its pid: `sig`, then SIGKILL if it outlives `timeout`."""
    if proc.poll() is None:
        proc.send_signal(sig)
    reap(proc, timeout)


def children(pid: int) -> list[int]:
    """The pids of `pid`'s child processes (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # the parent, after the name
            found.append(int(entry.name))
    return found


def reap(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait for a signalled child; SIGKILL it if it is still running after `timeout`."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("pid %d did not stop in %.0f s; killing it", proc.pid, timeout)
        proc.kill()
        proc.wait()


@dataclass
class Supervisor:
    log_dir: Path
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_file = self.log_dir / f"{name}.log"
        with open(log_file, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                # own session: Ctrl-C reaches only `dev`, which stops children in order
                start_new_session=True,
                # and a SIGKILLed `dev`, which can stop nothing, takes them with it
                preexec_fn=die_with_parent,
            )
        log.info("started %s (pid %d, log %s)", name, proc.pid, log_file)
        self.children.append((name, proc))
        return proc

    def failed(self) -> str | None:
        """The name of a child that has exited, if any."""
        for name, proc in self.children:
            if proc.poll() is not None:
                return name
        return None

    def stop_all(self, timeout: float = 30.0) -> None:
        """Stop children newest first: SIGTERM, then SIGKILL after `timeout`."""
        for name, proc in reversed(self.children):
            if proc.poll() is None:
                log.info("stopping %s (pid %d)", name, proc.pid)
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for _, proc in reversed(self.children):
            reap(proc, max(0.1, deadline - time.monotonic()))
        self.children.clear()
