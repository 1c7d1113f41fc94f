"""A real browser for the console's tests: Playwright driving Debian's chromium.

Playwright's own browser download cannot work here (no internet beyond package
mirrors), so the tests use the distribution's chromium, installed with apt-get
on first use when the tests run as root, and skip with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest


def chromium() -> str:
    """The chromium executable, installed from Debian's packages if it is missing."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("the console's browser tests need Debian's chromium (apt-get install chromium)")
    print("[tests] installing Debian's chromium for the console tests (once) ...", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(
        ["apt-get", "install", "-y", "-q", "chromium"], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:  # a stale package index: refresh it once
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", "chromium"], env=env, capture_output=True, text=True
        )
    found = shutil.which("chromium")
    if not found:
        pytest.fail(f"apt-get install chromium failed: {done.stderr[-2000:]}")
    return found


def launch() -> Iterator[Any]:
    """A headless chromium, closed afterwards."""
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser
        finally:
            browser.close()
