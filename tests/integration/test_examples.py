"""The examples (examples/) end to end: each example's real pipeline on Spark, real nodes, and
answers checked against a reference computed independently from the input."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import jwt
import orjson
import pytest

import tablecast as tc
from tablecast.cli.appfile import load_module
from tablecast.kafka.topics import COMPACTED, ensure_topic, table_topic

from ..support.procs import NodeProcess, start_node, stop_all, tls
from .kafka_io import produce, read_all
from .test_pipeline_support import TRIGGER

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> SimpleNamespace:
    return SimpleNamespace(**load_module(EXAMPLES / f"{name}.py"))


class Run:
    """An example's App started on the shared Spark session, and nodes serving it."""

    def __init__(self, app: tc.App, bootstrap: str, spark: Any, state: Path, logs: Path) -> None:
        app.state_dir = state
        app.trigger = TRIGGER
        self.app, self.bootstrap, self.logs = app, bootstrap, logs
        self.pipeline = app.start(bootstrap_servers=bootstrap, spark=spark)
        self.nodes: list[NodeProcess] = []

    def node(self, *extra: str) -> NodeProcess:
        node = start_node(self.app.id, self.bootstrap, self.logs, *extra)
        self.nodes.append(node)
        return node

    def settle(self, *tables: str) -> None:
        """Everything produced so far processed by Spark and applied by every node."""
        self.pipeline.process_all_available()
        for node in self.nodes:
            node.wait_ready()
            for table in tables:
                node.wait_caught_up(self.bootstrap, table, table_topic(self.app.id, table))

    def stop(self) -> None:
        stop_all(self.nodes)
        self.pipeline.stop()


@pytest.fixture
def run_of(bootstrap: str, spark: Any, tmp_path: Path, logs: Path) -> Iterator[Any]:
    runs: list[Run] = []

    def start(app: tc.App) -> Run:
        runs.append(Run(app, bootstrap, spark, tmp_path / "state", logs))
        return runs[-1]

    yield start
    for r in runs:
        r.stop()


def test_share_holders_and_the_weekly_email(bootstrap: str, unique: str, run_of: Any) -> None:
    ex = example("share_holders")
    topic = f"{unique}-positions"
    ensure_topic(bootstrap, topic, ex.PARTITIONS, COMPACTED)
    rng = random.Random(3)
    positions: dict[str, dict[str, Any]] = {}
    records = []
    for _ in range(400):  # opens, moves between clients and exchanges, closes
        pid = f"pos-{rng.randrange(120):03d}"
        if rng.random() < 0.2:
            positions.pop(pid, None)
            records.append((pid.encode(), None))
        else:
            pos = {
                "client": f"client-{rng.randrange(25):02d}",
                "symbol": "AAPL",
                "exchange": rng.choice(ex.EXCHANGES),
                "quantity": rng.randrange(1, 99),
            }
            positions[pid] = pos
            records.append((pid.encode(), orjson.dumps(pos)))
    run = run_of(ex.build(unique, topic))
    produce(bootstrap, topic, records)
    nodes = [run.node("--standby-replicas", "1") for _ in range(3)]
    run.settle("us-share-holders")
    want = ex.expected(positions)
    with tc.Client([n.url for n in nodes]) as client:
        got = dict(client.range("us-share-holders"))
        assert got == want
        for node in nodes:  # every node answers every client the same
            for c, ids in want.items():
                assert (
                    httpx.get(
                        f"{node.url}/v1/tables/us-share-holders/keys/{c}", verify=tls()
                    ).json()["value"]
                    == ids
                )
    # the weekly e-mail, run beside each of the 3 nodes: every client mailed exactly once
    mails: Counter[str] = Counter()
    for node in nodes:
        ex.weekly_email(node.url, lambda c, ids: mails.update([c]))
    assert mails == Counter(list(want))  # each client once, however many nodes


