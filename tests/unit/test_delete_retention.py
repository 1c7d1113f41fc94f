"""A store reopened after time away resumes only if the topic kept its tombstones that long
(cluster/ingest.py, cluster/topicinfo.py). When the topic's delete.retention.ms cannot be
read (a principal without the DescribeConfigs permission; here: no broker answers), the
shortest value is assumed, so a store away for any time is rebuilt, and the reason is
logged once per topic."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablecast import serde
from tablecast.cluster import topicinfo
from tablecast.cluster.ingest import Ingestor
from tablecast.cluster.replica import Replica
from tablecast.contract.table_info import TableInfo
from tablecast.kafka.broker import free_port
from tablecast.store import Write
from tablecast.store.rocksdb import RocksDBStore

INFO = TableInfo("kv", "app.table.kv", 2, serde.string().spec(), serde.json().spec())


@pytest.fixture
def ingestor(monkeypatch: pytest.MonkeyPatch) -> Iterator[Ingestor]:
    # nothing listens on the port: every question about a topic's config goes unanswered
    monkeypatch.setattr(topicinfo, "DESCRIBE_TIMEOUT_S", 0.3, raising=False)
    ingestor = Ingestor(f"127.0.0.1:{free_port()}", "app", "n1", _no_replica)
    yield ingestor
    # never started (its loop would wait on the catalog): only its clients to close
    ingestor.deafness.close()
    ingestor._consumer.close()
    ingestor.catalog.close()


def _no_replica(info: TableInfo, partition: int, fresh: bool) -> Replica:
    raise AssertionError("the test opens its own replicas")


def _away(path: Path, partition: int, away_ms: int) -> Replica:
    """A replica of a store that holds offsets 0-4 and was last in sync `away_ms` ago."""
    store = RocksDBStore(path)
    store.apply([Write(b"k%d" % i, b"1", i, 1000 + i) for i in range(5)])
    store.mark_synced(int(time.time() * 1000) - away_ms)
    return Replica(INFO, partition, store)


def test_a_store_away_a_minute_rebuilds_when_the_setting_cannot_be_read(
    ingestor: Ingestor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    replicas = [_away(tmp_path / str(p), p, 60_000) for p in range(2)]
    try:
        with caplog.at_level(logging.WARNING, logger=topicinfo.__name__):
            whys = [ingestor._outdated(r, 0, 5) for r in replicas]
    finally:
        for r in replicas:
            r.store.close()
    for why in whys:
        assert why is not None and "delete.retention.ms cannot be read" in why
    # said once for the topic, naming the likely cause, not once per partition
    warned = [r.getMessage() for r in caplog.records if INFO.topic in r.getMessage()]
    assert len(warned) == 1, warned
    assert "DescribeConfigs" in warned[0] and "rebuilt" in warned[0]
