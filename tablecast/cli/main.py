"""``tablecast``: argument parsing, dispatch, and the one place errors are reported.
Each command's work lives in its own module.

Every option of every command also reads ``TABLECAST_<COMMAND>_<OPTION>`` from the
environment (``serve --cache-mb`` <-> ``TABLECAST_SERVE_CACHE_MB``), and four options
read one shared variable in every command that has them; see :mod:`tablecast.cli.options`.
Every failure is one line, ``tablecast: error: <message>``: exit 2 for a wrong command
line, variable or config file, 1 for a failure at run time, 130 for Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tablecast.cli.errors import Failure, UsageError, fail
from tablecast.cli.options import (
    PORT,
    Parser,
    at_least,
    between,
    ensure_free,
    how_to_set,
    option,
    origin,
    positive,
    readable,
    resolve,
)
from tablecast.http.listen import MOST_ASKED
from tablecast.query.forwarding import FORWARDING

DEFAULT_BOOTSTRAP = "localhost:9092"
#: read processes beside a node: more than cores anyone has, fewer than files RocksDB opens
MOST_PROCESSES = 64


def _kafka_options(p: Parser) -> None:
    """The options that reach Kafka: its bootstrap servers and the client settings."""
    option(
        p,
        "--bootstrap-servers",
        DEFAULT_BOOTSTRAP,
        metavar="HOST:PORT,...",
        help="Kafka's bootstrap servers",
    )
    _kafka_config(p)


def _registry_config(p: Parser) -> None:
    option(
        p,
        "--registry-config",
        check=readable,
        metavar="FILE",
        help="how this process reaches Schema Registries (.properties as confluent-kafka's "
        "registry client spells them: url, ssl.ca.location, ssl.certificate.location, "
        "ssl.key.location, basic.auth.user.info, bearer.auth.token)",
    )


def _kafka_config(p: Parser) -> None:
    option(
        p,
        "--kafka-config",
        check=readable,
        metavar="FILE",
        help="Kafka client settings (Java .properties: security.protocol, sasl.*, ssl.*) "
        "for every Kafka client of tablecast",
    )
    option(
        p,
        "--replication-factor",
        type=int,
        check=at_least(1),
        shown="TABLECAST_REPLICATION_FACTOR, else min(3, brokers)",
        metavar="N",
        help="of the topics tablecast creates; min.insync.replicas is min(2, it)",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tablecast")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from tablecast.version import __version__

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


VERBOSE_HELP = "debug logging, and the traceback of an error"


def _command(sub: Any, parser: Parser, name: str, help: str, **kw: Any) -> Parser:
    """Subcommand `name`, whose options read TABLECAST_<NAME>_<OPTION>."""
    p: Parser = sub.add_parser(
        name, help=help, description=help, env_prefix=f"TABLECAST_{name.upper()}_", **kw
    )
    # -v after the command too; SUPPRESS: not given here, it keeps the top level's value
    p.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP
    )
    parser.commands[name] = p
    return p


def build_parser() -> Parser:
    parser = Parser(prog="tablecast", description="Serve the live state of Kafka streams.")
    option(parser, "--verbose", short="-v", switch=True, help=VERBOSE_HELP)
    parser.add_argument("--version", action="version", version=f"tablecast {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # the broker's options are the same for every action (stop must find what start
    # made): TABLECAST_KAFKA_<OPTION>, or TABLECAST_KAFKA_START_<OPTION> for one action
    p = _command(
        sub,
        parser,
        "kafka",
        "a local single-node Kafka broker (KRaft) for development",
        per_action="action",
        shares=False,
    )
    p.add_argument("action", choices=["start", "stop", "status"])
    option(
        p,
        "--port",
        9092,
        type=int,
        check=PORT,
        help="the port clients reach the broker on (with --brokers N: P..P+N-1)",
    )
    option(
        p,
        "--data-dir",
        os.path.join(".tablecast", "kafka"),
        metavar="DIR",
        help="where the broker keeps its settings, log and data",
    )
    option(
        p,
        "--secure",
        switch=True,
        help="SASL_SSL (SCRAM-SHA-512) only, with a generated CA; writes client.properties",
    )
    option(
        p,
        "--brokers",
        1,
        type=int,
        check=at_least(1),
        metavar="N",
        help="start N brokers on ports P..P+N-1 (one KRaft quorum)",
    )
    option(
        p,
        "--broker",
        type=int,
        check=at_least(0),
        shown="all",
        metavar="I",
        help="start or stop broker I of the cluster only",
    )

    p = _command(sub, parser, "run", "run an App's pipeline (the Spark driver)")
    p.add_argument("app_file", help="the Python file that defines the App")
    _kafka_options(p)
    option(
        p,
        "--master",
        shown="TABLECAST_MASTER, else local[2]",
        metavar="URL",
        help="Spark's master: local[N], spark://HOST:PORT, yarn, k8s://...",
    )
    option(
        p,
        "--state-dir",
        shown="TABLECAST_STATE_DIR, else .tablecast",
        metavar="DIR",
        help="where the pipeline keeps its local state",
    )
    option(
        p,
        "--checkpoint-dir",
        metavar="URI",
        shown="STATE_DIR/APP/checkpoints",
        help="where the queries' checkpoints go: on a cluster a URI every executor reaches "
        "(file:///shared/..., hdfs://..., s3a://...)",
    )

    p = _command(sub, parser, "explain", "print an App's plan")
    p.add_argument("app_file", help="the Python file that defines the App")

    p = _command(sub, parser, "serve", "run one serving node (needs no App file)")
    option(
        p,
        "--config",
        check=readable,
        metavar="FILE",
        help="more options from a TOML (.toml) or YAML file, keys named as the long options "
        "(cache-mb = 64); flags and variables win over it",
    )
    option(p, "--app", required=True, metavar="ID", help="the id of the App whose tables to serve")
    _kafka_options(p)
    _registry_config(p)
    option(p, "--port", 8080, type=int, check=PORT, help="the HTTP port")
    option(p, "--host", "127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    option(
        p,
        "--advertised-url",
        shown="SCHEME://HOST:PORT",
        metavar="URL",
        help="the URL other nodes and clients reach this node at",
    )
    option(p, "--node-id", shown="the advertised URL's HOST:PORT", help="this node's name")
    option(
        p,
        "--data-dir",
        shown=os.path.join(".tablecast", "nodes", "NODE_ID"),
        metavar="DIR",
        help="where the node keeps its stores",
    )
    option(
        p,
        "--standby-replicas",
        0,
        type=int,
        check=at_least(0),
        metavar="N",
        help="copies of each partition kept warm on other nodes",
    )
    option(
        p,
        "--cache-mb",
        64,
        type=int,
        check=at_least(0),
        metavar="M",
        help="read cache per table in front of RocksDB (MiB, 0: none)",
    )
    option(
        p,
        "--answers-mb",
        128,
        type=int,
        check=at_least(0),
        metavar="M",
        help="whole answers of plain key GETs kept by the node (MiB, 0: none)",
    )
    option(
        p,
        "--block-cache-mb",
        256,
        type=int,
        check=at_least(1),
        metavar="M",
        help="RocksDB block cache shared by every store of the node (MiB, at least 1)",
    )
    option(
        p,
        "--drop-released-after",
        600.0,
        type=float,
        check=at_least(0),
        metavar="S",
        help="seconds after which the store of a partition this node let go is deleted",
    )
    option(
        p,
        "--leave-timeout",
        20.0,
        type=float,
        check=at_least(0),
        metavar="S",
        help="on SIGTERM, answer on for at most this many seconds while the other nodes take "
        "this node's partitions over (a second SIGTERM stops at once; 0: stop at once)",
    )
    option(
        p,
        "--auth-jwt-secret",
        metavar="S",
        help="HS256 secret: every /v1 request needs a bearer JWT",
    )
    option(
        p,
        "--auth-jwt-secret-file",
        check=readable,
        metavar="FILE",
        help="a file holding the HS256 secret (not shown by ps)",
    )
    option(
        p,
        "--auth-jwks",
        metavar="FILE|URL",
        help="a JWKS file or https:// URL of public keys: every /v1 request needs a bearer JWT",
    )
    option(p, "--auth-audience", help="accept only tokens whose aud claim names this audience")
    option(p, "--auth-issuer", help="accept only tokens whose iss claim is this issuer")
    option(
        p,
        "--auth-policy",
        check=readable,
        metavar="FILE",
        help="YAML or JSON rules from token claims to the tables and key prefixes a caller "
        "may read (needs --auth-jwt-secret or --auth-jwks)",
    )
    option(
        p,
        "--auth-metrics",
        switch=True,
        help="/metrics needs a bearer token too, and /readyz without one answers only its status",
    )
    option(
        p,
        "--rate-limit",
        type=float,
        check=positive(" of requests per second"),
        metavar="N",
        help="requests per second per caller (JWT sub, else client address): "
        "more are answered 429 with Retry-After",
    )
    option(
        p,
        "--max-waits",
        16,
        type=int,
        check=at_least(1),
        metavar="N",
        help="reads of one caller that may wait for min_offset at once (more: 429)",
    )
    option(
        p,
        "--max-watches",
        64,
        type=int,
        check=at_least(1),
        metavar="N",
        help="watches one caller (JWT sub, else client address) may have open at once "
        "(more: 429, gRPC RESOURCE_EXHAUSTED, WebSocket close 1008)",
    )
    option(
        p,
        "--cluster-secret",
        metavar="S",
        help="shared by the app's nodes: they sign membership records and internal calls with it",
    )
    option(
        p,
        "--cluster-secret-file",
        check=readable,
        metavar="FILE",
        help="a file holding the cluster secret (not shown by ps)",
    )
    option(
        p,
        "--tls-cert",
        check=readable,
        metavar="FILE",
        help="serve HTTPS with this certificate (PEM)",
    )
    option(
        p, "--tls-key", check=readable, metavar="FILE", help="the certificate's private key (PEM)"
    )
    option(
        p,
        "--tls-ca",
        check=readable,
        metavar="FILE",
        help="the CA that signed the nodes' certificates: peers are verified",
    )
    option(
        p,
        "--grpc-port",
        type=int,
        check=PORT,
        shown="none: no gRPC",
        help="also serve gRPC (service tablecast.v1.Tables: Get, BatchGet, Range, Watch) on this "
        "port, with the same auth (and TLS with --tls-cert)",
    )
    option(
        p,
        "--pg-port",
        type=int,
        check=PORT,
        shown="none: no SQL",
        help="also serve the PostgreSQL protocol (psql, JDBC, psycopg: read-only SQL over "
        "every table) on this port, with the same auth (the password is the JWT) and TLS",
    )
    option(
        p,
        "--pg-allow-cleartext",
        switch=True,
        help="with auth on, accept a PostgreSQL password (a JWT) without TLS from loopback",
    )
    option(
        p,
        "--http-engine",
        "loop",
        choices=("granian", "loop"),
        help="loop: HTTP/1.1 and WebSocket parsed on the event loop's own thread, "
        "the faster for reads; or granian: HTTP/1.1, HTTP/2 and WebSocket in Rust on a thread "
        "of its own (HTTP/2 carries many watches on one connection)",
    )
    option(
        p,
        "--forwarding",
        "short",
        choices=FORWARDING,
        help="how reads another node answers leave: short (those leaving together as one "
        "batch, plain key GETs straight from the HTTP parser into it), batched (every read "
        "through the router), one-by-one (each alone); the last two are for comparison",
    )
    option(
        p,
        "--listeners",
        type=int,
        check=between(1, MOST_ASKED),
        shown="enough for 16,384 connections waiting to be accepted at this kernel's "
        "net.core.somaxconn, 4 at its default 4,096",
        metavar="N",
        help="listening sockets sharing the port, over which the kernel spreads new connections "
        "(--http-engine loop)",
    )
    option(
        p,
        "--processes",
        1,
        type=int,
        check=between(1, MOST_PROCESSES),
        metavar="N",
        help="processes answering plain key GETs on the port, the node's own included: the "
        "others read its RocksDB stores as secondary instances and pipe every other request "
        "to it (--http-engine loop; with --rate-limit they spend from the node's buckets)",
    )

    option(
        p,
        "--huge-pages",
        "on",
        choices=("on", "off"),
        help="on: the node starts itself again with its Python objects on transparent huge "
        "pages, where the kernel gives them on request (THP madvise) and glibc can ask (2.35 "
        "and later): a read touches objects spread over the heap, fewer TLB misses each",
    )

    for name, what in (("dev", "everything on one machine"), ("demo", "the stock-price demo")):
        p = _command(sub, parser, name, what)
        if name == "dev":
            p.add_argument("app_file", help="the Python file that defines the App")
            option(p, "--generate", switch=True, help="also run the App file's generate()")
        option(p, "--nodes", 1, type=int, check=at_least(1), metavar="N", help="serving nodes")
        option(
            p,
            "--port",
            8080,
            type=int,
            check=PORT,
            help="the HTTP port of the first node (node I listens on PORT+I)",
        )
        option(
            p,
            "--bootstrap-servers",
            shown="none: a broker of its own on --kafka-port",
            metavar="HOST:PORT,...",
            help="a running Kafka to use",
        )
        _kafka_config(p)
        option(
            p,
            "--kafka-port",
            9092,
            type=int,
            check=PORT,
            help="the port of its own broker (without --bootstrap-servers)",
        )
        option(
            p,
            "--data-dir",
            os.path.join(".tablecast", "dev"),
            metavar="DIR",
            help="where the broker, pipeline and nodes keep their data and logs",
        )
        option(
            p,
            "--pg-port",
            type=int,
            check=PORT,
            shown="none: no SQL",
            help="the first node also serves the PostgreSQL protocol on this port (psql)",
        )

    for name, what in (
        ("query", "read one key"),
        ("watch", "follow a table's rows live: a snapshot, then every change (JSON lines)"),
        ("history", "list one key's versions (a table with a history)"),
        ("tables", "list tables"),
        ("cluster", "show nodes"),
    ):
        p = _command(sub, parser, name, what)
        if name in ("query", "history"):
            p.add_argument("table")
            p.add_argument("key")
        if name == "watch":
            p.add_argument("table")
            p.add_argument("keys", nargs="*", metavar="KEY", help="keys to follow (or --prefix)")
            option(p, "--prefix", help="follow every key starting with this")
            option(p, "--from", dest="start", help="follow keys from this one (inclusive)")
            option(p, "--to", dest="end", help="... up to this one (exclusive)")
            option(p, "--no-snapshot", switch=True, help="only changes from now on")
            option(p, "--since", metavar="ID", help="resume after the event with this id")
        if name == "query":
            option(p, "--as-of", metavar="T", help="the value valid at T (epoch ms or ISO-8601)")
        if name == "history":
            option(
                p, "--from", dest="time_from", metavar="T", help="first time (epoch ms or ISO-8601)"
            )
            option(p, "--to", dest="time_to", metavar="T", help="end time, exclusive")
            option(
                p,
                "--order",
                "asc",
                choices=("asc", "desc"),
                help="asc: oldest first; desc: newest first",
            )
        option(
            p,
            "--url",
            "http://localhost:8080",
            help="a node URL, or several separated by commas",
        )
        option(p, "--token", help="a bearer JWT, when the nodes require auth")
        option(
            p,
            "--ca",
            check=readable,
            metavar="FILE",
            help="the CA file that signed the nodes' certificates (https:// URLs)",
        )

    from tablecast.contract.partitioner import PARTITIONERS
    from tablecast.contract.table_info import STORES
    from tablecast.kafka.attach import FORMATS, KEY_FORMATS, VALUE_FORMATS

    p = _command(
        sub, parser, "attach", "serve a topic something else writes as a table (no pipeline)"
    )
    p.add_argument("name", help="the table's name")
    option(p, "--app", required=True, metavar="ID", help="the App whose nodes serve it")
    option(p, "--topic", required=True, help="the topic to serve")
    formats = ", ".join(FORMATS)
    option(
        p,
        "--key",
        "string",
        choices=KEY_FORMATS,
        metavar="FORMAT",
        help=f"the keys': {formats}, confluent-avro, confluent-json, confluent-protobuf "
        "(written through a Schema Registry: --registry; the nodes look such keys up), or a "
        "Kafka Streams window or session store's (kafka-streams-window:INNER, "
        "kafka-streams-session:INNER; INNER one of string, json, long, bytes, or a registry "
        "format)",
    )
    option(
        p,
        "--value",
        "json",
        choices=VALUE_FORMATS,
        metavar="FORMAT",
        help=f"the values': {formats}, or confluent-avro, confluent-json, confluent-protobuf "
        "(written through a Schema Registry: --registry)",
    )
    option(
        p,
        "--registry",
        metavar="URL",
        help="the Schema Registry the keys or values were written through (its Confluent API; "
        "with --key debezium --value debezium: Debezium's Avro converter)",
    )
    _registry_config(p)
    option(
        p,
        "--partitioner",
        "murmur2",
        choices=PARTITIONERS,
        help="how the topic's writer picks a key's partition: murmur2 (Java clients, Kafka "
        "Connect, Kafka Streams), consistent_random (librdkafka's default: confluent-kafka), "
        "unknown (anything else: the nodes look keys up)",
    )
    option(
        p,
        "--window-size",
        metavar="DURATION",
        help="a Kafka Streams window store's window size (60s, 5m, or ms): its records carry "
        "their window's start only",
    )
    option(
        p,
        "--history",
        metavar="DURATION",
        help="keep every version of every key this long (60s, 5m, 1 day, or ms)",
    )
    p.add_argument(
        "--index",
        action="append",
        default=[],
        metavar="NAME=JSONPATH",
        help="a secondary index whose values the nodes take from each row: $.a.b, "
        "$.tags[*] (again for more indexes)",
    )
    option(p, "--store", "rocksdb", choices=STORES, help="where the nodes keep it")
    option(
        p,
        "--retention-ok",
        switch=True,
        help="attach a topic that deletes records: the table loses what the topic deletes",
    )
    _kafka_options(p)

    p = _command(sub, parser, "detach", "stop serving an attached table (its topic stays)")
    p.add_argument("name", help="the table's name")
    option(p, "--app", required=True, metavar="ID", help="the App whose nodes serve it")
    _kafka_options(p)
    return parser


def _report(e: BaseException, verbose: bool) -> int:
    """`e` as the one error line, and its exit code (a traceback first with -v)."""
    code = 1
    hint = ""
    if isinstance(e, UsageError | Failure):
        code, message = e.code, str(e)
    elif isinstance(e, SystemExit):  # raise SystemExit("why"), from code tablecast runs
        message = str(e.code).removeprefix("tablecast: error: ")
    elif isinstance(e, OSError) and e.filename is not None:
        message = f"{e.filename}: {e.strerror or e}"
    elif isinstance(e, RuntimeError | OSError | ValueError) and str(e):
        message = str(e)  # the library's errors say what went wrong in words
    else:
        message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        hint = " (-v shows where)"
    if verbose:
        traceback.print_exception(e, file=sys.stderr)
        hint = ""
    lines = [line for line in message.splitlines() if line.strip()]
    return fail((lines[0] if lines else type(e).__name__) + hint, code)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tablecast`` command: every exception ends here as one line and an exit code."""
    verbose = False
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        args.own_process = argv is None  # the process's own command line: it may restart
        verbose = args.verbose is True  # -v given: a bad value of another option shows where
        resolve(parser, args, os.environ)
        verbose = args.verbose
        logging.basicConfig(
            level=logging.DEBUG if verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        logging.getLogger("httpx").setLevel(logging.WARNING)
        return _dispatch(args)
    except KeyboardInterrupt:
        return 130
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):  # --help, --version: argparse's own exit
            return e.code or 0
        return _report(e, verbose)
    except Exception as e:
        return _report(e, verbose)


