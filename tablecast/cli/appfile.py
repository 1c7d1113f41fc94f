"""Loading the App defined in a user's Python file."""

from __future__ import annotations

import os
import runpy
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from tablecast.pipeline.app import App


def load_module(path: str | Path) -> dict[str, Any]:
    # not "__main__": a file that calls app.run() under a main guard is only loaded
    return runpy.run_path(str(path), run_name="tablecast_app")


def load_app(path: str | Path) -> App:
    apps = [v for v in load_module(path).values() if isinstance(v, App)]
    if len(apps) != 1:
        raise SystemExit(f"{path}: expected exactly one tablecast.App, found {len(apps)}")
    return apps[0]


def peek_app(path: str | Path) -> App:
    """The App of a file, for its id and tables only: without starting Spark when the
    file builds no Column at import (defining an App otherwise starts Spark)."""
    before = os.environ.get("TABLECAST_NO_SPARK")
    os.environ["TABLECAST_NO_SPARK"] = "1"
    try:
        return load_app(path)
    except Exception:  # it needs Spark to build its Columns: pay for it once
        os.environ.pop("TABLECAST_NO_SPARK", None)
        return load_app(path)
    finally:
        if before is None:
            os.environ.pop("TABLECAST_NO_SPARK", None)
        else:
            os.environ["TABLECAST_NO_SPARK"] = before


def stop_on_sigterm() -> None:
    """Let SIGTERM stop a pipeline as cleanly as Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
