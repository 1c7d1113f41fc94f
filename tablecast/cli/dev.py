"""``tablecast dev`` and ``tablecast demo``: broker, pipeline and nodes on one machine."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import httpx

from tablecast.cli.appfile import peek_app
from tablecast.cli.supervisor import Supervisor
from tablecast.kafka.broker import Broker

log = logging.getLogger(__name__)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
READY_TIMEOUT_S = 600.0


def run(args: argparse.Namespace) -> int:
    demo = args.command == "demo"
    app_file = str(EXAMPLES / "stock_prices.py") if demo else args.app_file
    generate = demo or args.generate
    app = peek_app(app_file)
    data_dir = Path(args.data_dir)
    sup = Supervisor(data_dir / "logs")
    broker = None
    bootstrap = args.bootstrap_servers
    try:
        if not bootstrap:
            broker = Broker(data_dir / "kafka", args.kafka_port)
            broker.start()
            bootstrap = broker.bootstrap_servers
        common = ["--bootstrap-servers", bootstrap]
        me = [sys.executable, "-m", "tablecast.cli.main"]
        if generate:
            sup.spawn(
                "generator", [sys.executable, "-m", "tablecast.cli.generate", app_file, *common]
            )
        sup.spawn(
            "pipeline",
            [*me, "run", app_file, *common, "--state-dir", str(data_dir / "state")],
        )
        urls = []
        for i in range(args.nodes):
            port = args.port + i
            urls.append(f"http://127.0.0.1:{port}")
            node_dir = str(data_dir / "nodes" / f"node-{i}")
            sup.spawn(
                f"node-{i}",
                [
                    *me,
                    "serve",
                    "--app",
                    app.id,
                    *common,
                    "--port",
                    str(port),
                    "--data-dir",
                    node_dir,
                    # with several nodes, every partition gets a standby: a node
                    # stopped during development costs no failed query
                    "--standby-replicas",
                    str(min(1, args.nodes - 1)),
                ],
            )
        _wait_ready(sup, urls)
        _print_welcome(app.id, urls, list(app.materialized), demo, bootstrap)
        while (dead := sup.failed()) is None:
            time.sleep(0.5)
        log.error("%s exited; see %s. Stopping everything.", dead, sup.log_dir / f"{dead}.log")
        return 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 0
    finally:
        sup.stop_all()
        if broker is not None:
            broker.stop()


def _wait_ready(sup: Supervisor, urls: list[str]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last_note = 0.0
    with httpx.Client(timeout=2.0) as http:
        while True:
            pending = []
            for url in urls:
                try:
                    ok = http.get(f"{url}/readyz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    pending.append(url)
            if not pending:
                return
            if (dead := sup.failed()) is not None:
                raise SystemExit(f"{dead} exited during start; see {sup.log_dir / (dead + '.log')}")
            if time.monotonic() > deadline:
                raise SystemExit(f"nodes not ready after {READY_TIMEOUT_S:.0f}s: {pending}")
            if time.monotonic() - last_note > 5:
                log.info("waiting for the pipeline and %d node(s) to be ready ...", len(pending))
                last_note = time.monotonic()
            time.sleep(0.5)


def _print_welcome(
    app_id: str, urls: list[str], tables: list[str], demo: bool, bootstrap: str
) -> None:
    first = urls[0]
    table = tables[0] if tables else "TABLE"
    key = "AAPL" if demo else "KEY"
    print(
        f"\ntablecast app {app_id!r} is up: Kafka at {bootstrap}, nodes at {', '.join(urls)}\n"
        f"Try:\n"
        f"  curl {first}/v1/tables\n"
        f"  curl {first}/v1/tables/{table}/keys/{key}\n"
        f"  curl {first}/readyz\n"
        f"Ctrl-C stops everything.\n",
        flush=True,
    )