def test_railway_bookings_latest_and_by_period(bootstrap: str, unique: str, run_of: Any) -> None:
    ex = example("railway_bookings")
    topic = f"{unique}-bookings"
    ensure_topic(bootstrap, topic, ex.PARTITIONS)
    rng = random.Random(4)
    base = 1_700_000_000_000
    bookings: dict[str, list[dict[str, Any]]] = {}
    records = []
    for i in range(300):
        customer = f"c{rng.randrange(30):02d}"
        booking = {"ts": base + i * 60_000, "train": f"IC {rng.randrange(100, 999)}"}
        bookings.setdefault(customer, []).append(booking)
        records.append((customer.encode(), orjson.dumps(booking)))
    run = run_of(ex.build(unique, topic))
    produce(bootstrap, topic, records)
    node = run.node()
    run.settle("latest-booking", "bookings-by-time")
    with tc.Client(node.url) as client:
        for customer, history in bookings.items():
            assert client.get("latest-booking", customer)["value"] == history[-1]
            # a version per record time (records of one millisecond keep the last)
            versions = [v["value"] for v in client.history("latest-booking", customer)]
            assert versions[-1] == history[-1] and set(map(orjson.dumps, versions)) <= set(
                map(orjson.dumps, history)
            )
        by_train: dict[str, set[str]] = {}
        for customer, history in bookings.items():
            by_train.setdefault(history[-1]["train"], set()).add(customer)
        for train, customers in by_train.items():
            assert {k for k, _ in client.index("latest-booking", "train", train)} == customers
        for customer, history in bookings.items():
            every = list(client.range("bookings-by-time", prefix=f"{customer}|"))
            assert [v for _, v in every] == history
            lo, hi = history[0]["ts"] + 1, base + 200 * 60_000
            window = list(
                client.range(
                    "bookings-by-time", from_=f"{customer}|{lo:013d}", to=f"{customer}|{hi:013d}"
                )
            )
            assert [v for _, v in window] == [b for b in history if lo <= b["ts"] < hi]


def test_avro_activity_across_two_nodes_with_auth(bootstrap: str, unique: str, run_of: Any) -> None:
    ex = example("secure_activity")
    topic = f"{unique}-views"
    ensure_topic(bootstrap, topic, ex.PARTITIONS)
    rng = random.Random(5)
    totals: dict[str, dict[str, int]] = {}
    records = []
    for _ in range(300):
        user = f"u{rng.randrange(20):02d}"
        view = {"user": user, "page": "/p", "ms": rng.randrange(1, 1000)}
        t = totals.setdefault(user, {"views": 0, "ms": 0})
        t["views"] += 1
        t["ms"] += view["ms"]
        records.append((user.encode(), ex.VIEWS.serialize(view)))
    records.append((b"u00", b"\x01not avro"))  # a poison record goes to the dead-letter topic
    secret = "a-secret-only-these-tests-know-0123456789"
    run = run_of(ex.build(unique, topic))
    produce(bootstrap, topic, records)
    policy = str(EXAMPLES / "secure_activity.policy.yaml")
    nodes = [run.node("--auth-jwt-secret", secret, "--auth-policy", policy) for _ in range(2)]

    def bearer(**claims: Any) -> dict[str, str]:
        token = jwt.encode({"exp": 4_000_000_000, **claims}, secret, algorithm="HS256")
        return {"authorization": f"Bearer {token}"}

    admin = bearer(sub="ops", admin=True)
    for n in nodes:
        n.headers = admin
    run.settle("activity")
    served_by = set()
    for user, total in totals.items():
        own = bearer(sub=user)
        answers = [
            httpx.get(f"{n.url}/v1/tables/activity/keys/{user}", headers=h, verify=tls())
            for n in nodes
            for h in (own, admin)
        ]
        assert all(a.status_code == 200 and a.json()["value"] == total for a in answers)
        served_by |= {a.headers["x-tablecast-node"] for a in answers}
        for n in nodes:  # the user's own row and nobody else's, on every route
            other = next(u for u in totals if u != user)
            r = httpx.get(f"{n.url}/v1/tables/activity/keys/{other}", headers=own, verify=tls())
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
            page = httpx.get(f"{n.url}/v1/tables/activity/range", headers=own, verify=tls()).json()
            assert page["items"] == [{"key": user, "value": total}]
            assert httpx.get(
                f"{n.url}/v1/tables/activity/count", headers=own, verify=tls()
            ).json() == {"count": 1}
    assert len(served_by) == 2  # some answers were forwarded, the token with them
    everything = httpx.get(
        f"{nodes[1].url}/v1/tables/activity/range", params={"limit": 1000}, headers=admin
    ).json()["items"]
    assert {x["key"]: x["value"] for x in everything} == totals
    assert httpx.get(f"{nodes[0].url}/v1/tables/activity/keys/u01").status_code == 401


