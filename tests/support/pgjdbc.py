"""SQL run through PostgreSQL's JDBC driver (pgJDBC from Maven Central), by a single-file
Java program (tests/support/jvm/pgjdbc/PgJdbc.java) that java compiles at launch."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import orjson

from tablecast import jvm

POMS = Path(__file__).resolve().parent / "jvm"
SOURCE = POMS / "pgjdbc" / "PgJdbc.java"


def run(
    url: str, statements: list[tuple[str, ...]], user: str = "jdbc", password: str = ""
) -> list[Any]:
    """Each statement (SQL, then its parameters; "long:N" sets a long) through one
    connection: [{"columns", "rows"} | {"error", "message"}] in order."""
    java = jvm.require_java(compiler=True)
    jars = sorted(jvm.jar_dir("pgjdbc", POMS).glob("*.jar"))
    lines = "".join("\t".join(s) + "\n" for s in statements)
    done = subprocess.run(
        [str(java), "-Xmx128m", "-XX:TieredStopAtLevel=1",
         "-cp", os.pathsep.join(str(j) for j in jars), str(SOURCE), url, user, password],
        input=lines, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"PgJdbc failed: {done.stderr[-3000:]}")
    return [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
