"""Stock prices: per symbol, the latest price on every exchange, queryable from any node.

`asset-prices` has 30 partitions keyed by symbol; each tick says which
exchange quoted which price when. The table `prices` maps a symbol to
{exchange: {"price", "time"}}, computed by Spark itself (Column expressions: no
Python worker between a tick and its board). Run it with

    tablecast dev examples/stock_prices.py --generate     (or: tablecast demo)

and ask for a symbol:  curl http://localhost:8080/v1/tables/prices/keys/AAPL
or for its board as it was a minute ago (the table keeps 10 minutes of versions):
    curl "http://localhost:8080/v1/tables/prices/keys/AAPL?as_of=$(( ($(date +%s) - 60) * 1000 ))"
"""

from __future__ import annotations

import random
import threading
import time
from datetime import timedelta
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

import tablecast as tc

TOPIC = "asset-prices"
PARTITIONS = 30
SYMBOLS = [
    "AAPL",
    "MSFT",
    "GOOG",
    "AMZN",
    "NVDA",
    "META",
    "TSLA",
    "NFLX",
    "INTC",
    "AMD",
    "ORCL",
    "IBM",
    "CSCO",
    "ADBE",
    "CRM",
    "QCOM",
    "TXN",
    "AVGO",
    "SAP",
    "ASML",
]
EXCHANGES = ["NASDAQ", "NYSE", "LSE", "XETRA", "EURONEXT"]


def quote_board(symbol: str, tick: dict[str, Any], board: dict[str, Any]) -> dict[str, Any]:
    """The symbol's board gets this exchange's latest price and time (the board as a
    Python function: ``build(python_board=True)``)."""
    return {**board, tick["exchange"]: {"price": tick["price"], "time": tick["time"]}}


def board_columns() -> Column:
    """The same board as Spark aggregates: per exchange, the price and time of its newest
    tick (None until it quotes, and a JSON board leaves out what is None). Each aggregate
    keeps a number, not a struct, so Spark aggregates in a hash table it compiles once
    rather than sorting every batch."""
    at = F.variant_get("value", "$.time", "long")
    exchange = F.variant_get("value", "$.exchange", "string")
    price = F.variant_get("value", "$.price", "double")
    quotes = []
    for e in EXCHANGES:
        quoted = F.when(exchange == e, at)
        newest = F.max(quoted)
        quote = F.struct(F.max_by(price, quoted).alias("price"), newest.alias("time"))
        quotes.append(F.when(newest.isNotNull(), quote).alias(e))
    return F.struct(*quotes)


def build(app_id: str = "stocks", topic: str = TOPIC, python_board: bool = False) -> tc.App:
    app = tc.App(app_id)
    ticks = app.stream(topic, key=tc.serde.string(), value=tc.serde.json())
    grouped = ticks.group_by_key()
    board = (
        grouped.aggregate(dict, quote_board) if python_board else grouped.aggregate(board_columns())
    )
    # 10 minutes of versions, not more: the demo's 200 ticks/s are kept in memory
    board.materialize("prices", store="memory", history=timedelta(minutes=10))
    return app


app = build()


def generate(
    bootstrap_servers: str,
    rate_per_s: float = 200.0,
    topic: str = TOPIC,
    stop: threading.Event | None = None,
) -> None:
    """Produce ticks for every symbol from several exchanges, until `stop` is set (forever)."""
    import orjson

    from tablecast.kafka.topics import ensure_topic

    ensure_topic(bootstrap_servers, topic, PARTITIONS)
    producer = tc.producer(bootstrap_servers, {"linger.ms": 20})
    price = {s: random.uniform(20, 900) for s in SYMBOLS}
    while stop is None or not stop.is_set():
        symbol = random.choice(SYMBOLS)
        price[symbol] = round(max(1.0, price[symbol] * random.gauss(1.0, 0.002)), 2)
        tick = {
            "symbol": symbol,
            "exchange": random.choice(EXCHANGES),
            "price": price[symbol],
            "time": int(time.time() * 1000),
        }
        producer.produce(topic, key=symbol.encode(), value=orjson.dumps(tick))
        producer.poll(0)
        time.sleep(1.0 / rate_per_s)
    producer.flush(10)