def test_stock_prices_board_from_any_node(bootstrap: str, unique: str, run_of: Any) -> None:
    ex = example("stock_prices")
    topic = f"{unique}-prices"
    ensure_topic(bootstrap, topic, ex.PARTITIONS)
    rng = random.Random(6)
    boards: dict[str, dict[str, Any]] = {}
    records = []
    for i in range(600):
        symbol, exchange = rng.choice(ex.SYMBOLS), rng.choice(ex.EXCHANGES)
        tick = {
            "symbol": symbol,
            "exchange": exchange,
            "price": round(rng.uniform(1, 999), 2),
            "time": 1_700_000_000_000 + i,
        }
        boards.setdefault(symbol, {})[exchange] = {"price": tick["price"], "time": tick["time"]}
        records.append((symbol.encode(), orjson.dumps(tick)))
    run = run_of(ex.build(unique, topic))
    produce(bootstrap, topic, records)
    nodes = [run.node("--standby-replicas", "1") for _ in range(2)]
    run.settle("prices")
    for symbol, board in boards.items():  # many readers, any node: the same board
        for node in nodes:
            assert node.get(f"/v1/tables/prices/keys/{symbol}").json()["value"] == board
        # with its history: as of now, the board is the latest version
        now = {"as_of": str(int(time.time() * 1000))}
        assert nodes[0].get(f"/v1/tables/prices/keys/{symbol}", params=now).json()["value"] == board


def test_point_of_sale(bootstrap: str, unique: str, run_of: Any) -> None:
    ex = example("point_of_sale")
    topic = f"{unique}-pos"
    ensure_topic(bootstrap, topic, ex.PARTITIONS)
    rng = random.Random(7)
    invoices = [ex.invoice(i, rng) for i in range(200)]
    rewards: dict[str, dict[str, int]] = {}
    for _, inv in invoices:
        if inv["customer_type"] == "PRIME":
            r = rewards.setdefault(inv["card"], {"points": 0, "invoices": 0})
            r["points"] += int(inv["total"])
            r["invoices"] += 1
    run = run_of(ex.build(unique, topic))
    produce(bootstrap, topic, [(s.encode(), orjson.dumps(inv)) for s, inv in invoices])
    node = run.node()
    run.pipeline.process_all_available()
    run.settle("rewards")
    with tc.Client(node.url) as client:
        assert dict(client.range("rewards")) == rewards
    # one card's points went through one partition of the repartition topic: the custom one
    by_card = f"{unique}.repartition.rewards-0"
    for m in read_all(bootstrap, by_card, sum(r["invoices"] for r in rewards.values())):
        assert m.partition() == ex.card_partition(m.key().decode(), None, ex.BY_CARD_PARTITIONS)
    shipped = {
        orjson.loads(m.value())["invoice"]
        for m in read_all(
            bootstrap,
            f"{unique}-shipments",
            sum(i["delivery"] == "HOME-DELIVERY" for _, i in invoices),
        )
    }
    assert shipped == {i["id"] for _, i in invoices if i["delivery"] == "HOME-DELIVERY"}
    lines = [
        orjson.loads(m.value())
        for m in read_all(
            bootstrap, f"{unique}-hadoop-sink", sum(len(i["lines"]) for _, i in invoices)
        )
    ]
    assert len({(x["invoice"], x["item"], x["qty"]) for x in lines}) <= len(lines)
    assert all(x["card"].startswith("*" * 12) for x in lines)
    # the latest notification of each card carries its final points
    notes = read_all(bootstrap, f"{unique}-notifications", len(rewards), to_the_end=True)
    last = {
        m.key().decode(): orjson.loads(m.value())["points"]
        for m in sorted(notes, key=lambda m: m.offset())
    }
    assert last == {card: r["points"] for card, r in rewards.items()}
    # every coffee and electronics invoice of one card, produced seconds apart, is a promotion
    of = {d: [i for _, i in invoices if i["department"] == d] for d in ("coffee", "electronics")}
    pairs = sorted(
        (c["card"], c["id"], e["id"])
        for c in of["coffee"]
        for e in of["electronics"]
        if c["card"] == e["card"]
    )
    assert pairs, "the sample has no card that bought both"
    got = sorted(
        (m.key().decode(), p["coffee"], p["electronics"])
        for m in read_all(bootstrap, f"{unique}-promotions", len(pairs))
        for p in [orjson.loads(m.value())]
    )
    assert got == pairs


