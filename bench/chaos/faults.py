"""The seeded fault schedule and one injector per fault; each injector returns after recovery."""

from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .cluster import KEYS, Cluster, Producer

log = logging.getLogger("bench.chaos")

ALL = (
    "node-kill9",
    "node-sigterm",
    "driver-kill9",
    "broker-30s",
    "disk-full",
    "malformed-input",
    "malformed-table",
    "rolling-restart",
)
#: how long the broker stays down and a node's disk full; a soak shorter than FULL_HOLDS_MIN
#: minutes (the one in ./run tests) holds each for a third of that, still running every fault
BROKER_DOWN_S = 30.0
FILL_S = 20.0
FULL_HOLDS_MIN = 5.0


def is_short(minutes: float) -> bool:
    """Whether a soak of `minutes` is a short one (./run tests'), with shorter holds."""
    return minutes < FULL_HOLDS_MIN


@dataclass
class Event:
    fault: str
    started: float  # seconds since the soak began
    ended: float = 0.0
    detail: str = ""
    problems: list[str] = field(default_factory=list)


def schedule(rng: random.Random, minutes: float) -> list[str]:
    """Every fault once, shuffled, then more random ones while the time allows (~40 s each)."""
    faults = list(ALL)
    rng.shuffle(faults)
    slots = max(len(ALL), int(minutes * 60 / 40))
    faults += [rng.choice(ALL) for _ in range(slots - len(ALL))]
    return faults


class Injector:
    def __init__(
        self, cluster: Cluster, producer: Producer, rng: random.Random, minutes: float
    ) -> None:
        self.c, self.producer, self.rng = cluster, producer, rng
        self.malformed_keys: set[str] = set()
        self.hold = 1 / 3 if is_short(minutes) else 1.0

    def run(self, fault: str, ev: Event) -> None:
        fn: Callable[[Event], None] = getattr(
            self, fault.replace("-", "_").replace("30s", "outage")
        )
        fn(ev)

    def _check_nodes(self, ev: Event) -> None:
        """A node that died on its own is a finding; bring it back so the soak goes on."""
        for i, n in enumerate(self.c.nodes):
            if n.proc.poll() is not None:
                tail = n.log_file.read_text(errors="replace")[-1500:]
                ev.problems.append(f"node{i} exited with {n.proc.returncode}: {tail}")
                self.c.restart_node(i, None)

    def node_kill9(self, ev: Event) -> None:
        i = self.rng.randrange(3)
        ev.detail = f"node{i}"
        self.c.restart_node(i, signal.SIGKILL)

    def node_sigterm(self, ev: Event) -> None:
        i = self.rng.randrange(3)
        ev.detail = f"node{i}"
        self.c.restart_node(i, signal.SIGTERM)

    def driver_kill9(self, ev: Event) -> None:
        self.c.kill_pipeline(signal.SIGKILL)
        self.c.start_pipeline()
        self._check_nodes(ev)

    def broker_outage(self, ev: Event) -> None:
        self.c.broker.stop()
        time.sleep(BROKER_DOWN_S * self.hold)
        self.c.broker.start()
        self._check_nodes(ev)

    def disk_full(self, ev: Event) -> None:
        i = self.c.tmpfs_node
        if i is None:
            ev.detail = "skipped: " + "; ".join(x for x in self.c.notes if "disk-full" in x)
            return
        used = shutil.disk_usage(self.c.data_dir(i))
        ev.detail = f"node{i}, {used.used >> 20} of {used.total >> 20} MiB in use before"
        filler = self.c.data_dir(i) / "filler"
        try:
            with open(filler, "wb") as f:
                chunk = b"\0" * (1 << 20)
                while True:
                    try:
                        f.write(chunk)
                        f.flush()
                    except OSError:
                        break
            time.sleep(FILL_S * self.hold)
        finally:
            try:
                os.unlink(filler)
            except OSError as e:
                ev.problems.append(f"could not remove the filler: {e}")
        time.sleep(5)
        self._check_nodes(ev)

    def malformed_input(self, ev: Event) -> None:
        junk: list[tuple[bytes, bytes | None]] = [
            (b"junk-1", b"{not json"),
            (b"junk-2", b"\xff\xfe"),
            (b"junk-3", b'{"n": "not a number"}'),
            (b"junk-4", b"[]"),
        ]
        for k, v in junk:
            self.producer.raw(self.c.input_topic, k, v)
        ev.detail = f"{len(junk)} records"

    def malformed_table(self, ev: Event) -> None:
        keys = [f"k{self.rng.randrange(KEYS):05d}" for _ in range(3)]
        for k, v in zip(keys, (b"{broken", b"\xff\xff\xff", b""), strict=True):
            self.producer.raw(self.c.table_topic, k.encode(), v)
        self.malformed_keys.update(keys)
        ev.detail = "keys " + ",".join(keys)
        time.sleep(3)
        self._check_nodes(ev)

    def rolling_restart(self, ev: Event) -> None:
        for i in range(3):
            self.c.restart_node(i, signal.SIGTERM)


def inject(injector: Injector, fault: str, t0: float) -> Event:
    ev = Event(fault, time.monotonic() - t0)
    log.info("fault %s begins", fault)
    try:
        injector.run(fault, ev)
    except Exception as e:  # a fault that cannot recover is a finding, not the end of the soak
        log.exception("fault %s", fault)
        ev.problems.append(f"{type(e).__name__}: {e}")
    ev.ended = time.monotonic() - t0
    log.info("fault %s done in %.1f s %s %s", fault, ev.ended - ev.started, ev.detail, ev.problems)
    return ev


def as_dict(ev: Event) -> dict[str, Any]:
    return {
        "fault": ev.fault,
        "start_s": round(ev.started, 1),
        "end_s": round(ev.ended, 1),
        "detail": ev.detail,
        "problems": ev.problems,
    }
