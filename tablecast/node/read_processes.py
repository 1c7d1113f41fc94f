"""The node's side of its read processes (``serve --processes N``): start them, feed them,
start again one that ends, count what they answered, stop them with the node."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from tablecast.lifetime import die_with_parent
from tablecast.node.read_bulletin import TICK_S, Feed
from tablecast.query.stats import HttpStats

log = logging.getLogger(__name__)

#: a read process says it listens within this long (it imports and opens nothing slow)
START_TIMEOUT_S = 60.0
#: a read process that ended is started again after this long
RESTART_S = 1.0
#: a read process this far behind its feed is skipped until it reads (it would only grow)
MAX_UNREAD = 1 << 20
STOP_GRACE_S = 5.0


#: the relay socket's directory, under the temporary directory
RELAY_PREFIX = "tablecast-relay-"
#: a relay directory without its socket this long is a node's that died starting
UNBOUND_GRACE_S = 600.0


def remove_dead_relays() -> None:
    """Remove the relay directories of nodes killed before they could (kill -9): those of
    this user whose socket nobody listens on any more (or that never got one, long ago: a
    node starting now has its directory before its socket)."""
    for found in Path(tempfile.gettempdir()).glob(RELAY_PREFIX + "*"):
        try:
            info = found.stat()
            if info.st_uid != os.getuid():
                continue
            sock = found / "node.sock"
            if sock.exists():
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(str(sock))
                continue  # a node is listening: alive
            if time.time() - info.st_mtime < UNBOUND_GRACE_S:
                continue
        except ConnectionRefusedError:
            pass  # dead: nobody listens
        except OSError:
            continue  # gone meanwhile, or not ours to judge
        shutil.rmtree(found, ignore_errors=True)


class ReadProcesses:
    def __init__(
        self, count: int, settings: dict[str, Any], feed: Feed, stats: HttpStats, home: Path
    ) -> None:
        """`count` processes with these `settings` (:func:`readers.process.serve`'s); `home`
        holds their secondary instances' own files."""
        self.count = count
        self.settings = settings
        self.feed = feed
        self.stats = stats
        self.home = home
        # a Unix socket's path has room for about 100 bytes: a private directory of its own
        remove_dead_relays()
        self._relay_dir = tempfile.mkdtemp(prefix=RELAY_PREFIX)
        self.relay_path = os.path.join(self._relay_dir, "node.sock")
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self._new: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False

    async def start(self, port: int, listeners: int) -> None:
        """Start them all (after the node listens on `port` and on :attr:`relay_path`)."""
        self.settings = {**self.settings, "port": port, "listeners": listeners}
        self.settings["relay"] = self.relay_path
        await asyncio.gather(*(self._spawn(i) for i in range(self.count)))
        self._keep(self._feed())
        log.info("%d read process(es) serve plain key reads beside the node", self.count)

    def _keep(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _spawn(self, index: int) -> None:
        settings = {**self.settings, "own_dir": str(self.home / str(index))}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tablecast.http.readers",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            preexec_fn=die_with_parent,
        )
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(orjson.dumps(settings) + b"\n")
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line != b"ready\n":
            if proc.returncode is None:
                proc.kill()
            code = await proc.wait()
            raise RuntimeError(f"read process {index} did not start (exit code {code})")
        self.procs[index] = proc
        self._new.add(index)
        self._keep(self._watch(index, proc))

    async def _watch(self, index: int, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            try:
                self.stats.merge(line)
            except Exception:  # a report cut short by its process's end
                log.debug("a read process's report was not taken: %r", line[:80])
        code = await proc.wait()
        self.procs.pop(index, None)
        while not self._stopping:
            log.warning("read process %d ended (exit code %s); starting it again", index, code)
            await asyncio.sleep(RESTART_S)
            if self._stopping:
                return
            try:
                await self._spawn(index)
                return
            except Exception as e:
                log.error("%s", e)

    async def _feed(self) -> None:
        while True:
            if self.feed.tables_changed():
                self._new.update(self.procs)  # each needs the tables again
            slots = orjson.dumps(self.feed.slots()) if self.procs else b"[]"
            plain = self.feed.line(slots, tables=False)
            full = None  # one look at the slots serves both lines
            for index, proc in list(self.procs.items()):
                stdin = proc.stdin
                if stdin is None or stdin.is_closing():
                    continue
                if stdin.transport.get_write_buffer_size() > MAX_UNREAD:  # type: ignore[attr-defined]
                    continue  # still in _new if the tables changed: it gets them once it reads
                if index in self._new:
                    full = full or self.feed.line(slots, tables=True)
                    stdin.write(full)
                    self._new.discard(index)
                else:
                    stdin.write(plain)
            await asyncio.sleep(TICK_S)

    async def stop(self) -> None:
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        procs = list(self.procs.values())
        for proc in procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        shutil.rmtree(self._relay_dir, ignore_errors=True)
        shutil.rmtree(self.home, ignore_errors=True)
