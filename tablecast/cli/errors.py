"""How every command reports an error (its own module: subcommand modules use it and
``main`` imports them)."""

from __future__ import annotations

import sys


def fail(message: str, code: int = 2) -> int:
    """Every command's errors in one format: ``tablecast: error: <what went wrong>``."""
    print(f"tablecast: error: {message}", file=sys.stderr, flush=True)
    return code
