"""Redis: the cache users would otherwise put in front of their Kafka topics.

A throwaway ``redis-server`` (Debian's package) on a free loopback port with
persistence off, the same key/value data loaded through ``redis-cli --pipe``,
and ``redis-benchmark`` GETs on random loaded keys. Everything is stopped by
pid. No Python Redis client is needed: loading speaks the Redis protocol
(RESP) to ``redis-cli --pipe``, and :meth:`RedisServer.command` is a tiny RESP
client for checks.

    from bench.peers import redis as rp
    rp.ensure_installed()
    with rp.start(work_dir=tmp, cpus="0") as server:
        rp.load_numbered(server, 100_000, lambda i: b'{"p": %d}' % i)
        print(rp.benchmark(server, keyspace=100_000, requests=1_000_000, cpus="1"))

``redis-benchmark -r N`` asks for keys ``key:<12-digit random number below N>``
(its ``__rand_int__``), so the data must be loaded under :func:`key` names,
and the other peers should serve the same names for a like-for-like run.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from bench.peers.kafka_streams import stop_pid

log = logging.getLogger(__name__)

BINARIES = ("redis-server", "redis-cli", "redis-benchmark")
INSTALL_HINT = "apt-get install -y redis-server redis-tools"
START_TIMEOUT_S = 20.0


def key(i: int) -> str:
    """The i-th key as ``redis-benchmark -r`` names it: ``key:000000012345``."""
    return f"key:{i:012d}"


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None]


def installed() -> bool:
    return not missing_binaries()


def ensure_installed() -> None:
    """Install Debian's redis-server and redis-tools when a binary is missing.

    Runs ``apt-get update && apt-get install`` only when needed and only as root;
    otherwise raises RuntimeError saying what to run.
    """
    missing = missing_binaries()
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(f"{', '.join(missing)} not installed; run: {INSTALL_HINT}")
    log.info("installing redis-server and redis-tools with apt-get (missing: %s)", missing)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "redis-server", "redis-tools"],
    ):
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
    if missing_binaries():
        raise RuntimeError(f"still missing after apt-get: {missing_binaries()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def encode_command(*args: str | bytes) -> bytes:
    """One command in the Redis protocol (a RESP array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        data = a.encode() if isinstance(a, str) else a
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


@dataclass
class RedisServer:
    """A running redis-server we started; a context manager that stops it."""

    proc: subprocess.Popen[bytes]
    port: int
    log_file: Path
    host: str = "127.0.0.1"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def command(self, *args: str | bytes, timeout: float = 5.0) -> object:
        """Send one command and return its decoded reply (bytes, int, str, list or None)."""
        with socket.create_connection((self.host, self.port), timeout=timeout) as s:
            s.sendall(encode_command(*args))
            reader = s.makefile("rb")
            return _read_reply(reader)

    def get(self, k: str) -> bytes | None:
        reply = self.command("GET", k)
        assert reply is None or isinstance(reply, bytes), reply
        return reply

    def info(self, section: str = "memory") -> dict[str, str]:
        """``INFO <section>`` as a dict (e.g. ``used_memory`` for memory per key)."""
        raw = self.command("INFO", section)
        assert isinstance(raw, bytes)
        out: dict[str, str] = {}
        for line in raw.decode().splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.split(":", 1)
                out[k] = v
        return out

    def dbsize(self) -> int:
        n = self.command("DBSIZE")
        assert isinstance(n, int)
        return n

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (redis exits at once without persistence), SIGKILL after `timeout`."""
        stop_pid(self.proc, timeout)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class RedisError(Exception):
    pass


def _read_reply(reader: io.BufferedReader) -> object:
    line = reader.readline()
    if not line:
        raise ConnectionError("redis closed the connection")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RedisError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        n = int(rest)
        if n < 0:
            return None
        data = reader.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [_read_reply(reader) for _ in range(n)]
    raise RedisError(f"unexpected reply {line!r}")


def command(
    port: int | None = None, cpus: str | None = None, work_dir: Path | None = None
) -> list[str]:
    """The redis-server command line: loopback only, no RDB snapshots, no AOF."""
    cmd = ["taskset", "-c", cpus] if cpus else []
    cmd += [
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        # a cache, as users run it in front of Kafka: nothing written to disk
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
    ]
    if work_dir is not None:
        cmd += ["--dir", str(work_dir)]
    return cmd


def start(
    work_dir: Path,
    *,
    port: int | None = None,
    cpus: str | None = None,
    timeout: float = START_TIMEOUT_S,
) -> RedisServer:
    """Start redis-server on a free loopback port (under ``taskset -c cpus`` if given)."""
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"{', '.join(missing)} not installed; run: {INSTALL_HINT}")
    port = port or free_port()
    work_dir.mkdir(parents=True, exist_ok=True)
    log_file = work_dir / f"redis-{port}.log"
    log.info("starting redis-server on port %d%s", port, f" (cpus {cpus})" if cpus else "")
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            command(port, cpus, work_dir),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = RedisServer(proc, port, log_file)
    deadline = time.monotonic() + timeout
    while True:
        if not server.alive():
            raise RuntimeError(f"redis-server exited: {log_file.read_text()[-2000:]}")
        try:
            if server.command("PING", timeout=1) == "PONG":
                return server
        except (OSError, RedisError):
            pass  # not listening yet, or still loading
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"redis-server not answering PING after {timeout:.0f}s")
        time.sleep(0.05)


def load(server: RedisServer, items: Iterable[tuple[str | bytes, str | bytes]]) -> int:
    """SET every (key, value) through ``redis-cli --pipe``; returns how many were sent."""
    count = 0
    proc = subprocess.Popen(
        ["redis-cli", "-h", server.host, "-p", str(server.port), "--pipe"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdin is not None
    try:
        batch: list[bytes] = []
        for k, v in items:
            batch.append(encode_command("SET", k, v))
            count += 1
            if len(batch) >= 10_000:
                proc.stdin.write(b"".join(batch))
                batch.clear()
        proc.stdin.write(b"".join(batch))
        proc.stdin.close()
        output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
        rc = proc.wait(300)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    # --pipe reports "errors: N, replies: M" on its last line
    if rc != 0 or "errors: 0," not in output:
        raise RuntimeError(f"redis-cli --pipe failed ({rc}): {output[-2000:]}")
    return count


def load_numbered(server: RedisServer, n: int, value: Callable[[int], str | bytes]) -> int:
    """Load keys ``key(0) .. key(n-1)`` with ``value(i)``, the names redis-benchmark asks for."""
    return load(server, ((key(i), value(i)) for i in range(n)))


@dataclass(frozen=True)
class BenchResult:
    """One redis-benchmark test: throughput and latencies in milliseconds."""

    test: str
    rps: float
    avg_ms: float
    min_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    command: tuple[str, ...]


def parse_csv(text: str, cmd: tuple[str, ...] = ()) -> list[BenchResult]:
    """redis-benchmark's ``--csv`` output: a header row, then one row per test."""
    rows = list(csv.reader(io.StringIO(text.strip())))
    if not rows or rows[0][:2] != ["test", "rps"]:
        raise ValueError(f"not redis-benchmark CSV: {text[:500]!r}")
    out = []
    for r in rows[1:]:
        if len(r) < 8:
            continue
        out.append(BenchResult(r[0], *(float(x) for x in r[1:8]), command=cmd))  # type: ignore[misc]
    return out


def benchmark(
    server: RedisServer,
    keyspace: int,
    requests: int = 1_000_000,
    *,
    clients: int = 50,
    pipeline: int = 1,
    threads: int | None = None,
    cpus: str | None = None,
    timeout: float = 600.0,
) -> BenchResult:
    """GET random keys ``key(0..keyspace-1)`` with redis-benchmark and parse its result.

    `pipeline` 1 keeps one request in flight per connection, like an HTTP
    client without pipelining; `cpus` pins the load generator (e.g. the core
    the server is not on).
    """
    cmd = ["taskset", "-c", cpus] if cpus else []
    cmd += [
        "redis-benchmark",
        "-h",
        server.host,
        "-p",
        str(server.port),
        "-t",
        "get",
        "-r",
        str(keyspace),
        "-n",
        str(requests),
        "-c",
        str(clients),
        "-P",
        str(pipeline),
        "--csv",
    ]
    if threads:
        cmd += ["--threads", str(threads)]
    log.info("redis-benchmark: %s", " ".join(cmd))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    results = parse_csv(done.stdout, tuple(cmd))
    gets = [r for r in results if r.test == "GET"]
    if not gets:
        raise RuntimeError(f"redis-benchmark printed no GET result: {done.stdout[-2000:]}")
    return gets[0]
