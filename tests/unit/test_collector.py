"""A serving node's garbage-collector settings (collector.py), in a fresh interpreter:
they are process-wide, and the test run's own must stay as they are."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from tablecast.node.gc import NEVER, YOUNG, tune
tune()
young, _, old = gc.get_threshold()
assert (young, old) == (YOUNG, NEVER), gc.get_threshold()
assert gc.get_freeze_count() > 0
assert YOUNG > 700  # CPython's default: young collections walked the requests in flight
"""


def test_tune_freezes_start_up_and_collects_young_objects_less_often() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


PERIODIC = """
import asyncio, gc, logging, weakref
from tablecast.node.gc import collect_periodically, tune

logging.basicConfig(level=logging.DEBUG, format="%(message)s")
tune()


class Node:
    pass


async def main() -> None:
    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle: only a full collection frees it once it is old
    gc.collect(1)
    gc.collect(1)  # both in the oldest generation now, which tune() never collects itself
    gone = weakref.ref(a)
    del a, b
    timer = asyncio.ensure_future(collect_periodically(0.05))
    for _ in range(100):
        await asyncio.sleep(0.02)
        if gone() is None:
            break
    timer.cancel()
    assert gone() is None, "the periodic full collection never ran"


asyncio.run(main())
"""


def test_full_collections_run_on_their_timer() -> None:
    done = subprocess.run([sys.executable, "-c", PERIODIC], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "full garbage collection:" in done.stderr, done.stderr
