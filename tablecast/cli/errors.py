"""How the command line fails: the two kinds of error and the one line that reports them.

Commands raise; ``main`` alone turns an exception into ``tablecast: error: <message>`` and
an exit code (its own module: subcommand modules raise these and ``main`` imports them).
"""

from __future__ import annotations

import sys


class UsageError(Exception):
    """The command line, a ``TABLECAST_`` variable or serve's ``--config`` is wrong: exit 2."""

    code = 2


class Failure(Exception):
    """The command could not do its work (Kafka unreachable, a port taken, no Java): exit 1."""

    code = 1


def one_line(message: str) -> str:
    """`message` as one line: its first non-empty line (a traceback shows the rest)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[0] if lines else ""


def fail(message: str, code: int) -> int:
    """Print the error line every failure of the command line is reported by; return `code`."""
    print(f"tablecast: error: {one_line(message)}", file=sys.stderr, flush=True)
    return code
