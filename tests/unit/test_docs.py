"""The docs stand alone: the HTTP API reference is what the nodes serve, and no page points
outside the repository."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tablecast.http import apidoc

ROOT = Path(__file__).resolve().parents[2]


def test_http_api_reference_is_generated_from_the_openapi_document() -> None:
    committed = (ROOT / "docs" / "http-api.md").read_text()
    assert committed == apidoc.markdown(), (
        "docs/http-api.md is stale: python -m tablecast.http.apidoc > docs/http-api.md"
    )


#: a Markdown link's target, and a relative path written out in the text
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_CLIMB = re.compile(r"(?<![\w/.~-])(\.\./[^\s)`'\"\],;>]*)")


def test_docs_do_not_point_outside_the_repository() -> None:
    """Every relative link and every ``../`` path of a page names a file of this repository."""
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        links = [t.split("#")[0] for t in _LINK.findall(text) if "://" not in t]
        paths = [t for t in links if t and not t.startswith("mailto:")] + _CLIMB.findall(text)
        for target in paths:
            found = (page.parent / target).resolve()
            assert found.is_relative_to(ROOT) and found.exists(), (page.name, target)
        assert "shared folder" not in text, page


def _shell_blocks() -> list[tuple[str, str]]:
    """Every fenced shell block of the README and docs/: (page, its text)."""
    blocks = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for m in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", page.read_text(), re.S):
            blocks.append((page.name, m.group(1)))
    return blocks


#: commands of the docs that need something running or something to install (a broker,
#: Spark, a cluster, the network): only their syntax is checked here
NEEDS_SERVICES = re.compile(
    r"^\s*(\./run |curl |tablecast |pip |python -m (venv|build|tablecast\.jvm)|kubectl |docker |"
    r"spark-submit |"
    r"\$SPARK_HOME/|export SPARK_HOME|tc-env/|JARS=|TABLECAST_(EXAMPLES|LONG)=|--|\"\$|#|$)"
)
#: commands that need nothing but this package: run, and must exit 0
RUNNABLE = ("python -m tablecast.submit",)


def test_every_shell_line_of_the_docs_parses_and_quotes_its_urls() -> None:
    """What a reader pastes is right as written: each block is valid bash, and a URL with a
    query string is quoted (unquoted, the shell takes `?` for a pattern and `&` for a
    background job)."""
    blocks = _shell_blocks()
    assert blocks
    for page, text in blocks:
        done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, (page, text, done.stderr)
        for url in re.finditer(r"(?<![\"'])\bhttps?://[^\s'\"]*[?&]", text):
            raise AssertionError(f"{page}: unquoted URL with a query: {url.group(0)}")


def test_every_shell_line_of_the_docs_is_run_or_known_to_need_services() -> None:
    """A line that needs no services runs to exit 0; every other line is one the pattern
    above knows, so a new kind of line is looked at rather than skipped."""
    for page, text in _shell_blocks():
        lines = text.replace("\\\n", " ").splitlines()
        for line in lines:
            command = line.split("  #", 1)[0].strip()
            if any(command.startswith(r) for r in RUNNABLE):
                done = subprocess.run(
                    [sys.executable, *command.split()[1:]], capture_output=True, text=True
                )
                assert done.returncode == 0, (page, line, done.stderr[-2000:])
            else:
                assert NEEDS_SERVICES.match(line), f"{page}: not run, not known: {line!r}"
