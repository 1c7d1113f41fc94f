"""The docs stand alone: the HTTP API reference is what the nodes serve, and no page points
outside the repository."""

from __future__ import annotations

from pathlib import Path

from tablecast.server import apidoc

ROOT = Path(__file__).resolve().parents[2]


def test_http_api_reference_is_generated_from_the_openapi_document() -> None:
    committed = (ROOT / "docs" / "http-api.md").read_text()
    assert committed == apidoc.markdown(), (
        "docs/http-api.md is stale: python -m tablecast.server.apidoc > docs/http-api.md"
    )


def test_docs_do_not_point_outside_the_repository() -> None:
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        assert "../shared" not in text and "shared folder" not in text, page
