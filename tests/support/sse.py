"""A plain SSE reader for tests, independent of tablecast.Client: it keeps every event and
comment with its arrival time, so tests judge the server's stream, not the client's."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from .procs import tls


@dataclass
class Event:
    event: str
    id: str | None
    data: Any
    at: float


@dataclass
class Stream:
    """One watch read on a thread until :meth:`stop` (or the server ends it)."""

    url: str
    params: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    #: arrival times of comment lines (keep-alives)
    comments: list[float] = field(default_factory=list)
    #: the last id seen, of an event or of an id-only block (a keep-alive's position)
    last_id: str | None = None
    status: int | None = None
    body: bytes = b""
    ended: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Stream:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            with httpx.stream(
                "GET", self.url, params=self.params, headers=self.headers, timeout=60, verify=tls()
            ) as r:
                # a refusal's body first: whoever sees the status may read the body at once
                if r.status_code != 200:
                    self.body = r.read()
                    self.status = r.status_code
                    return
                self.status = r.status_code
                kind, data, ident = "", [], None
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return
                    if not line:
                        if ident is not None:
                            self.last_id = ident
                        if data:
                            self.events.append(
                                Event(
                                    kind or "message",
                                    ident,
                                    orjson.loads("\n".join(data)),
                                    time.time(),
                                )
                            )
                        kind, data, ident = "", [], None
                    elif line.startswith(":"):
                        self.comments.append(time.time())
                    else:
                        name, _, value = line.partition(": ")
                        if name == "data":
                            data.append(value)
                        elif name == "event":
                            kind = value
                        elif name == "id":
                            ident = value
        except httpx.HTTPError:
            pass
        finally:
            self.ended.set()

    def stop(self) -> None:
        self._stop.set()

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.events if e.event == kind]

    def wait_for(self, predicate: Any, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self):
                return
            if self.ended.is_set() and not predicate(self):
                raise AssertionError(f"stream ended ({self.status} {self.body[:300]!r})")
            time.sleep(0.05)
        raise AssertionError(
            f"not true within {timeout}s; {len(self.events)} events, last {self.events[-3:]}"
        )


def read_to_end(sock: socket.socket, timeout: float = 30.0) -> bytes:
    """All a node sends on a raw socket until it ends the response (chunked: the last chunk
    is empty) or closes it, within `timeout`."""
    sock.settimeout(timeout)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
        if chunk.endswith(b"0\r\n\r\n"):
            break
    return b"".join(chunks)