def _dispatch(args: argparse.Namespace) -> int:
    handler = _COMMANDS[args.command]
    app_file = getattr(args, "app_file", None)
    if app_file is not None and not Path(app_file).is_file():
        raise UsageError(f"{app_file}: no such file (the App file)")
    if args.command in PIPELINE_COMMANDS and (missing := _pipeline_missing()):
        raise Failure(missing)
    if args.command in ("dev", "demo"):
        _stop_on_signals()
    if getattr(args, "replication_factor", None):
        from tablecast.kafka.topics import REPLICATION_ENV

        os.environ[REPLICATION_ENV] = str(args.replication_factor)  # children too
    if getattr(args, "registry_config", None):
        from tablecast.kafka import registry_config

        try:
            settings = registry_config.RegistrySettings.load(args.registry_config)
        except registry_config.RegistryConfigError as e:
            raise UsageError(f"{origin(args, 'registry_config')}: {e}") from None
        registry_config.use(settings)
        logging.getLogger("tablecast").info("Schema Registry clients: %s", settings.describe())
    if getattr(args, "kafka_config", None):
        from tablecast.kafka.config import KafkaConfigError, use

        try:
            config = use(args.kafka_config)
        except KafkaConfigError as e:  # the file an option names is wrong: a usage error
            raise UsageError(f"{origin(args, 'kafka_config')}: {e}") from None
        logging.getLogger("tablecast").info("Kafka clients: %s", config.describe())
    return handler(args) or 0


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


