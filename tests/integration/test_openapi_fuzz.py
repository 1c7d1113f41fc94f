"""schemathesis generates requests from the node's own /openapi.json: none may get a 5xx."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tablecast import serde

from ..support.procs import start_node
from .tables import make_table

pytestmark = pytest.mark.integration


def test_no_5xx_for_generated_requests(
    bootstrap: str, unique: str, logs: Path, tmp_path: Path
) -> None:
    model = make_table(bootstrap, unique, "kv", 3, serde.string(), serde.json(), store="memory")
    model.write(bootstrap, [(f"k{i}", {"i": i}) for i in range(30)])
    node = start_node(unique, bootstrap, logs)
    try:
        node.wait_ready()
        cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
        assert cli, "schemathesis is a dev dependency"
        done = subprocess.run(
            [
                cli,
                "run",
                f"{node.url}/openapi.json",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                "30",
                "--workers",
                "1",
                "--seed",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,  # it keeps a cache folder in its working directory
        )
        assert done.returncode == 0, done.stdout[-4000:]
        assert "passed" in done.stdout
        assert node.proc.poll() is None
    finally:
        node.stop()
