"""The console's files, read once from the package and served from memory."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load() -> dict[str, Asset]:
    """Every file of ``tablecast/console/static`` by name."""
    assets = {}
    for entry in resources.files("tablecast.console").joinpath("static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if not entry.is_file() or suffix not in TYPES:
            continue
        body = entry.read_bytes()
        etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
        assets[entry.name] = Asset(body, TYPES[suffix], etag)
    return assets
