"""The web console's speed in a real browser: first paint, a key lookup, a watch.

python -m bench console [--rounds 7] [--keys 1000]

Two nodes (each pinned to core 0) serve a 12-partition table; headless chromium
(Debian's, through Playwright, pinned to core 1 by a ``taskset`` wrapper) opens
the console through the first node. Each round, in a fresh browser context (no
cache), every page is loaded on its own and its first-contentful-paint read
from the browser's own Performance API; then a key lookup is timed from the click to
the answer on the page, and a watch from the record produced to the table
topic to its value on the page. Targets: first paint ≤ 200 ms on every page,
lookup and watch update ≤ 1 s — "met" only when the whole interquartile range
of the rounds clears them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import orjson

from bench.common import (
    LOAD_CPU,
    command,
    facts_line,
    machine,
    save,
    wait_http,
    write_section,
)
from bench.stack import Stack, short_key
from tests.support.apt import apt_install

log = logging.getLogger("bench")
PAGES = ("cluster", "tables", "live", "pipeline", "deadletters")
TARGET_PAINT_MS = 200.0
TARGET_LOOKUP_MS = 1000.0
TARGET_WATCH_MS = 1000.0
TABLE = "quotes"


def args_of(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench console")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--keys", type=int, default=1_000)
    return p.parse_args(argv)


def pinned_chromium(where: Path) -> str:
    """A wrapper that runs Debian's chromium on the load core, so it never shares the node's."""
    found = shutil.which("chromium")
    if found is None:
        problem = apt_install("chromium")
        found = shutil.which("chromium")
        if found is None:
            raise SystemExit(f"bench console needs Debian's chromium: {problem}")
    script = where / "chromium-pinned"
    script.write_text(f'#!/bin/sh\nexec taskset -c {LOAD_CPU} {found} "$@"\n')
    script.chmod(0o755)
    return str(script)


def first_paint(browser: Any, url: str, name: str) -> float:
    """The page's first-contentful-paint, loaded in a fresh context (nothing cached)."""
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    try:
        page = context.new_page()
        page.goto(f"{url}/ui#{name}")
        page.wait_for_selector(f"#{name}:not([hidden])")
        page.wait_for_function("performance.getEntriesByName('first-contentful-paint').length > 0")
        return float(
            page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime")
        )
    finally:
        context.close()


def one_round(browser: Any, url: str, stack: Stack, topic: str, i: int) -> dict[str, Any]:
    out: dict[str, Any] = {"paint_ms": {name: first_paint(browser, url, name) for name in PAGES}}
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    try:
        page = context.new_page()
        # a key lookup, click to answer on the page
        page.goto(f"{url}/ui#tables")
        page.wait_for_selector("#tables-list tbody tr")
        page.click("#tables-list tbody tr")
        page.fill("#key-input", short_key(i).decode())
        started = time.monotonic()
        page.click("#key-form button[type=submit]")
        page.wait_for_selector("#result pre")
        out["lookup_ms"] = (time.monotonic() - started) * 1000
        # a watch: the record produced to the table topic, then its value on the page
        page.click("nav button[data-tab=live]")
        page.wait_for_selector("#live:not([hidden])")
        page.select_option("#watch-table", TABLE)
        page.fill("#watch-input", short_key(i).decode())
        page.click("#watch-form button[type=submit]")
        page.wait_for_function(
            "document.querySelector('#watch-status').textContent.endsWith('live')"
        )
        marker = f"round-{i}-{time.time_ns()}"
        producer = stack.producer(**{"linger.ms": 0})
        started = time.monotonic()
        producer.produce(topic, key=short_key(i), value=orjson.dumps({"marker": marker}))
        producer.flush(10)
        page.wait_for_function(
            f"document.querySelector('#watch-rows tbody').textContent.includes({marker!r})",
            timeout=30_000,
        )
        out["watch_ms"] = (time.monotonic() - started) * 1000
    finally:
        context.close()
    return out


def spread(values: list[float]) -> dict[str, Any]:
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {"values": values, "median": statistics.median(values), "iqr": [q1, q3]}


def main(argv: list[str]) -> None:
    from playwright.sync_api import sync_playwright

    args = args_of(argv)
    result: dict[str, Any] = {"machine": machine(), "command": command()}
    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    with Stack() as stack:
        topic = stack.table(TABLE, args.keys, partitions=12, store="memory")
        nodes = [stack.node(stack.dir / f"node-{n}") for n in range(2)]
        for proc, url in nodes:
            wait_http(url + "/readyz", timeout=300, proc=proc)
        url = nodes[0][1]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=pinned_chromium(stack.dir),
                headless=True,
                args=["--no-sandbox", "--disable-gpu"],
            )
            try:
                one_round(browser, url, stack, topic, 0)  # warm-up: the node's first answers
                for i in range(1, args.rounds + 1):
                    rounds.append(one_round(browser, url, stack, topic, i))
                    log.info("console round %d of %d: %s", i, args.rounds, rounds[-1])
            finally:
                browser.close()
    result["rounds"] = rounds
    result["paint_ms"] = {n: spread([r["paint_ms"][n] for r in rounds]) for n in PAGES}
    result["lookup_ms"] = spread([r["lookup_ms"] for r in rounds])
    result["watch_ms"] = spread([r["watch_ms"] for r in rounds])
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    save("console", result)
    write_section("console", render(result))


def _met(s: dict[str, Any], target: float) -> str:
    lo, hi = s["iqr"]
    return "met" if hi <= target else ("**missed**" if lo > target else "not settled")


def _row(name: str, s: dict[str, Any], target: float) -> str:
    lo, hi = s["iqr"]
    return (
        f"| {name} | {s['median']:.0f} | {lo:.0f}–{hi:.0f} | {max(s['values']):.0f} "
        f"| ≤ {target:.0f} | {_met(s, target)} |"
    )


def render(r: dict[str, Any]) -> str:
    rows = [_row(f"first paint, {n}", r["paint_ms"][n], TARGET_PAINT_MS) for n in PAGES]
    rows.append(_row("key lookup (click → answer shown)", r["lookup_ms"], TARGET_LOOKUP_MS))
    rows.append(_row("watch (produced → value shown)", r["watch_ms"], TARGET_WATCH_MS))
    before, after = r["load_average"]["before"], r["load_average"]["after"]
    table = "\n".join(rows)
    return f"""## Web console

`{r["command"]}` — {facts_line(r["machine"])}. Two nodes pinned to core 0 serve a
12-partition in-memory table; headless chromium (Debian's, driven by Playwright) on
core 1 opens `/ui` on the first node. {len(r["rounds"])} rounds after a warm-up one: every page loaded
in a fresh browser context (nothing cached) and its first-contentful-paint read from the
browser's Performance API, a key lookup from the click to the answer on the page, a
watch from the record produced to the table topic (acknowledged) to its value on the
page. What could flatter us: loopback only, a small table, one browser tab.

| ms | median | interquartile range | max | target | |
|---|---|---|---|---|---|
{table}

Load average (1, 5, 15 min) before the run: {", ".join(f"{x:.1f}" for x in before)};
after: {", ".join(f"{x:.1f}" for x in after)}.
"""


if __name__ == "__main__":
    import sys

    logging.basicConfig(level=logging.INFO)
    main(sys.argv[1:])
