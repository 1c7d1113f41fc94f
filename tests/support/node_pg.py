"""SQL run through node-postgres (npm's ``pg``), installed once into the test cache with
npm, by tests/support/js/pg_client.js."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import orjson

from tablecast import jvm

VERSION = "8.23.1"
SCRIPT = Path(__file__).resolve().parent / "js" / "pg_client.js"


def _modules() -> Path:
    home = jvm.cache_root() / f"node-pg-{VERSION}"
    if not (home / ".complete").exists():
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("npm is not installed (Debian: apt-get install npm)")
        print(f"[tablecast] npm install pg@{VERSION} into {home} ...", flush=True)
        home.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(home), f"pg@{VERSION}"],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
        (home / ".complete").touch()
    return home / "node_modules"


def run(dsn: str, statements: list[dict[str, Any]]) -> list[Any]:
    """Each statement ({"sql", "params", "name"}: a name prepares it) through one connection."""
    lines = "".join(orjson.dumps(s).decode() + "\n" for s in statements)
    done = subprocess.run(
        ["node", str(SCRIPT), dsn],
        input=lines, capture_output=True, text=True, timeout=120,
        env={**os.environ, "NODE_PATH": str(_modules())},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"pg_client.js failed: {done.stderr[-3000:]}")
    return [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
