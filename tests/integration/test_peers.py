"""The benchmark peers answer correctly before anyone times them.

Kafka Streams' interactive-queries reference (two instances, one forwarding
to the other) and Redis must serve exactly the data that was loaded, or their
numbers in BENCHMARKS.md would compare unlike things. The Kafka Streams checks
(a Maven build and six JVMs) test the benchmark's tools, not tablecast: they are
marked ``long`` and run with ``python -m bench long``; the Redis check stays in the suite.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson
import pytest

from bench.peers import kafka_streams as ks
from bench.peers import redis as rp
from tablecast.kafka.topics import ensure_topic

from .kafka_io import produce

pytestmark = pytest.mark.integration

PARTITIONS = 6
KEYS = 300


# each HTTP server in front of the peer (bench/peers/README.md); Reactor Netty 1.3.7 left
# a keep-alive request unanswered (reactor/reactor-netty#4361), 1.3.8 does not
@pytest.mark.long
@pytest.mark.parametrize("http", ["jdk", "jetty", "netty"])
def test_kafka_streams_instances_answer_latest_values_and_forward(
    bootstrap: str, unique: str, tmp_path: Path, http: str
) -> None:
    topic = f"{unique}-input"
    ensure_topic(bootstrap, topic, PARTITIONS)
    # two versions of every key, then tombstones for a few: the table must hold
    # the second version, and nothing for the deleted keys
    produce(
        bootstrap, topic, [(f"k{i}".encode(), orjson.dumps({"v": i, "n": 1})) for i in range(KEYS)]
    )
    produce(
        bootstrap, topic, [(f"k{i}".encode(), orjson.dumps({"v": i, "n": 2})) for i in range(KEYS)]
    )
    deleted = {f"k{i}" for i in range(0, KEYS, 50)}
    produce(bootstrap, topic, [(k.encode(), None) for k in sorted(deleted)])
    expected = {f"k{i}": {"v": i, "n": 2} for i in range(KEYS) if f"k{i}" not in deleted}
    # keys that must survive URL encoding, also on the forwarded hop
    odd = {"a b/c+d?e": {"odd": 1}, "ünï": {"odd": 2}}
    produce(bootstrap, topic, [(k.encode(), orjson.dumps(v)) for k, v in odd.items()])
    expected.update(odd)

    with ks.start(
        bootstrap, topic, n=2, work_dir=tmp_path, application_id=unique, http=http
    ) as cluster:
        cluster.wait_caught_up(bootstrap)
        hosts = cluster.instances[0].get("/hosts").json()["hosts"]
        owned = {h["host"]: h["active"] for h in hosts}
        assert sorted(p for ps in owned.values() for p in ps) == list(range(PARTITIONS))
        assert all(owned.values()), f"an instance owns no partition: {owned}"

        for inst in cluster.instances:
            served_by: Counter[str] = Counter()
            with httpx.Client(base_url=inst.url, timeout=10.0) as client:
                for key, value in expected.items():
                    r = client.get(f"/keys/{quote(key, safe='')}")
                    assert r.status_code == 200, (inst.url, key, r.text)
                    assert r.json() == {"key": key, "value": value}
                    served_by[r.headers["x-iq-served-by"]] += 1
                for key in [*sorted(deleted), "never-written"]:
                    r = client.get(f"/keys/{key}")
                    assert r.status_code == 404, (inst.url, key, r.text)
                    assert r.json()["error"]["code"] == "key_not_found"
            # each instance read some keys itself and forwarded the rest to the other
            assert set(served_by) == {i.host for i in cluster.instances}, served_by
        pids = cluster.pids
    assert not any(i.alive() for i in cluster.instances), pids


@pytest.mark.long
def test_kafka_streams_build_is_cached() -> None:
    jar = ks.build()
    before = jar.stat().st_mtime
    assert ks.build() == jar
    assert jar.stat().st_mtime == before


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[rp.RedisServer]:
    try:
        rp.ensure_installed()
    except RuntimeError as e:
        pytest.skip(f"redis-server is not installed and could not be installed: {e}")
    server = rp.start(tmp_path / "redis")
    try:
        yield server
    finally:
        server.stop()
    assert not server.alive()


def test_redis_answers_loaded_keys_and_benchmarks_them(redis_server: rp.RedisServer) -> None:
    n = 1000
    value = lambda i: orjson.dumps({"v": i, "s": f"S{i}"})  # noqa: E731
    assert rp.load_numbered(redis_server, n, value) == n
    assert redis_server.dbsize() == n
    for i in range(n):
        assert redis_server.get(rp.key(i)) == value(i)
    assert redis_server.get(rp.key(n)) is None
    assert int(redis_server.info()["used_memory"]) > 0

    # a tiny run only to prove the command and the parsing; BENCHMARKS.md times it
    result = rp.benchmark(redis_server, keyspace=n, requests=5000, clients=10)
    assert result.test == "GET"
    assert result.rps > 0
    assert 0 < result.p50_ms <= result.p99_ms <= result.max_ms
