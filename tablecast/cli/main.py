"""``tablecast``: argument parsing and dispatch. Each command's work lives in its own module.

Every option also reads ``TABLECAST_<OPTION>`` from the environment
(``--bootstrap-servers`` ↔ ``TABLECAST_BOOTSTRAP_SERVERS``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from tablecast.cli.errors import fail

DEFAULT_BOOTSTRAP = "localhost:9092"
#: read processes beside a node: more than cores anyone has, fewer than files RocksDB opens
MOST_PROCESSES = 64


def _env(option: str, default: Any = None) -> Any:
    return os.environ.get("TABLECAST_" + option.lstrip("-").replace("-", "_").upper(), default)


def _opt(p: argparse.ArgumentParser, option: str, default: Any = None, **kw: Any) -> None:
    p.add_argument(option, default=_env(option, default), **kw)


def _flag(p: argparse.ArgumentParser, option: str, help: str) -> None:
    """A switch that TABLECAST_<OPTION>=1 (or true, yes) also turns on."""
    on = str(_env(option, "")).lower() in ("1", "true", "yes", "on")
    p.add_argument(option, action="store_true", default=on, help=help)


def _kafka_config(p: argparse.ArgumentParser) -> None:
    _opt(
        p,
        "--kafka-config",
        metavar="FILE",
        help="Kafka client settings (Java .properties: security.protocol, sasl.*, ssl.*) "
        "for every Kafka client of tablecast",
    )
    _opt(
        p,
        "--replication-factor",
        type=int,
        help="of the topics tablecast creates (default: min(3, brokers)); "
        "min.insync.replicas is min(2, it)",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tablecast")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from tablecast import __version__

        return __version__


#: commands that run the pipeline, which needs the [pipeline] extra (PySpark and its kin)
PIPELINE_COMMANDS = frozenset({"run", "explain", "dev", "demo"})


def _pipeline_missing() -> str | None:
    """The one line to print when PySpark (or what it needs) is not installed, else None."""
    from importlib.util import find_spec

    missing = [m for m in ("pyspark", "pandas", "pyarrow") if find_spec(m) is None]
    if not missing:
        return None
    return (
        f"this command runs the pipeline, which needs {', '.join(missing)}: "
        "pip install 'tablecast[pipeline]'"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tablecast", description="Serve the live state of Kafka streams."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"tablecast {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("kafka", help="a local single-node Kafka broker (KRaft) for development")
    p.add_argument("action", choices=["start", "stop", "status"])
    _opt(p, "--port", 9092, type=int)
    _opt(p, "--data-dir", os.path.join(".tablecast", "kafka"))
    p.add_argument(
        "--secure",
        action="store_true",
        help="SASL_SSL (SCRAM-SHA-512) only, with a generated CA; writes client.properties",
    )
    _opt(p, "--brokers", 1, type=int, help="start N brokers on ports P..P+N-1 (one KRaft quorum)")
    p.add_argument("--broker", type=int, help="start or stop broker I of the cluster only")

    p = sub.add_parser("run", help="run an App's pipeline (the Spark driver)")
    p.add_argument("app_file")
    _opt(p, "--bootstrap-servers", DEFAULT_BOOTSTRAP)
    _kafka_config(p)
    _opt(p, "--master", help="local[N] (default local[2]), spark://HOST:PORT, yarn, k8s://…")
    _opt(p, "--state-dir")
    _opt(
        p,
        "--checkpoint-dir",
        metavar="URI",
        help="where the queries' checkpoints go (default STATE_DIR/APP/checkpoints): on a "
        "cluster a URI every executor reaches (file:///shared/…, hdfs://…, s3a://…)",
    )

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
        "--answers-mb",
        128,
        type=int,
        help="whole answers of plain key GETs kept by the node (MiB, 0: none)",
    )
    _opt(
        p,
        "--block-cache-mb",
        256,
        type=int,
        help="RocksDB block cache shared by every store of the node (MiB, at least 1)",
    )
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
        "--auth-policy",
        metavar="FILE",
        help="YAML or JSON rules from token claims to the tables and key prefixes a caller "
        "may read (needs --auth-jwt-secret or --auth-jwks)",
    )
    _flag(
        p,
        "--auth-metrics",
        "/metrics needs a bearer token too, and /readyz without one answers only its status",
    )
    _opt(
        p,
        "--rate-limit",
        type=float,
        metavar="N",
        help="requests per second per caller (JWT sub, else client address): "
        "more are answered 429 with Retry-After",
    )
    _opt(
        p,
        "--max-waits",
        16,
        type=int,
        metavar="N",
        help="reads of one caller that may wait for min_offset at once (more: 429)",
    )
    _opt(
        p,
        "--max-watches",
        64,
        type=int,
        metavar="N",
        help="watches one caller (JWT sub, else client address) may have open at once "
        "(more: 429, gRPC RESOURCE_EXHAUSTED, WebSocket close 1008)",
    )
    _opt(
        p,
        "--cluster-secret",
        help="shared by the app's nodes: they sign membership records and internal calls with it",
    )
    _opt(p, "--cluster-secret-file", help="a file holding the cluster secret (not shown by ps)")
    _opt(p, "--tls-cert", help="serve HTTPS with this certificate (PEM)")
    _opt(p, "--tls-key", help="the certificate's private key (PEM)")
    _opt(p, "--tls-ca", help="the CA that signed the nodes' certificates: peers are verified")
    _opt(
        p,
        "--grpc-port",
        type=int,
        help="also serve gRPC (service tablecast.v1.Tables: Get, BatchGet, Range, Watch) on this "
        "port, with the same auth (and TLS with --tls-cert)",
    )
    _opt(
        p,
        "--http-engine",
        choices=("granian", "loop"),
        default="loop",
        help="loop (default): HTTP/1.1 and WebSocket parsed on the event loop's own thread, "
        "the faster for reads; or granian: HTTP/1.1, HTTP/2 and WebSocket in Rust on a thread "
        "of its own (HTTP/2 carries many watches on one connection)",
    )
    _opt(
        p,
        "--listeners",
        type=int,
        help="listening sockets sharing the port, over which the kernel spreads new connections "
        "(--http-engine loop; default: enough for 16,384 connections waiting to be accepted at "
        "this kernel's net.core.somaxconn, 4 at its default 4,096)",
    )
    _opt(
        p,
        "--processes",
        1,
        type=int,
        help="processes answering plain key GETs on the port, the node's own included: the "
        "others read its RocksDB stores as secondary instances and pipe every other request "
        "to it (--http-engine loop; with --rate-limit they spend from the node's buckets)",
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
        ("watch", "follow a table's rows live: a snapshot, then every change (JSON lines)"),
        ("history", "list one key's versions (a table with a history)"),
        ("tables", "list tables"),
        ("cluster", "show nodes"),
    ):
        p = sub.add_parser(name, help=what)
        if name in ("query", "history"):
            p.add_argument("table")
            p.add_argument("key")
        if name == "watch":
            p.add_argument("table")
            p.add_argument("keys", nargs="*", metavar="KEY", help="keys to follow (or --prefix)")
            p.add_argument("--prefix", help="follow every key starting with this")
            p.add_argument("--from", dest="start", help="follow keys from this one (inclusive)")
            p.add_argument("--to", dest="end", help="... up to this one (exclusive)")
            p.add_argument("--no-snapshot", action="store_true", help="only changes from now on")
            p.add_argument("--since", help="resume after the event with this id")
        if name == "query":
            p.add_argument("--as-of", help="the value valid at this time (epoch ms or ISO-8601)")
        if name == "history":
            p.add_argument("--from", dest="time_from", help="first time (epoch ms or ISO-8601)")
            p.add_argument("--to", dest="time_to", help="end time, exclusive")
        _opt(p, "--url", "http://localhost:8080", help="a node URL, or several separated by commas")
        _opt(p, "--token", help="a bearer JWT, when the nodes require auth")
        _opt(p, "--ca", help="the CA file that signed the nodes' certificates (https:// URLs)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    handler = _COMMANDS[args.command]
    if args.command in PIPELINE_COMMANDS and (missing := _pipeline_missing()):
        return fail(missing, 1)
    if args.command in ("dev", "demo"):
        _stop_on_signals()
    from tablecast.kafka.config import KafkaConfigError, use
    from tablecast.kafka.probe import KafkaUnavailable

    try:
        if getattr(args, "replication_factor", None):
            from tablecast.kafka.topics import REPLICATION_ENV

            os.environ[REPLICATION_ENV] = str(args.replication_factor)  # children too
        if getattr(args, "kafka_config", None):
            config = use(args.kafka_config)
            logging.getLogger("tablecast").info("Kafka clients: %s", config.describe())
        return handler(args) or 0
    except KeyboardInterrupt:
        return 130
    except (KafkaConfigError, KafkaUnavailable) as e:
        return fail(str(e))


def _signals_set(event: threading.Event) -> None:
    """SIGTERM and SIGINT set `event` (the pipeline stops between waits, cleanly)."""
    import signal

    def handler(signum: int, frame: object) -> None:
        if event.is_set():  # a second signal: stop waiting for a clean stop
            raise KeyboardInterrupt
        logging.getLogger("tablecast").info("signal %d: stopping", signum)
        event.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _stop_on_signals() -> None:
    """SIGTERM and SIGINT both stop the command cleanly (as Ctrl-C does), whatever it inherited.

    A shell starts a background job with SIGINT ignored, and Python then
    leaves it ignored: set both handlers explicitly, or `kill -INT` would do
    nothing and `kill` would skip every ``finally`` that stops the children.
    """
    import signal
    from types import FrameType

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)


def _kafka(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tablecast.kafka.broker import Broker
    from tablecast.kafka.cluster import KafkaCluster

    data_dir = Path(args.data_dir)
    if args.brokers > 1 or KafkaCluster.exists(data_dir):
        cluster = KafkaCluster.create(data_dir, args.port, args.brokers, args.secure)
        if args.broker is not None and not 0 <= args.broker < len(cluster.brokers):
            return fail(f"--broker is 0..{len(cluster.brokers) - 1}")
        what = "brokers" if args.broker is None else f"broker {args.broker}"
        if args.action == "start":
            cluster.start(args.broker)
            print(f"Kafka {what} running; bootstrap servers {cluster.bootstrap_servers}")
            if cluster.client_properties:
                print(f"client settings (pass as --kafka-config): {cluster.client_properties}")
        elif args.action == "stop":
            print(f"stopped {what}" if cluster.stop(args.broker) else "not running")
        else:
            print(cluster.status())
            return 0 if any(b.pid() for b in cluster.brokers) else 3
        return 0
    if args.broker not in (None, 0):
        return fail("--broker needs a cluster: start it with --brokers N")
    broker = Broker(data_dir, args.port, secure=args.secure)
    if args.action == "start":
        broker.start()
        print(f"Kafka broker running on {broker.bootstrap_servers} (data: {args.data_dir})")
        if broker.client_properties:
            print(f"client settings (pass as --kafka-config): {broker.client_properties}")
    elif args.action == "stop":
        print("stopped" if broker.stop() else "not running")
    else:
        print(broker.status())
        return 0 if broker.pid() else 3
    return 0


def _run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tablecast.cli.appfile import load_app
    from tablecast.kafka import probe

    stop = threading.Event()
    _signals_set(stop)
    if args.master:
        os.environ["TABLECAST_MASTER"] = args.master
    probe.check(args.bootstrap_servers)
    app = load_app(args.app_file)
    if args.state_dir:
        app.state_dir = Path(args.state_dir)
    if args.checkpoint_dir:
        app.checkpoint_dir = args.checkpoint_dir
    from tablecast.pipeline.run.spark import ensure_active, ship_file

    ensure_active(args.master)
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # on a cluster, executors get the App file too
        ship_file(active, args.app_file)
    if not stop.is_set():
        app.run(bootstrap_servers=args.bootstrap_servers, master=args.master, stop=stop)
    return 0


def _explain(args: argparse.Namespace) -> int:
    from tablecast.cli.appfile import load_app

    print(load_app(args.app_file).explain())
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tablecast.cluster.node import NodeConfig
    from tablecast.kafka import probe
    from tablecast.server import listen, process
    from tablecast.server.auth import Auth
    from tablecast.server.listen import cannot_listen
    from tablecast.server.policy import Policy, PolicyError

    if bool(args.tls_cert) != bool(args.tls_key):
        return fail("--tls-cert and --tls-key go together")
    if args.listeners is not None and not 1 <= args.listeners <= listen.MOST_ASKED:
        return fail(f"--listeners: 1 to {listen.MOST_ASKED}, not {args.listeners}")
    if not 1 <= args.processes <= MOST_PROCESSES:
        return fail(f"--processes: 1 to {MOST_PROCESSES}, not {args.processes}")
    if args.processes > 1 and args.http_engine != "loop":
        return fail("--processes needs --http-engine loop")
    # settings that cannot work fail at once, before Kafka is asked anything
    secret = args.auth_jwt_secret
    if args.auth_jwt_secret_file:
        secret = Path(args.auth_jwt_secret_file).read_text().strip()
    auth_on = bool(secret or args.auth_jwks)
    if args.auth_policy and not auth_on:
        return fail("--auth-policy needs --auth-jwt-secret or --auth-jwks (it reads token claims)")
    if args.auth_metrics and not auth_on:
        return fail("--auth-metrics needs --auth-jwt-secret or --auth-jwks")
    if args.rate_limit is not None and not args.rate_limit > 0:
        return fail("--rate-limit is a positive number of requests per second")
    from importlib.util import find_spec

    if args.grpc_port is not None and (find_spec("grpc") is None or find_spec("google") is None):
        return fail("--grpc-port needs grpcio and protobuf: pip install 'tablecast[grpc]'", 1)
    if args.http_engine == "granian" and find_spec("granian") is None:
        return fail("--http-engine granian needs granian: pip install 'tablecast[granian]'", 1)
    if args.max_waits < 1:
        return fail("--max-waits is at least 1")
    if args.max_watches < 1:
        return fail("--max-watches is at least 1")
    if args.answers_mb < 0 or args.cache_mb < 0:
        return fail("--cache-mb and --answers-mb are at least 0")
    if args.block_cache_mb < 1:
        return fail("--block-cache-mb is at least 1")
    from tablecast.store import rocksdb

    rocksdb.set_block_cache_bytes(args.block_cache_mb * 1024 * 1024)
    try:
        policy = Policy.load(args.auth_policy) if args.auth_policy else None
    except PolicyError as e:
        return fail(str(e))
    for port in (args.port, args.grpc_port):
        if port is not None and (why := cannot_listen(args.host, port)):
            return fail(why)
    probe.check(args.bootstrap_servers)
    scheme = "https" if args.tls_cert else "http"
    url = args.advertised_url or f"{scheme}://{args.host}:{args.port}"
    cluster_secret = args.cluster_secret
    if args.cluster_secret_file:
        cluster_secret = Path(args.cluster_secret_file).read_text().strip()
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
        answers_bytes=args.answers_mb * 1024 * 1024,
        watches_per_caller=args.max_watches,
        cluster_secret=cluster_secret,
        tls_ca=args.tls_ca,
        drop_released_after_s=args.drop_released_after,
    )
    if policy is not None:
        logging.getLogger("tablecast").info(
            "auth policy %s: %d rule(s)", args.auth_policy, len(policy.rules)
        )
    auth = Auth(secret, args.auth_jwks, args.auth_audience, args.auth_issuer, policy)
    tls = (args.tls_cert, args.tls_key) if args.tls_cert else None
    limits = process.Limits(
        args.rate_limit,
        args.max_waits,
        args.auth_metrics,
        args.grpc_port,
        args.http_engine,
        args.listeners,
        args.processes,
    )
    try:
        process.run(config, args.host, args.port, auth, tls, limits)
    except RuntimeError as e:  # granian's bind, when the port was taken after the check above
        if "Address already in use" not in str(e):
            raise
        return fail(f"cannot listen on {args.host}:{args.port}: taken while the node started")
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
    "watch": _http,
    "history": _http,
    "tables": _http,
    "cluster": _http,
}

if __name__ == "__main__":
    sys.exit(main())
