"""Loading the App defined in a user's Python file."""

from __future__ import annotations

import runpy
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from tablecast.cli.errors import Failure
from tablecast.pipeline.app import App


def load_module(path: str | Path) -> dict[str, Any]:
    # not "__main__": a file that calls app.run() under a main guard is only loaded
    return runpy.run_path(str(path), run_name="tablecast_app")


def load_app(path: str | Path) -> App:
    """The one App `path` defines; :class:`Failure` (one line) if it defines none or several,
    or fails while it is loaded (the cause is chained: -v shows it)."""
    try:
        found = load_module(path)
    except Exception as e:  # the user's code: say which file failed, and how
        raise Failure(f"{path} failed while loading: {type(e).__name__}: {e}") from e
    apps = [v for v in found.values() if isinstance(v, App)]
    if len(apps) != 1:
        raise Failure(f"{path}: expected exactly one tablecast.App, found {len(apps)}")
    return apps[0]


def peek_app(path: str | Path) -> App:
    """The App of a file, for its id and tables only (defining an App starts no Spark)."""
    return load_app(path)


def stop_on_sigterm() -> None:
    """Let SIGTERM stop a pipeline as cleanly as Ctrl-C does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
