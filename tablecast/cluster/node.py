"""A serving node's cluster side: its identity, membership, assignment and replicas."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tablecast.cluster.coordinator import Coordinator
from tablecast.cluster.ingest import Ingestor
from tablecast.cluster.ingest_metrics import IngestMetrics
from tablecast.cluster.membership import Member, Membership
from tablecast.cluster.replica import Replica
from tablecast.cluster.signing import Signer
from tablecast.cluster.view import ClusterView
from tablecast.contract.table_info import TableInfo
from tablecast.store import open_store

log = logging.getLogger(__name__)

TICK_S = 0.1
#: a leaving node answers at least this long after it said it is not ready (while another
#: node can take its reads): load balancers polling /readyz stop sending it reads meanwhile
LEAVE_NOTICE_S = 2.0


@dataclass(frozen=True)
class NodeConfig:
    app_id: str
    bootstrap_servers: str
    url: str
    node_id: str
    data_dir: Path
    standby_replicas: int = 0
    max_key_bytes: int = 4096
    #: read cache in front of RocksDB stores, per table (0: none)
    cache_bytes: int = 64 * 1024 * 1024
    #: whole answers of plain key reads kept by the HTTP server, for the node (0: none)
    answers_bytes: int = 128 * 1024 * 1024
    #: watches one caller (JWT subject, else client address) may have open at once
    watches_per_caller: int = 64
    #: signs membership records and internal calls (None: nothing is signed or checked)
    cluster_secret: str | None = None
    #: the CA that signed the nodes' certificates: peers are called over HTTPS and verified
    tls_ca: str | None = None
    #: a released partition's store is deleted from disk this long after the release
    #: (taken back sooner, it resumes from where it was)
    drop_released_after_s: float = 600.0
    #: a stopping node hands its partitions over for at most this long (serve --leave-timeout)
    leave_timeout_s: float = 20.0


@dataclass
class Node:
    config: NodeConfig
    ingestor: Ingestor = field(init=False)
    #: its figures for /metrics (parts with Kafka consumers of their own add theirs)
    ingest_metrics: IngestMetrics = field(init=False)
    membership: Membership = field(init=False)
    coordinator: Coordinator = field(init=False)

    def __post_init__(self) -> None:
        c = self.config
        self.ingestor = Ingestor(
            c.bootstrap_servers,
            c.app_id,
            c.node_id,
            self._replica,
            drop_store=self._drop_store,
            stored_slots=self._stored_slots,
            drop_released_after_s=c.drop_released_after_s,
        )
        self.ingest_metrics = IngestMetrics(self.ingestor)
        self.membership = Membership(
            c.bootstrap_servers, c.app_id, self._me, c.node_id, c.cluster_secret, c.tls_ca
        )
        #: signs this node's answers to direct checks (/healthz with a challenge)
        self.signer = Signer(c.cluster_secret)
        self.coordinator = Coordinator(
            c.node_id, self.membership, self.ingestor, c.standby_replicas
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._coordinate, name="tablecast-coordinator", daemon=True
        )
        #: set by leave(): the others assign without this node, which answers on meanwhile
        self.leaving = False
        self._leave_now = threading.Event()

    def store_path(self, table: str, partition: int) -> Path:
        return self.config.data_dir / "stores" / table / str(partition)

    def _drop_store(self, table: str, partition: int) -> None:
        shutil.rmtree(self.store_path(table, partition), ignore_errors=True)

    def _stored_slots(self) -> list[tuple[str, int]]:
        """(table, partition) of every store a run left on disk."""
        root = self.config.data_dir / "stores"
        if not root.is_dir():
            return []
        return [
            (t.name, int(p.name))
            for t in root.iterdir()
            if t.is_dir()
            for p in t.iterdir()
            if p.is_dir() and p.name.isdigit()
        ]

    def _replica(self, info: TableInfo, partition: int, wipe: bool) -> Replica:
        path = self.store_path(info.name, partition)
        if wipe:
            shutil.rmtree(path, ignore_errors=True)
        # the cache budget is per table: split over its partitions, whichever this node holds
        cache = self.config.cache_bytes // max(1, info.partitions)
        return Replica(info, partition, open_store(info.store, path, cache, info.views))

    def _me(self) -> Member:
        replicas = {slot: r.state() for slot, r in self.ingestor.replicas.items()}
        return Member(
            self.config.node_id, self.config.url, replicas, self.ready, leaving=self.leaving
        )

    def _coordinate(self) -> None:
        while not self._stop.wait(TICK_S):
            try:
                self.coordinator.tick()
            except Exception:  # keep coordinating; the next tick starts from fresh facts
                log.exception("coordinator tick failed")

    @property
    def id(self) -> str:
        return self.config.node_id

    @property
    def view(self) -> ClusterView:
        return self.coordinator.view

    @property
    def tables(self) -> dict[str, TableInfo]:
        return self.ingestor.tables

    @property
    def ready(self) -> bool:
        """Catalog read, every table assigned, and each partition this node must serve caught up."""
        ingestor = self.ingestor
        if self.leaving or not ingestor.catalog.loaded:
            return False
        # list(): one step under the GIL, while the ingest thread may add entries
        known = list(ingestor.catalog.tables)
        if any(n not in ingestor.tables and n not in ingestor.left_out for n in known):
            return False  # a table read from the catalog whose topic is not checked yet
        target = self.view.target
        replicas = self.ingestor.replicas
        for info in list(self.ingestor.tables.values()):
            for p in range(info.partitions):
                slot = (info.name, p)
                if not info.is_global:
                    owners = target.get(slot)
                    if owners is None:
                        return False  # the table is newer than the last assignment
                    if not owners or owners[0] != self.id:
                        continue
                replica = replicas.get(slot)
                if replica is None or not replica.caught_up:
                    return False
        return True

    def start(self) -> None:
        self.membership.start()
        self.coordinator.tick()
        self.ingestor.start()
        self._thread.start()

    def leave(self) -> None:
        """Hand this node's partitions over, then leave the cluster (blocking: a thread).

        Its heartbeats say it is leaving and ``/readyz`` that it is not ready, so every
        node assigns its partitions to the others (their standbys answer at once), while
        it goes on answering: it holds each partition until its new active has been
        caught up for a moment (the coordinator's grace), and answers for at least
        ``LEAVE_NOTICE_S`` while another node can take its reads, so a load balancer
        polling ``/readyz`` stops sending it any first. Then its tombstone goes out. At
        most ``leave_timeout_s``; :meth:`hurry` ends it sooner."""
        self.leaving = True
        started = time.monotonic()
        deadline = started + self.config.leave_timeout_s
        while not self._leave_now.wait(TICK_S):
            if not self._others_take_over():
                break  # nobody could take its reads: leave at once
            noticed = time.monotonic() - started >= LEAVE_NOTICE_S
            if noticed and not self._holds_partitions():
                break
            if time.monotonic() > deadline:
                log.warning("leaving before every partition was handed over (--leave-timeout)")
                break
        self.membership.leave()

    def hurry(self) -> None:
        """Leave now, whatever is still to hand over (a second SIGTERM)."""
        self._leave_now.set()

    def _others_take_over(self) -> bool:
        """Whether another node can take this one's partitions and reads: one that is not
        leaving, and Kafka to tell it that this one is."""
        if not self.membership.kafka_reachable:
            return False
        return any(not m.leaving and n != self.id for n, m in self.membership.alive().items())

    def _holds_partitions(self) -> bool:
        """Whether it still holds a partition of a table that is not global."""
        tables = self.ingestor.tables
        return any(
            (info := tables.get(table)) is not None and not info.is_global
            for table, _ in list(self.ingestor.replicas)
        )

    def stop(self) -> None:
        # leave first: the others reassign while this node is still closing its stores
        self.membership.leave()
        self._stop.set()
        self._thread.join(5)
        self.membership.stop()
        self.ingestor.stop()