def test_shop_revenue_cities_and_visits(bootstrap: str, unique: str, run_of: Any) -> None:
    ex = example("shop")
    pos, people = f"{unique}-pos", f"{unique}-customers"
    for topic in (pos, people):
        ensure_topic(bootstrap, topic, ex.PARTITIONS)
    rng = random.Random(11)
    moves = [(f"c{rng.randrange(12)}", rng.choice(ex.CITIES)) for _ in range(40)]
    city = dict(moves)  # each customer's latest city
    run = run_of(ex.build(unique, pos, people))
    node = run.node()
    produce(bootstrap, people, [(c.encode(), orjson.dumps({"city": t})) for c, t in moves])
    # the customers are in the join's state before any invoice comes
    run.settle("customers_per_city")
    wire = tc.serde.avro(ex.INVOICE, confluent=True)
    invoices = [
        {
            "store": f"store-{rng.randrange(4)}",
            "customer": c,
            "total": round(rng.uniform(-20, 200), 2),
        }
        for c in [rng.choice(sorted(city)) for _ in range(120)]
    ]
    produce(bootstrap, pos, [(i["customer"].encode(), wire.serialize(i)) for i in invoices])
    run.settle("revenue", "revenue_per_city", "visits")

    def sums(by: Any, rows: list[dict[str, Any]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in rows:
            out[by(r)] = out.get(by(r), 0.0) + r["total"]
        return out

    with tc.Client(node.url) as client:
        # a city everyone moved away from stays at 0, as in Kafka Streams
        per_city = {t: n for t, n in client.range("customers_per_city") if n}
        assert per_city == Counter(city.values())
        expected = sums(lambda i: i["store"], [i for i in invoices if i["total"] > 0])
        got = dict(client.range("revenue"))
        assert got.keys() == expected.keys()
        assert all(abs(got[s] - v) < 0.05 for s, v in expected.items())
        # every invoice (a negative total too) joins its customer's city
        expected = sums(lambda i: city[i["customer"]], invoices)
        got = dict(client.range("revenue_per_city"))
        assert got.keys() == expected.keys()
        assert all(abs(got[c] - v) < 0.05 for c, v in expected.items())
        # produced seconds apart, a customer's invoices are one visit
        for c in sorted({i["customer"] for i in invoices}):
            mine = [i for i in invoices if i["customer"] == c]
            (window,) = client.windows("visits", c)
            assert window["value"]["invoices"] == len(mine)
            assert abs(window["value"]["spent"] - sum(i["total"] for i in mine)) < 0.05
            assert window["start"] <= window["end"]
