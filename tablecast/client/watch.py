"""``Client.watch``: a table's live changes as an iterator that survives node failures.

It reads the SSE stream of ``/v1/tables/{t}/watch`` and remembers the id of
the last event (and of every keep-alive, which carries the stream's position
too). When the node goes away — killed, stopped, its stream cut off for being
slow — it asks the next node with ``Last-Event-ID`` and the stream continues
right after that event: no gap, no duplicate, no second snapshot.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from tablecast.client.errors import WatchAuthError, WatchError

#: a stream silent this long is dead (nodes send a keep-alive every 10 s)
READ_TIMEOUT_S = 30.0
#: give up when no node has served the watch for this long
GIVE_UP_S = 60.0
#: error codes a retry elsewhere cannot fix: raised to the caller
FINAL = ("bad_request", "unauthorized", "forbidden", "table_not_found", "not_found")
#: the HTTP status raised for a refused token's error event (the event carries only the
#: code; the others are 400)
FINAL_STATUS = {"unauthorized": 401, "forbidden": 403}


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch: a snapshot row, ``ready`` (the snapshot is complete), or a change."""

    event: str
    #: the resume token: pass it as ``since`` to continue after this event
    id: str | None
    key: Any = None
    value: Any = None
    partition: int | None = None
    offset: int | None = None
    timestamp: int | None = None
    #: the node that served it
    node: str | None = None

    @property
    def deleted(self) -> bool:
        """A change that deleted the key."""
        return self.event == "change" and self.value is None


class _Retry(Exception):
    """This node could not serve (on): try the next one."""


class Parser:
    """The ``text/event-stream`` format, line by line (W3C EventSource): yields (event, id, data)
    for each dispatched event, and keeps the last id (an id-only block moves it too)."""

    def __init__(self) -> None:
        self.last_id: str | None = None
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None

    def line(self, line: str) -> tuple[str, str | None, str] | None:
        if not line:
            if self._id is not None:
                self.last_id = self._id
            out = None
            if self._data:
                out = (self._event or "message", self.last_id, "\n".join(self._data))
            self._event, self._data, self._id = "", [], None
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self._id = value
        return None


def watch_params(
    key: Any | Sequence[Any] | None,
    prefix: str | None,
    from_: Any,
    to: Any,
    snapshot: bool,
    text: Callable[[Any], str],
) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = []
    if key is not None:
        keys = list(key) if isinstance(key, list | tuple | set | frozenset) else [key]
        params += [("key", text(k)) for k in keys]
    if prefix is not None:
        params.append(("prefix", prefix))
    if from_ is not None:
        params.append(("from", text(from_)))
    if to is not None:
        params.append(("to", text(to)))
    if not params:
        raise ValueError("watch what? give key=, prefix= or from_=/to=")
    if not snapshot:
        params.append(("snapshot", "false"))
    return params


def _event(kind: str, token: str | None, data: str, node: str | None) -> WatchEvent:
    body = orjson.loads(data) if data else {}
    if kind == "error":
        err = body.get("error", {}) if isinstance(body, dict) else {}
        code, message = err.get("code", "error"), err.get("message", "")
        if code in FINAL:
            status = FINAL_STATUS.get(code, 400)
            raise (WatchAuthError if status in (401, 403) else WatchError)(status, code, message)
        raise _Retry(f"{code}: {message}")
    if kind in ("snapshot", "change"):
        return WatchEvent(
            kind,
            token,
            body.get("key"),
            body.get("value"),
            body.get("partition"),
            body.get("offset"),
            body.get("timestamp"),
            node,
        )
    return WatchEvent(kind, token, node=node)


def _refused(status: int, body: bytes) -> Exception:
    """What a non-200 answer to a watch means: retry elsewhere, or stop."""
    if status == 503 or status >= 500:
        return _Retry(f"{status}")
    # a refused token is an AuthError too, whoever refused it (a node, or a proxy)
    refused = WatchAuthError if status in (401, 403) else WatchError
    try:
        err = orjson.loads(body)["error"]
        return refused(status, err["code"], err["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return refused(status, "error", body[:200].decode(errors="replace"))


class Resumer:
    """Which node to ask next and with which token; shared by the sync and async loops."""

    def __init__(self, table: str, params: list[tuple[str, str]], nodes: Callable[[], list[str]]):
        self.path = f"/v1/tables/{quote(table, safe='')}/watch"
        self.params = params
        self._nodes = nodes
        self.parser = Parser()
        self.failed_at: float | None = None
        self._avoid: str | None = None
        self.attempt = 0

    def order(self) -> list[str]:
        urls = self._nodes()
        if self._avoid in urls and len(urls) > 1:  # the node that just failed goes last
            urls = [u for u in urls if u != self._avoid] + [self._avoid]  # type: ignore[list-item]
        return urls

    def request(self, url: str) -> dict[str, Any]:
        """The stream request to `url`, resuming after the last id seen."""
        last = self.parser.last_id
        headers = {"accept": "text/event-stream", **({"last-event-id": last} if last else {})}
        return {
            "method": "GET",
            "url": url + self.path,
            "params": self.params,
            "headers": headers,
            "timeout": httpx.Timeout(10.0, read=READ_TIMEOUT_S),
        }

    def line(self, line: str, node: str | None) -> WatchEvent | None:
        """One line of the stream; the event it completes, if any."""
        out = self.parser.line(line)
        if out is None:
            return None
        self.served()
        return _event(*out, node)

    def failed(self, url: str) -> float:
        """Note a failure of `url`; the pause before the next try (raises once it is hopeless)."""
        self._avoid = url
        now = time.monotonic()
        if self.failed_at is None:
            self.failed_at = now
        if now - self.failed_at > GIVE_UP_S:
            raise WatchError(
                503, "partition_unavailable", f"no node served the watch for {GIVE_UP_S:.0f} s"
            )
        self.attempt += 1
        return min(2.0, 0.05 * self.attempt)

    def served(self) -> None:
        self.failed_at = None
        self.attempt = 0


def watch_sync(
    http: httpx.Client, resumer: Resumer, refresh: Callable[[], None]
) -> Iterator[WatchEvent]:
    while True:
        for url in resumer.order():
            try:
                with http.stream(**resumer.request(url)) as r:
                    if r.status_code != 200:
                        raise _refused(r.status_code, r.read())
                    node = r.headers.get("x-tablecast-node")
                    for line in r.iter_lines():
                        event = resumer.line(line, node)
                        if event is not None:
                            yield event
                raise _Retry("the stream ended")
            except (httpx.HTTPError, _Retry):
                pause = resumer.failed(url)
                refresh()
                time.sleep(pause)


async def watch_async(http: httpx.AsyncClient, resumer: Resumer) -> AsyncIterator[WatchEvent]:
    import asyncio

    while True:
        for url in resumer.order():
            try:
                async with http.stream(**resumer.request(url)) as r:
                    if r.status_code != 200:
                        raise _refused(r.status_code, await r.aread())
                    node = r.headers.get("x-tablecast-node")
                    async for line in r.aiter_lines():
                        event = resumer.line(line, node)
                        if event is not None:
                            yield event
                raise _Retry("the stream ended")
            except (httpx.HTTPError, _Retry):
                await asyncio.sleep(resumer.failed(url))
