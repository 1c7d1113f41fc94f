"""Session-wide real parts: one Kafka broker and one SparkSession for the whole run."""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tablecast.kafka.broker import Broker, free_port

from .support.scheduling import ModulesInOrder, rank, uses_spark

_ids = itertools.count()


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test's directory is its lane: everything under tests/integration is marked
    `integration` (it may start a broker, Spark, a JVM or node processes), so no decorator
    has to be remembered. Tests marked `long` run only with TABLECAST_LONG=1 (`python -m
    bench long` runs them all): the suite keeps one kill -9 test of the driver (grouped
    tables) and a one-minute chaos soak."""
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
    # Spark tests first, then the other integration tests, unit tests last, the longest modules
    # first in each: the long stretches start while there is other work to balance them (the
    # order workers get modules in; a stable sort keeps each module's tests in their order)
    items.sort(
        key=lambda item: (
            not uses_spark(item.path),
            INTEGRATION not in item.path.parents,
            rank(item.path),
        )
    )
    if os.environ.get("TABLECAST_LONG") == "1":
        return
    skip = pytest.mark.skip(reason="long test: `python -m bench long` runs it")
    for item in items:
        if item.get_closest_marker("long"):
            item.add_marker(skip)


#: programs that start a JVM: the fast lane (`./run check`) never runs one
JVM_PROGRAMS = frozenset({"java", "javac", "keytool", "mvn", "spark-submit", "spark-class"})

# Every JVM the tests start (brokers, Spark drivers, Kafka Streams peers) lives for seconds or
# minutes, and the suite is CPU-bound on two cores. So: C1 alone (C2's work never pays back
# that soon) and no verification of the jars' bytecode. The JVMs' "Picked up" note goes to
# their stderr.
os.environ.setdefault(
    "JDK_JAVA_OPTIONS",
    "-XX:TieredStopAtLevel=1 -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` (./run tests): whole modules, Spark ones on half the workers."""
    if config.getoption("dist", None) != "loadscope":
        return None
    return ModulesInOrder(config, log)


@pytest.fixture(autouse=True, scope="session")
def _no_jvm_in_the_fast_lane() -> Iterator[None]:
    """With TABLECAST_NO_JVM=1 (set by `./run check`), a test that starts a JVM fails at
    once, naming the program: such a test belongs under tests/integration."""
    if os.environ.get("TABLECAST_NO_JVM") != "1":
        yield
        return
    import subprocess

    real = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen, args: Any, *a: Any, **kw: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(argv[0]).split()[0]) if argv else ""
        if program in JVM_PROGRAMS:
            raise AssertionError(f"{program} started in the no-JVM lane: move the test")
        real(self, args, *a, **kw)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = real  # type: ignore[method-assign]


#: where the run's shared brokers live (set by the process that runs the session)
SHARED_DIR = "tablecast_shared_dir"
_shared_key = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """The run's shared brokers get one directory, made by the process that runs the
    session (xdist's controller, or pytest alone) and handed to its workers. Its data lives
    outside pytest's numbered temp dirs: another pytest session on the machine prunes old
    ones, and a broker whose log dir vanishes halts."""
    if not hasattr(config, "workerinput"):
        config.stash[_shared_key] = Path(tempfile.mkdtemp(prefix="tablecast-test-kafka-"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    node.workerinput[SHARED_DIR] = str(node.config.stash[_shared_key])


def pytest_unconfigure(config: pytest.Config) -> None:
    """The process that made the directory stops its brokers once every worker is done."""
    shared = config.stash.get(_shared_key, None)
    if shared is None:
        return
    for port_file in shared.glob("*/port"):
        Broker(port_file.parent, int(port_file.read_text())).stop()
    if not os.environ.get("TABLECAST_KEEP_TEST_BROKER"):
        shutil.rmtree(shared, ignore_errors=True)


def _shared_broker(config: pytest.Config, name: str, secure: bool = False) -> Broker:
    """A broker every worker of the run shares, started by the first that asks for it:
    one broker's start and idle work instead of one per worker, on a CPU-bound machine."""
    workerinput = getattr(config, "workerinput", None)
    shared = Path(workerinput[SHARED_DIR]) if workerinput else config.stash[_shared_key]
    data = shared / name
    data.mkdir(exist_ok=True)
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker starts it; the others wait and reuse it
        port_file = data / "port"
        if not port_file.exists():
            port_file.write_text(str(free_port()))
        b = Broker(data, int(port_file.read_text()), secure=secure)
        b.start()  # reuses the broker another worker started
    return b


@pytest.fixture(scope="session")
def broker(pytestconfig: pytest.Config) -> Broker:
    """A real single-node KRaft broker on a free port, shared by the run's workers and
    stopped when the run ends."""
    return _shared_broker(pytestconfig, "plain")


@pytest.fixture(scope="session")
def secure_broker(pytestconfig: pytest.Config) -> Broker:
    """A broker that speaks SASL_SSL (SCRAM-SHA-512) only; its client settings are in
    ``secure_broker.client_properties`` (pass as --kafka-config)."""
    return _shared_broker(pytestconfig, "secure", secure=True)


@pytest.fixture(scope="session")
def bootstrap(broker: Broker) -> str:
    return broker.bootstrap_servers


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One SparkSession (local[2]) shared by every pipeline test."""
    from tablecast.pipeline.run.spark import session

    s = session("tablecast-tests", "local[2]", shuffle_partitions=4)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def unique() -> str:
    """A fresh name for topics and app ids, so tests never see each other's data."""
    return f"t{next(_ids)}{uuid.uuid4().hex[:6]}"


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    return d
