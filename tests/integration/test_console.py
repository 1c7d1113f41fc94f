"""The web console in a real browser (Playwright driving Debian's chromium) against a real
3-node cluster with the stock-price pipeline running: every page loads without console
errors and shows the cluster, the tables, a key, live changes, the pipeline's progress and
its dead letters; a node killed turns red. With auth on, the page asks for a token and shows
only what the token's policy grants.

Screenshots go to the test's directory; with TABLECAST_SCREENSHOTS=DIR they are also
written there (docs/console/ holds the ones the README shows).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest

from tablecast import serde
from tablecast.kafka.topics import ensure_topic, table_topic

from ..support.browser import launch
from ..support.procs import NodeProcess, eventually, start_node
from .kafka_io import produce
from .tables import make_table
from .test_examples import Run, example

pytestmark = pytest.mark.integration

SHOTS = os.environ.get("TABLECAST_SCREENSHOTS")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from launch()


class Page:
    """A console page that records every console error and uncaught exception."""

    def __init__(self, browser: Any, url: str, shots: Path) -> None:
        self.context = browser.new_context(viewport={"width": 1360, "height": 860})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.on(
            "console",
            lambda m: (
                self.errors.append(f"console.{m.type}: {m.text} ({m.location.get('url')})")
                if m.type == "error"
                else None
            ),
        )
        self.url, self.shots = url, shots

    def open(self, tab: str = "cluster") -> None:
        self.page.goto(f"{self.url}/ui#{tab}")
        self.page.wait_for_selector(f"#{tab}:not([hidden])")

    def tab(self, name: str) -> None:
        self.page.click(f"nav button[data-tab={name}]")
        self.page.wait_for_selector(f"#{name}:not([hidden])")

    def shot(self, name: str) -> None:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(SHOTS) / path.name)

    def close(self) -> None:
        self.context.close()


def ticks(ex: Any, rng: random.Random, n: int, start: int) -> list[tuple[bytes, bytes]]:
    out = []
    for i in range(n):
        tick = {
            "symbol": rng.choice(ex.SYMBOLS),
            "exchange": rng.choice(ex.EXCHANGES),
            "price": round(rng.uniform(1, 999), 2),
            "time": int(time.time() * 1000) + start + i,
        }
        out.append((tick["symbol"].encode(), orjson.dumps(tick)))
    return out


def test_the_console_shows_a_live_cluster(
    bootstrap: str, spark: Any, unique: str, tmp_path: Path, logs: Path, browser: Any
) -> None:
    ex = example("stock_prices")
    topic = f"{unique}-prices"
    ensure_topic(bootstrap, topic, ex.PARTITIONS)
    rng = random.Random(8)
    produce(bootstrap, topic, ticks(ex, rng, 300, 0))
    # a record the pipeline cannot read: it goes to the dead-letter topic
    produce(bootstrap, topic, [(b"AAPL", b"{not json")])
    run = Run(ex.build(unique, topic), bootstrap, spark, tmp_path / "state", logs)
    stop = threading.Event()
    page = None
    try:
        nodes = [run.node("--standby-replicas", "1") for _ in range(3)]
        run.settle("prices")
        # a steady trickle of ticks, so that the pipeline's progress moves and a watch changes
        feeder = threading.Thread(target=_feed, args=(bootstrap, topic, ex, stop), daemon=True)
        feeder.start()
        page = Page(browser, nodes[0].url, tmp_path)

        started = time.monotonic()
        page.open("cluster")
        # how fast it paints is a benchmark's business (python -m bench console): here, that it does
        assert page.page.evaluate(
            "performance.getEntriesByName('first-contentful-paint').length"
        ), "the page never painted"
        # the map: every node, each of the 30 partitions active on exactly one of them
        page.page.wait_for_function(
            "document.querySelectorAll('#cluster-map tbody tr').length === 3"
        )
        page.page.wait_for_function(
            "document.querySelectorAll('#cluster-map .cell.active').length === 30", timeout=30_000
        )
        ids = page.page.eval_on_selector_all(
            "#cluster-map tbody tr", "rows => rows.map(r => r.dataset.node)"
        )
        assert sorted(ids) == sorted(n.get("/healthz").json()["node"] for n in nodes)
        # under each partition, how old the newest record its active replica applied is
        ages = page.page.eval_on_selector_all(
            "#cluster-map tfoot td[data-partition]", "cells => cells.map(c => c.textContent)"
        )
        assert len(ages) == 30 and all(re.fullmatch(r"–|\d+ ms|\d+\.\d s", a) for a in ages), ages
        assert any(a != "–" for a in ages), ages
        page.page.click("#cluster-map tbody tr")
        page.page.wait_for_selector("#node-detail:not([hidden]) dl")
        assert "cache hit rate" in page.page.inner_text("#node-detail")
        page.shot("cluster")

        # tables: the row count, then a key lookup answered as the API answers it
        page.tab("tables")
        page.page.wait_for_selector("#tables-list tbody tr")
        row = page.page.inner_text("#tables-list tbody tr")
        assert (
            "prices" in row and str(nodes[0].get("/v1/tables/prices/count").json()["count"]) in row
        )
        page.page.click("#tables-list tbody tr")
        page.page.fill("#key-input", "AAPL")
        asked = time.monotonic()
        page.page.click("#key-form button[type=submit]")
        page.page.wait_for_selector("#result pre")
        # within a second on a quiet machine (python -m bench console); a loaded one gets slack
        assert time.monotonic() - asked < 5.0
        shown = orjson.loads(page.page.inner_text("#result pre"))
        assert shown["key"] == "AAPL" and set(shown["value"]) <= set(ex.EXCHANGES)
        assert "answered by" in page.page.inner_text("#result")
        page.page.fill("#scan-prefix", "A")
        page.page.click("#scan-form button[type=submit]")
        page.page.wait_for_selector("#result table tbody tr")
        keys = page.page.eval_on_selector_all(
            "#result tbody tr td:first-child", "cells => cells.map(c => JSON.parse(c.textContent))"
        )
        assert keys and keys == sorted(keys) and all(k.startswith("A") for k in keys)
        page.shot("tables")

        # live: a watch on a key shows the value it takes, in place. The row is written to
        # the table topic as the pipeline would (whose micro-batches take 7-20 s here): what
        # is timed is the console's part, node to page
        page.tab("live")
        page.page.select_option("#watch-table", "prices")
        # a symbol the background ticks never touch: the one change below is the only one
        page.page.fill("#watch-input", "TCST")
        page.page.click("#watch-form button[type=submit]")
        page.page.wait_for_function(
            "document.querySelector('#watch-status').textContent.endsWith('live')"
        )
        before = page.page.inner_text("#watch-rows tbody")
        board = {"NYSE": {"price": 123.45, "time": int(time.time() * 1000)}}
        produce(bootstrap, table_topic(unique, "prices"), [(b"TCST", orjson.dumps(board))])
        written = time.monotonic()
        page.page.wait_for_function(
            "document.querySelector('#watch-rows tbody').textContent.includes('123.45')",
            timeout=30_000,
        )
        # within a second on a quiet machine (python -m bench console); a loaded one gets slack
        assert time.monotonic() - written < 5.0
        assert "123.45" not in before
        page.shot("live")
        page.page.click("#watch-stop")

        # the pipeline's progress and its dead letter
        page.tab("pipeline")
        page.page.wait_for_selector("#pipeline-queries .panel", timeout=30_000)
        assert "processed rows/s" in page.page.inner_text("#pipeline-queries")
        page.shot("pipeline")
        page.tab("deadletters")
        page.page.wait_for_selector("#dlq-items tbody tr", timeout=30_000)
        letters = page.page.inner_text("#dlq-items")
        assert topic in letters and "{not json" in letters
        page.shot("deadletters")

        # a node killed turns red within seconds
        page.tab("cluster")
        victim = nodes[2]
        victim_id = victim.get("/healthz").json()["node"]
        victim.proc.kill()
        victim.proc.wait(30)
        page.page.wait_for_selector(
            f"#cluster-map tr.node-down[data-node='{victim_id}']", timeout=15_000
        )
        page.shot("node-down")
        assert not page.errors, page.errors
        assert time.monotonic() - started < 300
    finally:
        stop.set()
        if page is not None:
            page.close()
        run.stop()


def _feed(bootstrap: str, topic: str, ex: Any, stop: threading.Event) -> None:
    rng = random.Random(9)
    while not stop.wait(0.5):
        produce(bootstrap, topic, ticks(ex, rng, 20, 0))


SECRET = "console-test-secret-0123456789abcdef0123"


def test_the_console_asks_for_a_token_and_shows_only_what_it_grants(
    bootstrap: str, unique: str, logs: Path, tmp_path: Path, browser: Any
) -> None:
    public = make_table(bootstrap, unique, "public", 3, serde.string(), serde.json())
    public.write(bootstrap, [("a", {"n": 1}), ("b", {"n": 2})])
    private = make_table(bootstrap, unique, "private", 3, serde.string(), serde.json())
    private.write(bootstrap, [("secret", {"n": 3})])
    policy = tmp_path / "policy.json"
    policy.write_bytes(
        orjson.dumps(
            {
                "rules": [
                    {"match": {"role": "admin"}, "tables": {"*": "*"}},
                    {"match": {"role": "user"}, "tables": {"public": "*"}},
                ]
            }
        )
    )
    flags = ("--auth-jwt-secret", SECRET, "--auth-policy", str(policy))
    node: NodeProcess = start_node(unique, bootstrap, logs, *flags)
    page = None
    try:
        user = _token("user")
        node.headers = {"authorization": f"Bearer {user}"}
        node.wait_ready()
        page = Page(browser, node.url, tmp_path)
        page.open("tables")
        page.page.wait_for_selector("#token-dialog[open]")  # 401: it asks
        page.page.fill("#token-input", user)
        page.page.click("#token-form button[value=save]")
        page.page.wait_for_selector("#tables-list tbody tr")
        eventually(lambda: "public" in page.page.inner_text("#tables-list tbody"), 10)  # type: ignore[union-attr]
        assert "private" not in page.page.inner_text("#tables-list tbody")
        # the user's token does not open the pipeline's dead letters
        page.tab("deadletters")
        page.page.wait_for_selector("#banner:not([hidden])")
        assert "forbidden" in page.page.inner_text("#banner")
        # the token lives in this tab's session storage only
        stored = page.page.evaluate("sessionStorage.getItem('tablecast.token')")
        assert stored == user and page.page.evaluate("localStorage.length") == 0
        page.shot("token")
        # an admin sees both tables
        page.page.click("#token-button")
        page.page.fill("#token-input", _token("admin"))
        page.page.click("#token-form button[value=save]")
        page.tab("tables")
        eventually(lambda: "private" in page.page.inner_text("#tables-list tbody"), 10)  # type: ignore[union-attr]
        # only the expected 401s and 403s reached the console: no script errors
        assert all("status of 40" in e for e in page.errors), page.errors
    finally:
        if page is not None:
            page.close()
        node.stop()


def _token(role: str) -> str:
    return jwt.encode(
        {"sub": f"someone-{role}", "role": role, "exp": int(time.time()) + 3600}, SECRET, "HS256"
    )
