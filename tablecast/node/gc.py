"""Garbage collection for a serving node: full collections on a timer, not in mid-stream.

A node holds many long-lived objects: each watch's state, the feed rings'
records, the read cache. CPython's automatic full (generation 2) collection
walks all of them whenever enough new objects have survived; with 2,000
watches and 1,000 updates/s it paused the node for 50–160 ms every few
seconds (measured with ``gc.callbacks``), and every event due meanwhile
waited: that was the tail of the delivery latency.

Reference counting frees almost everything here; the collector is needed only
for reference cycles, and young ones are still collected as usual (cheap:
generations 0 and 1 hold only recent objects). So the objects made while
starting are frozen (never walked again), automatic full collections are off,
and a timer runs one every ``FULL_EVERY_S``, logging how long it took.

Generation 0 is collected after :data:`YOUNG` net new objects, not CPython's
700: each collection walks every young object still alive, and under load those
are mostly the requests in flight (their coroutines, futures and closures), the
same ones again and again. At 700, young collections took 7% of a forwarding
node's main thread (py-spy); at 10,000 each one walks about 0.25 ms' worth.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger(__name__)

#: how often cycles that reached the oldest generation are collected
FULL_EVERY_S = 300.0
#: generation 2 is collected after this many generation-1 collections: never, in practice
NEVER = 2**31 - 1
#: net new objects that trigger a young (generation 0) collection
YOUNG = 10_000
#: a full collection longer than this is logged at INFO (else DEBUG)
SLOW_S = 0.1


def tune() -> None:
    """Freeze what starting made and leave full collections to :func:`collect_periodically`."""
    gc.collect()
    gc.freeze()
    _, middle, _ = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, NEVER)


async def collect_periodically(every: float = FULL_EVERY_S) -> None:
    """Run a full collection every `every` seconds until cancelled."""
    while True:
        await asyncio.sleep(every)
        started = time.perf_counter()
        found = gc.collect()
        took = time.perf_counter() - started
        log.log(
            logging.INFO if took > SLOW_S else logging.DEBUG,
            "full garbage collection: %.0f ms, %d unreachable objects",
            took * 1000,
            found,
        )
