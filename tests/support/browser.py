"""A real browser for the console's tests: Playwright driving Debian's chromium.

Playwright's own browser download cannot work here (no internet beyond package
mirrors), so the tests use the distribution's chromium, installed with apt-get
on first use when the tests run as root, and skip with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from .apt import apt_install


def chromium() -> str:
    """The chromium executable, installed from Debian's packages if it is missing."""
    found = shutil.which("chromium")
    if found:
        return found
    problem = apt_install("chromium")
    if problem and os.geteuid() != 0:
        pytest.skip(f"the console's browser tests need Debian's chromium: {problem}")
    found = shutil.which("chromium")
    if not found:
        pytest.fail(f"apt-get install chromium failed: {problem}")
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
