"""A throwaway PostgreSQL server (Debian's postgresql package) with logical decoding on,
for the change streams Debezium reads: its own data directory, a free loopback port, no
password (trust), stopped by its pid."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from tablecast.cli.supervisor import reap
from tablecast.kafka.broker import free_port

from .apt import apt_install

USER = "tc"
DATABASE = "shop"


def bin_dir() -> Path | None:
    """The newest installed PostgreSQL's programs (initdb, postgres), if any."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: p.split("/")[4])
    return Path(found[-1]).parent if found else None


def installed() -> Path:
    """PostgreSQL's programs, installing Debian's postgresql package first as root."""
    programs = bin_dir()
    if programs is None:
        problem = apt_install("postgresql")
        programs = bin_dir()
        if programs is None:
            raise RuntimeError(f"PostgreSQL is not installed: {problem}")
    return programs


class Postgres:
    def __init__(self) -> None:
        programs = installed()
        self.bin = programs
        # initdb and postgres refuse to run as root: as the package's postgres user then
        self._as: dict[str, Any] = (
            {"user": "postgres", "group": "postgres", "extra_groups": []}
            if os.geteuid() == 0
            else {}
        )
        self.dir = Path(tempfile.mkdtemp(prefix="tablecast-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "postgres.log"

    def start(self) -> Postgres:
        data = self.dir / "data"
        if self._as:
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(data), "-U", USER, "-A", "trust"],
            check=True,
            capture_output=True,
            cwd=self.dir,
            **self._as,
        )
        settings = {
            "listen_addresses": "127.0.0.1",
            "wal_level": "logical",  # what Debezium reads: logical decoding (pgoutput)
            "max_replication_slots": 8,
            "max_wal_senders": 8,
            "fsync": "off",
        }
        command = [str(self.bin / "postgres"), "-D", str(data), "-p", str(self.port)]
        command += ["-k", str(self.dir)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.dir,
                **self._as,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE {DATABASE}")
                return self
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    why = self.log.read_text()
                    raise RuntimeError(f"PostgreSQL did not start:\n{why}") from None
                time.sleep(0.2)

    def url(self, database: str = DATABASE) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def connect(self, **kw: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url(), **kw)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT is PostgreSQL's fast shutdown
            self.proc.send_signal(signal.SIGINT)
            reap(self.proc, 30)
        shutil.rmtree(self.dir, ignore_errors=True)
