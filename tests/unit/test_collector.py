"""A serving node's garbage-collector settings (collector.py), in a fresh interpreter:
they are process-wide, and the test run's own must stay as they are."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from tablecast.server.collector import NEVER, YOUNG, tune
tune()
young, _, old = gc.get_threshold()
assert (young, old) == (YOUNG, NEVER), gc.get_threshold()
assert gc.get_freeze_count() > 0
assert YOUNG > 700  # CPython's default: young collections walked the requests in flight
"""


def test_tune_freezes_start_up_and_collects_young_objects_less_often() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
