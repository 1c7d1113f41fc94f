"""``tablecast``: argument parsing and dispatch. Each command's work lives in its own module.

Every option also reads ``TABLECAST_<OPTION>`` from the environment
(``--bootstrap-servers`` ↔ ``TABLECAST_BOOTSTRAP_SERVERS``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_BOOTSTRAP = "localhost:9092"


def _env(option: str, default: Any = None) -> Any:
    return os.environ.get("TABLECAST_" + option.lstrip("-").replace("-", "_").upper(), default)


def _opt(p: argparse.ArgumentParser, option: str, default: Any = None, **kw: Any) -> None:
    p.add_argument(option, default=_env(option, default), **kw)


def _kafka_config(p: argparse.ArgumentParser) -> None:
    _opt(
        p,
        "--kafka-config",
        metavar="FILE",
        help="Kafka client settings (Java .properties: security.protocol, sasl.*, ssl.*) "
        "for every Kafka client of tablecast",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tablecast", description="Serve the live state of Kafka streams."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("kafka", help="a local single-node Kafka broker (KRaft) for development")
    p.add_argument("action", choices=["start", "stop", "status"])
    _opt(p, "--port", 9092, type=int)
    _opt(p, "--data-dir", os.path.join(".tablecast", "kafka"))

    p = sub.add_parser("run", help="run an App's pipeline (the Spark driver)")
    p.add_argument("app_file")
    _opt(p, "--bootstrap-servers", DEFAULT_BOOTSTRAP)
    _kafka_config(p)
    _opt(p, "--master")
    _opt(p, "--state-dir")

    p = sub.add_parser("explain", help="print an App's plan")
    p.add_argument("app_file")

    p = sub.add_parser("serve", help="run one serving node (needs no App file)")
    _opt(p, "--app", required=_env("--app") is None)
    _opt(p, "--bootstrap-servers", DEFAULT_BOOTSTRAP)
    _kafka_config(p)
    _opt(p, "--port", 8080, type=int)
    _opt(p, "--host", "127.0.0.1")
    _opt(p, "--advertised-url")
    _opt(p, "--node-id")
    _opt(p, "--data-dir")
    _opt(p, "--standby-replicas", 0, type=int)
    _opt(p, "--cache-mb", 64, type=int, help="read cache per table in front of RocksDB (0: none)")
    _opt(
        p,
        "--drop-released-after",
        600.0,
        type=float,
        help="seconds after which the store of a partition this node let go is deleted",
    )
    _opt(p, "--auth-jwt-secret", help="HS256 secret: every /v1 request needs a bearer JWT")
    _opt(p, "--auth-jwt-secret-file", help="a file holding the HS256 secret (not shown by ps)")
    _opt(
        p,
        "--auth-jwks",
        help="a JWKS file or https:// URL of public keys: every /v1 request needs a bearer JWT",
    )
    _opt(p, "--auth-audience", help="accept only tokens whose aud claim names this audience")
    _opt(p, "--auth-issuer", help="accept only tokens whose iss claim is this issuer")
    _opt(
        p,
        "--cluster-secret",
        help="shared by the app's nodes: they sign membership records and internal calls with it",
    )

    for name, what in (("dev", "everything on one machine"), ("demo", "the stock-price demo")):
        p = sub.add_parser(name, help=what)
        if name == "dev":
            p.add_argument("app_file")
            p.add_argument(
                "--generate", action="store_true", help="also run the App file's generate()"
            )
        _opt(p, "--nodes", 1, type=int)
        _opt(p, "--port", 8080, type=int)
        _opt(p, "--bootstrap-servers")
        _kafka_config(p)
        _opt(p, "--kafka-port", 9092, type=int)
        _opt(p, "--data-dir", os.path.join(".tablecast", "dev"))

    for name, what in (
        ("query", "read one key"),
        ("tables", "list tables"),
        ("cluster", "show nodes"),
    ):
        p = sub.add_parser(name, help=what)
        if name == "query":
            p.add_argument("table")
            p.add_argument("key")
        _opt(p, "--url", "http://localhost:8080", help="a node URL, or several separated by commas")
        _opt(p, "--token", help="a bearer JWT, when the nodes require auth")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    handler = _COMMANDS[args.command]
    from tablecast.kafka.config import KafkaConfigError, use
    from tablecast.kafka.probe import KafkaUnavailable

    try:
        if getattr(args, "kafka_config", None):
            config = use(args.kafka_config)
            logging.getLogger("tablecast").info("Kafka clients: %s", config.describe())
        return handler(args) or 0
    except KeyboardInterrupt:
        return 130
    except (KafkaConfigError, KafkaUnavailable) as e:
        return fail(str(e))


def fail(message: str, code: int = 2) -> int:
    """Every command's errors in one format: ``tablecast: error: <what went wrong>``."""
    print(f"tablecast: error: {message}", file=sys.stderr, flush=True)
    return code


def _kafka(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tablecast.kafka.broker import Broker

    broker = Broker(Path(args.data_dir), args.port)
    if args.action == "start":
        broker.start()
        print(f"Kafka broker running on {broker.bootstrap_servers} (data: {args.data_dir})")
    elif args.action == "stop":
        print("stopped" if broker.stop() else "not running")
    else:
        print(broker.status())
        return 0 if broker.pid() else 3
    return 0


def _run(args: argparse.Namespace) -> int:
    from tablecast.cli.appfile import load_app, stop_on_sigterm

    if args.master:
        # defining the App starts Spark: the master must be known before the file loads
        os.environ["TABLECAST_MASTER"] = args.master
    from tablecast.kafka import probe

    probe.check(args.bootstrap_servers)
    app = load_app(args.app_file)
    if args.state_dir:
        from pathlib import Path

        app.state_dir = Path(args.state_dir)
    stop_on_sigterm()
    app.run(bootstrap_servers=args.bootstrap_servers, master=args.master)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from tablecast.cli.appfile import load_app

    print(load_app(args.app_file).explain())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tablecast.cluster.node import NodeConfig
    from tablecast.kafka import probe
    from tablecast.server import process
    from tablecast.server.auth import Auth

    probe.check(args.bootstrap_servers)
    url = args.advertised_url or f"http://{args.host}:{args.port}"
    node_id = args.node_id or url.split("://", 1)[-1]
    data_dir = args.data_dir or os.path.join(".tablecast", "nodes", node_id.replace(":", "_"))
    config = NodeConfig(
        app_id=args.app,
        bootstrap_servers=args.bootstrap_servers,
        url=url,
        node_id=node_id,
        data_dir=Path(data_dir),
        standby_replicas=args.standby_replicas,
        cache_bytes=args.cache_mb * 1024 * 1024,
        cluster_secret=args.cluster_secret,
        drop_released_after_s=args.drop_released_after,
    )
    secret = args.auth_jwt_secret
    if args.auth_jwt_secret_file:
        secret = Path(args.auth_jwt_secret_file).read_text().strip()
    auth = Auth(secret, args.auth_jwks, args.auth_audience, args.auth_issuer)
    process.run(config, args.host, args.port, auth)
    return 0


def _dev(args: argparse.Namespace) -> int:
    from tablecast.cli import dev

    return dev.run(args)


def _http(args: argparse.Namespace) -> int:
    from tablecast.cli import http

    return http.run(args)


_COMMANDS = {
    "kafka": _kafka,
    "run": _run,
    "explain": _explain,
    "serve": _serve,
    "dev": _dev,
    "demo": _dev,
    "query": _http,
    "tables": _http,
    "cluster": _http,
}

if __name__ == "__main__":
    sys.exit(main())
