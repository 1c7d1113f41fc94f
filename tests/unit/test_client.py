"""``tablecast.Client`` against a small real HTTP server standing in for a proxy in front of
the nodes: Retry-After on 429 and 503 (bounded), a refused token as AuthError, an HTML
error page as a QueryError, the HTTP API's parameter names (and the earlier ones, which
warn), paging with limit and cursor, and what ``tablecast`` exports."""

from __future__ import annotations

import builtins
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

import tablecast
from tablecast import serde
from tablecast.client import AuthError, Client, Pages, QueryError, WatchAuthError, WatchError

TABLES = {
    "tables": [
        {"name": "t", "key_format": "string", "value_format": "json", "partitions": 1},
    ]
}
HTML = b"<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>"


@dataclass
class Answer:
    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def js(status: int, obj: Any, **headers: str) -> Answer:
    return Answer(status, orjson.dumps(obj), {"content-type": "application/json", **headers})


def error(status: int, code: str, **headers: str) -> Answer:
    return js(status, {"error": {"code": code, "message": f"{code} here"}}, **headers)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    at: float


class Proxy:
    """A real HTTP server on a free loopback port: each path answers from its script (the
    last answer repeats); the cluster map answers one table and no nodes (so the client
    keeps asking this URL). Every request is kept."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Answer]] = {
            "/v1/tables": [js(200, TABLES)],
            "/v1/cluster": [js(200, {"nodes": []})],
        }
        self.seen: list[Seen] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", 0)))
                self._answer()

            def _answer(self) -> None:
                url = urlsplit(self.path)
                proxy.seen.append(
                    Seen(
                        self.command,
                        url.path,
                        parse_qs(url.query, keep_blank_values=True),
                        {k.lower(): v for k, v in self.headers.items()},
                        time.monotonic(),
                    )
                )
                script = proxy.scripts.get(url.path) or [error(404, "not_found")]
                answer = script.pop(0) if len(script) > 1 else script[0]
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        # a short poll: shutdown() waits for one
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    def answer(self, path: str, *answers: Answer) -> None:
        self.scripts[path] = list(answers)

    def asked(self, path: str) -> list[Seen]:
        return [s for s in self.seen if s.path == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    p = Proxy()
    yield p
    p.close()


@pytest.fixture
def other() -> Iterator[Proxy]:
    """A second server, to see that a request was (not) taken elsewhere."""
    p = Proxy()
    yield p
    p.close()


COUNT = "/v1/tables/t/count"


# -- Retry-After ---------------------------------------------------------------------------
@pytest.mark.parametrize("status", [429, 503])
def test_a_retry_after_is_waited_for_then_asked_again(proxy: Proxy, status: int) -> None:
    code = "rate_limited" if status == 429 else "partition_unavailable"
    proxy.answer(COUNT, error(status, code, **{"retry-after": "1"}), js(200, {"count": 5}))
    with Client(proxy.url) as client:
        assert client.count("t") == 5
    first, second = proxy.asked(COUNT)
    assert second.at - first.at >= 0.9  # the one second it asked for, not a quick backoff


def test_a_retry_after_longer_than_the_client_waits_is_raised_at_once(proxy: Proxy) -> None:
    proxy.answer(COUNT, error(503, "partition_unavailable", **{"retry-after": "30"}))
    started = time.monotonic()
    with Client(proxy.url, max_retry_wait=0.5) as client, pytest.raises(QueryError) as e:
        client.count("t")
    assert time.monotonic() - started < 5
    assert e.value.status == 503 and e.value.code == "partition_unavailable"
    assert len(proxy.asked(COUNT)) == 1


def test_429_is_retried_as_many_rounds_as_allowed(proxy: Proxy, other: Proxy) -> None:
    proxy.answer(COUNT, error(429, "rate_limited", **{"retry-after": "0"}))
    with Client([proxy.url, other.url], retries=4) as client, pytest.raises(QueryError) as e:
        client.count("t")
    assert e.value.status == 429 and e.value.code == "rate_limited"
    assert len(proxy.asked(COUNT)) == 4
    # over the rate where it asked: the round ends, the other node is not asked at once
    assert other.asked(COUNT) == []


def test_an_http_date_retry_after_is_understood(proxy: Proxy) -> None:
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 600))
    proxy.answer(COUNT, error(429, "rate_limited", **{"retry-after": when}))
    with Client(proxy.url, max_retry_wait=1) as client, pytest.raises(QueryError):
        client.count("t")
    assert len(proxy.asked(COUNT)) == 1  # ten minutes: more than it may wait


# -- refused tokens and bodies that are not JSON ----------------------------------------
@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_is_an_auth_error_not_unreachable(
    proxy: Proxy, other: Proxy, status: int
) -> None:
    code = "unauthorized" if status == 401 else "forbidden"
    proxy.answer("/v1/tables", error(status, code))
    with Client([proxy.url, other.url], token="bad") as client, pytest.raises(AuthError) as e:
        client.get("t", "k")
    assert isinstance(e.value, QueryError)  # `except QueryError` still catches it
    assert (e.value.status, e.value.code) == (status, code)
    assert proxy.asked("/v1/tables")[0].headers["authorization"] == "Bearer bad"
    assert other.seen == []  # every node applies one policy: no other is asked


def test_a_refused_read_is_an_auth_error(proxy: Proxy) -> None:
    proxy.answer("/v1/tables/t/keys/k", Answer(401, b"<html>Login required</html>"))
    with Client(proxy.url) as client, pytest.raises(AuthError) as e:
        client.get("t", "k")
    assert e.value.status == 401 and "Login required" in e.value.message


@pytest.mark.parametrize(
    "answer",
    [
        error(403, "forbidden"),
        # a token that expires during the watch: an error event on the open stream
        Answer(
            200,
            b'event: error\ndata: {"error": {"code": "unauthorized", "message": "expired"}}\n\n',
            {"content-type": "text/event-stream"},
        ),
    ],
)
def test_a_refused_watch_is_both_watch_and_auth_error(proxy: Proxy, answer: Answer) -> None:
    proxy.answer("/v1/tables/t/watch", answer)
    with Client(proxy.url) as client, pytest.raises(WatchAuthError) as e:
        next(iter(client.watch("t", prefix="a")))
    assert isinstance(e.value, WatchError) and isinstance(e.value, AuthError)
    assert e.value.status == (403 if answer.status == 403 else 401)


@pytest.mark.parametrize("path", ["/v1/tables", "/v1/tables/t/keys/k", "/v1/tables/t/range", COUNT])
def test_an_html_error_page_is_a_query_error_with_status_and_text(proxy: Proxy, path: str) -> None:
    proxy.answer(path, Answer(502, HTML, {"content-type": "text/html"}))
    with Client(proxy.url, retries=1) as client, pytest.raises(QueryError) as e:
        if path == COUNT:
            client.count("t")
        elif path.endswith("/range"):
            list(client.range("t"))
        else:
            client.get("t", "k")
    assert e.value.status == 502 and e.value.code == "bad_gateway"
    assert "text/html" in e.value.message and "<title>502 Bad Gateway</title>" in e.value.message
    assert str(e.value).startswith("502 bad_gateway: ")


def test_a_200_that_is_not_json_is_a_query_error(proxy: Proxy) -> None:
    proxy.answer(COUNT, Answer(200, b"<html>portal</html>", {"content-type": "text/html"}))
    with Client(proxy.url) as client, pytest.raises(QueryError) as e:
        client.count("t")
    assert e.value.status == 200 and e.value.code == "not_json" and "portal" in e.value.message


def test_a_long_html_page_is_quoted_by_its_start(proxy: Proxy) -> None:
    proxy.answer(COUNT, Answer(500, b"<html>" + b"x" * 100_000, {"content-type": "text/html"}))
    with Client(proxy.url) as client, pytest.raises(QueryError) as e:
        client.count("t")
    assert e.value.message.endswith("x") and len(e.value.message) < 300


# -- the HTTP API's names ----------------------------------------------------------------
def _page(items: list[Any], cursor: str | None) -> Answer:
    return js(200, {"items": items, "next_cursor": cursor})


def test_history_takes_the_api_names(proxy: Proxy) -> None:
    path = "/v1/tables/t/keys/k/history"
    proxy.answer(path, _page([{"value": 2, "timestamp": 20, "offset": 1}], None))
    with Client(proxy.url) as client:
        got = list(
            client.history(
                "t", "k", from_=10, to="2026-01-31T10:00:00Z", order="desc", limit=5, max_lag=3
            )
        )
    assert got == [{"value": 2, "timestamp": 20, "offset": 1}]
    (asked,) = proxy.asked(path)
    assert asked.query == {
        "from": ["10"],
        "to": ["2026-01-31T10:00:00Z"],
        "order": ["desc"],
        "limit": ["5"],
        "max_lag": ["3"],
    }


def test_history_follows_cursors_and_stops_at_limit(proxy: Proxy) -> None:
    path = "/v1/tables/t/keys/k/history"
    versions = [{"value": i, "timestamp": i, "offset": i} for i in range(5)]
    proxy.answer(path, _page(versions[:2], "c1"), _page(versions[2:3], "c2"))
    with Client(proxy.url) as client:
        pages = client.history("t", "k", page_size=2, order="desc", limit=3, cursor="c0")
        assert isinstance(pages, Pages)
        assert list(pages) == versions[:3]
        assert pages.next_cursor == "c2"  # where a read of the rest starts
    first, second = proxy.asked(path)
    assert (first.query["limit"], first.query["cursor"]) == (["2"], ["c0"])
    # the last page asks for what the limit leaves, so its cursor is where the limit ends
    assert (second.query["limit"], second.query["cursor"]) == (["1"], ["c1"])


def test_range_and_index_take_limit_and_cursor(proxy: Proxy) -> None:
    proxy.answer("/v1/tables/t/range", _page([{"key": "a", "value": 1}], "next"))
    proxy.answer(
        "/v1/tables/t/index/color", _page([{"index": "red", "key": "a", "value": 1}], None)
    )
    with Client(proxy.url) as client:
        rows = client.range("t", from_="a", to="b", prefix="a", limit=1, cursor="c", max_lag=0)
        assert list(rows) == [("a", 1)] and rows.next_cursor == "next"
        assert list(client.index_range("t", "color", "red", "yellow", limit=7)) == [("red", "a", 1)]
    (asked,) = proxy.asked("/v1/tables/t/range")
    assert asked.query == {
        "from": ["a"],
        "to": ["b"],
        "prefix": ["a"],
        "cursor": ["c"],
        "max_lag": ["0"],
        "limit": ["1"],
    }
    assert proxy.asked("/v1/tables/t/index/color")[0].query["limit"] == ["7"]


def test_windows_takes_from_and_to_and_still_the_earlier_names(proxy: Proxy) -> None:
    path = "/v1/tables/t/keys/k/windows"
    proxy.answer(path, js(200, {"items": [{"start": 0, "end": 10, "value": 1}]}))
    with Client(proxy.url) as client:
        new = client.windows("t", "k", from_=5, to=50, timeout_ms=100)
        with pytest.warns(DeprecationWarning) as warned:
            old = client.windows("t", "k", from_ms=5, to_ms=50, timeout_ms=100)
        assert [str(w.message) for w in warned] == [
            "from_ms= is now from_= (the HTTP API's name)",
            "to_ms= is now to= (the HTTP API's name)",
        ]
        assert warned[0].filename == __file__  # it points at the caller
        with pytest.raises(TypeError):
            client.windows("t", "k", from_=5, from_ms=5)
    assert new == old == [{"start": 0, "end": 10, "value": 1}]
    a, b = proxy.asked(path)
    assert a.query == b.query == {"from": ["5"], "to": ["50"], "timeout_ms": ["100"]}


def test_watch_takes_from_and_to_and_still_start_and_end(proxy: Proxy) -> None:
    path = "/v1/tables/t/watch"
    stream = Answer(
        200, b"event: ready\nid: t@0:1\ndata: {}\n\n", {"content-type": "text/event-stream"}
    )
    proxy.answer(path, stream)
    with Client(proxy.url) as client:
        assert next(iter(client.watch("t", from_="a", to="m"))).event == "ready"
        with pytest.warns(DeprecationWarning) as warned:
            assert next(iter(client.watch("t", start="a", end="m"))).event == "ready"
        assert [str(w.message).split(" (")[0] for w in warned] == [
            "start= is now from_=",
            "end= is now to=",
        ]
    a, b = proxy.asked(path)[:2]
    assert a.query == b.query == {"from": ["a"], "to": ["m"]}


def test_after_is_merged_with_the_clients_own_position(proxy: Proxy) -> None:
    path = "/v1/tables/t/keys/k"
    proxy.answer(path, js(200, {"key": "k", "value": 1, "partition": 0, "offset": 3}))
    with Client(proxy.url) as client:
        client.observe("t@0:5,1:9")
        client.get("t", "k", after="t@0:7")
    (asked,) = proxy.asked(path)
    # one token, the later offset of each partition: a node reads one after, the query's
    # before the header's, so the caller's must not stand in for the client's own
    assert "after" not in asked.query
    assert asked.headers["x-tablecast-after"] == "t@0:7,1:9"


def test_a_limit_below_one_is_refused() -> None:
    with Client("http://127.0.0.1:9") as client, pytest.raises(ValueError):
        client.range("t", limit=0)


# -- what the package exports --------------------------------------------------------------
def test_every_error_the_client_raises_is_exported_without_loading_httpx() -> None:
    code = (
        "import sys, tablecast\n"
        "from tablecast import AuthError, QueryError, WatchAuthError, WatchError\n"
        "assert issubclass(AuthError, QueryError)\n"
        "assert issubclass(WatchAuthError, WatchError) and issubclass(WatchAuthError, AuthError)\n"
        "assert 'httpx' not in sys.modules, 'the errors loaded the HTTP client'\n"
        "assert tablecast.Client.__name__ == 'Client' and 'httpx' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    for name in ("AuthError", "QueryError", "WatchAuthError", "WatchError", "Client"):
        assert name in tablecast.__all__
        assert getattr(tablecast, name) is getattr(tablecast.client, name)


def test_serde_bytes_is_a_plain_function_and_the_builtin_stays_a_type() -> None:
    assert serde.bytes().format == "bytes" and serde.bytes_ is serde.bytes
    assert "bytes" in serde.__all__
    # annotations in the module name the builtin type, not the function
    assert typing.get_type_hints(serde.Serde.serialize)["return"] is builtins.bytes
    assert serde.bytes().serialize(bytearray(b"\xff")) == b"\xff"
