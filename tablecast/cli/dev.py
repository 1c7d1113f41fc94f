"""``tablecast dev`` and ``tablecast demo``: broker, pipeline and nodes on one machine."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import orjson

from tablecast.cli.appfile import peek_app
from tablecast.cli.errors import Failure, UsageError
from tablecast.cli.options import ensure_free
from tablecast.cli.supervisor import Supervisor
from tablecast.kafka.broker import Broker

log = logging.getLogger(__name__)

# inside the package (a link to the repository's examples/), so an installed wheel has them
EXAMPLES = Path(__file__).resolve().parents[1] / "_examples"
READY_TIMEOUT_S = 600.0


def run(args: argparse.Namespace) -> int:
    demo = args.command == "demo"
    app_file = str(EXAMPLES / "stock_prices.py") if demo else args.app_file
    generate = demo or args.generate
    app = peek_app(app_file)
    data_dir = Path(args.data_dir)
    # before anything starts: node i listens on --port + i, and the broker on --kafka-port
    if args.port + args.nodes - 1 > 65535:
        raise UsageError(f"--port {args.port} leaves no room for {args.nodes} nodes")
    for i in range(args.nodes):
        ensure_free(args, "--port", "127.0.0.1", args.port + i, f" (node-{i})")
    if args.pg_port:
        ensure_free(args, "--pg-port", "127.0.0.1", args.pg_port, " (node-0's SQL)")
    bootstrap = args.bootstrap_servers
    broker = None if bootstrap else Broker(data_dir / "kafka", args.kafka_port)
    if broker is not None and broker.pid() is None:
        ensure_free(args, "--kafka-port", broker.host, broker.port, " (the broker)")
    from tablecast import jvm

    # the broker and Spark need Java 17+, the pipeline javac (unless compiled already)
    jvm.require_java(compiler=not jvm.pipeline_jars_compiled())
    jvm.use_quick_jvm()  # the broker and the pipeline's Spark
    sup = Supervisor(data_dir / "logs")
    try:
        if broker is not None:
            broker.start(die_with_parent=True)
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
                    *(["--pg-port", str(args.pg_port)] if i == 0 and args.pg_port else []),
                ],
            )
        _wait_ready(sup, urls)
        sample = None
        if generate and app.materialized:
            sample = _wait_for_data(sup, urls[0], next(iter(app.materialized)))
        _print_welcome(app.id, urls, list(app.materialized), sample, bootstrap, args.pg_port)
        while (dead := sup.failed()) is None:
            time.sleep(0.5)
        log.info("%s exited: stopping everything", dead)
        raise Failure(f"{dead} exited; see {sup.log_dir / (dead + '.log')}")
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
                raise Failure(f"{dead} exited during start; see {sup.log_dir / (dead + '.log')}")
            if time.monotonic() > deadline:
                raise Failure(f"nodes not ready after {READY_TIMEOUT_S:.0f}s: {pending}")
            if time.monotonic() - last_note > 5:
                log.info("waiting for the pipeline and %d node(s) to be ready ...", len(pending))
                last_note = time.monotonic()
            time.sleep(0.5)


def _wait_for_data(sup: Supervisor, url: str, table: str, timeout: float = 180.0) -> str | None:
    """With a generator running, wait until its first records are queryable, so the
    URLs printed next answer at once (Spark's first micro-batches take a few seconds)."""
    deadline = time.monotonic() + timeout
    last_note = 0.0
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            try:
                r = http.get(f"{url}/v1/tables/{table}/range", params={"limit": 1})
                items = r.json()["items"] if r.status_code == 200 else []
                if items:  # a key that exists, for the curl line printed next
                    key = items[0]["key"]
                    return key if isinstance(key, str) else orjson.dumps(key).decode()
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            if (dead := sup.failed()) is not None:
                raise Failure(f"{dead} exited; see {sup.log_dir / (dead + '.log')}")
            if time.monotonic() - last_note > 5:
                log.info(
                    "waiting for the first records to flow through the pipeline into %r ...", table
                )
                last_note = time.monotonic()
            time.sleep(0.5)
    log.warning("no records in %r after %.0fs; see %s", table, timeout, sup.log_dir)
    return None


def _print_welcome(
    app_id: str,
    urls: list[str],
    tables: list[str],
    sample: str | None,
    bootstrap: str,
    pg_port: int | None = None,
) -> None:
    first = urls[0]
    table = tables[0] if tables else "TABLE"
    key = quote(sample, safe="") if sample is not None else "KEY"
    print(
        f"\ntablecast app {app_id!r} is up: Kafka at {bootstrap}, nodes at {', '.join(urls)}\n"
        f"Try:\n"
        f"  curl {first}/v1/tables\n"
        f"  curl {first}/v1/tables/{table}/keys/{key}\n"
        f"  curl -N {first}/v1/tables/{table}/watch?key={key}    (live: every change)\n"
        f"  curl {first}/readyz\n"
        + (
            f"  psql 'host=127.0.0.1 port={pg_port} dbname=tablecast sslmode=disable' "
            f'-c "SELECT * FROM {table} LIMIT 5"\n'
            if pg_port
            else ""
        )
        + "Ctrl-C stops everything.\n",
        flush=True,
    )