def _java(compiler: bool) -> None:
    """Java 17+ found (JAVA_HOME, else PATH) before anything starts; and javac for the
    pipeline, unless the jars it compiles are compiled already."""
    from tablecast import jvm

    jvm.require_java(compiler=compiler and not jvm.pipeline_jars_compiled())


def _kafka(args: argparse.Namespace) -> int:
    from tablecast.kafka.broker import Broker
    from tablecast.kafka.dev_cluster import KafkaCluster

    data_dir = Path(args.data_dir)
    brokers: tuple[Broker, ...]
    if args.brokers > 1 or KafkaCluster.exists(data_dir):
        cluster = KafkaCluster.create(data_dir, args.port, args.brokers, args.secure)
        brokers = cluster.brokers
        if args.broker is not None and not 0 <= args.broker < len(brokers):
            raise UsageError(
                f"{origin(args, 'broker')}: 0 to {len(brokers) - 1}, not {args.broker}"
            )
    else:
        if args.broker not in (None, 0):
            raise UsageError("--broker needs a cluster: start it with --brokers N")
        cluster = None
        brokers = (Broker(data_dir, args.port, secure=args.secure),)
    if args.action == "start":
        chosen = brokers if args.broker is None else (brokers[args.broker],)
        starting = [(i, b) for i, b in enumerate(brokers) if b in chosen and b.pid() is None]
        for i, b in starting:  # a running broker is reused: its port is its own
            ensure_free(args, "--port", b.host, b.port, f" (broker {i})" if cluster else "")
        if starting:
            _java(compiler=False)
    if cluster is not None:
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
    (broker,) = brokers
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
    from tablecast.cli.appfile import load_app
    from tablecast.kafka import probe
    from tablecast.pipeline.run.spark import under_spark_submit

    if not under_spark_submit():  # spark-submit started the JVM, with the jars it was given
        _java(compiler=True)
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


def _read_secret(args: argparse.Namespace, dest: str) -> str:
    """The secret in the file option `dest` names: one it cannot read is a usage error."""
    path = getattr(args, dest)
    try:
        return Path(path).read_text().strip()
    except OSError as e:
        raise UsageError(f"{origin(args, dest)}: cannot read {path}: {e.strerror or e}") from None


def _serve(args: argparse.Namespace) -> int:
    from tablecast.cluster.node import NodeConfig
    from tablecast.kafka import probe
    from tablecast.node import serve
    from tablecast.query.auth import Auth
    from tablecast.query.policy import Policy, PolicyError

    # settings that cannot work fail at once, before Kafka is asked anything; the values
    # themselves were checked with their options
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.processes > 1 and args.http_engine != "loop":
        raise UsageError("--processes needs --http-engine loop")
    secret = args.auth_jwt_secret
    if args.auth_jwt_secret_file:
        secret = _read_secret(args, "auth_jwt_secret_file")
    auth_on = bool(secret or args.auth_jwks)
    if args.auth_policy and not auth_on:
        raise UsageError(
            "--auth-policy needs --auth-jwt-secret or --auth-jwks (it reads token claims)"
        )
    if args.auth_metrics and not auth_on:
        raise UsageError("--auth-metrics needs --auth-jwt-secret or --auth-jwks")
    cluster_secret = args.cluster_secret
    if args.cluster_secret_file:
        cluster_secret = _read_secret(args, "cluster_secret_file")
    try:
        policy = Policy.load(args.auth_policy) if args.auth_policy else None
    except PolicyError as e:  # the file an option names is wrong: a usage error
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(
            f"{origin(args, 'auth_policy')}: cannot read {args.auth_policy}: {e.strerror or e}"
        ) from None
    from importlib.util import find_spec

    grpc_parts = ("grpc", "google", "grpc_health", "grpc_reflection")
    if args.grpc_port is not None and any(find_spec(m) is None for m in grpc_parts):
        raise Failure("--grpc-port needs grpcio and protobuf: pip install 'tablecast[grpc]'")
    if args.http_engine == "granian" and find_spec("granian") is None:
        raise Failure("--http-engine granian needs granian: pip install 'tablecast[granian]'")
    ensure_free(args, "--port", args.host, args.port)
    if args.grpc_port is not None:
        ensure_free(args, "--grpc-port", args.host, args.grpc_port)
    if args.pg_port is not None:
        if find_spec("sqlglot") is None:
            raise Failure("--pg-port needs sqlglot: pip install 'tablecast[pg]'")
        ensure_free(args, "--pg-port", args.host, args.pg_port)
    if args.huge_pages == "on" and args.own_process:
        from tablecast.node import huge_pages

        huge_pages.restart_on_huge_pages()  # before any thread or connection: it starts again
        if huge_pages.asked(os.environ):
            logging.getLogger("tablecast").info("Python's heap asks for transparent huge pages")
    from tablecast.store import rocksdb

    rocksdb.set_block_cache_bytes(args.block_cache_mb * 1024 * 1024)
    probe.check(args.bootstrap_servers)
    scheme = "https" if args.tls_cert else "http"
    url = args.advertised_url or f"{scheme}://{args.host}:{args.port}"
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
        leave_timeout_s=args.leave_timeout,
    )
    if policy is not None:
        logging.getLogger("tablecast").info(
            "auth policy %s: %d rule(s)", args.auth_policy, len(policy.rules)
        )
    auth = Auth(secret, args.auth_jwks, args.auth_audience, args.auth_issuer, policy)
    settings = serve.ServeSettings(
        node=config,
        host=args.host,
        port=args.port,
        tls=(args.tls_cert, args.tls_key) if args.tls_cert else None,
        rate=args.rate_limit,
        waits_per_caller=args.max_waits,
        auth_metrics=args.auth_metrics,
        grpc_port=args.grpc_port,
        pg_port=args.pg_port,
        pg_allow_cleartext=args.pg_allow_cleartext,
        http_engine=args.http_engine,
        listeners=args.listeners,
        processes=args.processes,
        forwarding=args.forwarding,
    )
    try:
        serve.run(settings, auth)
    except RuntimeError as e:  # granian's bind, when the port was taken after the check above
        if "Address already in use" not in str(e):
            raise
        raise Failure(
            f"cannot listen on {args.host}:{args.port}: taken while the node started; "
            f"choose another {how_to_set(args, '--port')}"
        ) from None
    return 0


def _dev(args: argparse.Namespace) -> int:
    from tablecast.cli import dev

    return dev.run(args)


def _attach(args: argparse.Namespace) -> int:
    from tablecast.kafka.attach import AttachError, attach, detach, index_option

    try:
        indexes = dict(index_option(text) for text in getattr(args, "index", []))
    except AttachError as e:
        raise UsageError(str(e)) from None
    try:
        if args.command == "detach":
            detach(args.name, app=args.app, bootstrap_servers=args.bootstrap_servers)
            print(f"detached {args.name}")
            return 0
        info = attach(
            args.name,
            app=args.app,
            topic=args.topic,
            bootstrap_servers=args.bootstrap_servers,
            key=args.key,
            value=args.value,
            partitioner=args.partitioner,
            registry=args.registry,
            window_size=args.window_size,
            history=args.history,
            indexes=indexes,
            store=args.store,
            retention_ok=args.retention_ok,
        )
    except AttachError as e:
        raise Failure(str(e)) from None
    print(f"attached {info.topic} as {info.name} ({info.partitions} partitions)")
    return 0


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
    "attach": _attach,
    "detach": _attach,
}

if __name__ == "__main__":
    sys.exit(main())
