"""Session-wide real parts: one Kafka broker and one SparkSession for the whole run."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tablecast import jvm
from tablecast.kafka.broker import Broker, free_port

from .support.scheduling import ModulesInOrder, rank, uses_spark

_ids = itertools.count()


INTEGRATION = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test's directory is its lane: everything under tests/integration is marked
    `integration` (it may start a broker, Spark, a JVM or node processes), so no decorator
    has to be remembered. Tests marked `long` run only with TABLECAST_LONG=1 (`python -m
    bench long` runs them all): the suite keeps one kill -9 test of the driver (grouped
    tables); the chaos soak is long."""
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
# minutes, and the suite is CPU-bound on two cores. So: the options of `tablecast dev`'s JVMs
# (C1 alone, the serial collector) and no verification of the jars' bytecode. The JVMs'
# "Picked up" note goes to their stderr.
os.environ.setdefault(
    "JDK_JAVA_OPTIONS",
    " ".join([*jvm.QUICK_JVM, "-XX:+UnlockDiagnosticVMOptions", "-XX:-BytecodeVerificationRemote"]),
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


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """A real single-node KRaft broker on a free port, stopped at the end of the session.

    Its data lives outside pytest's numbered temp dirs: another pytest session
    on the machine prunes old ones, and a broker whose log dir vanishes halts.
    """
    data = Path(tempfile.mkdtemp(prefix="tablecast-test-kafka-"))
    b = Broker(data, free_port())
    b.start()
    try:
        yield b
    finally:
        b.stop()
        if not os.environ.get("TABLECAST_KEEP_TEST_BROKER"):
            shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def secure_broker() -> Iterator[Broker]:
    """A broker that speaks SASL_SSL (SCRAM-SHA-512) only; its client settings are in
    ``secure_broker.client_properties`` (pass as --kafka-config)."""
    data = Path(tempfile.mkdtemp(prefix="tablecast-test-kafka-secure-"))
    b = Broker(data, free_port(), secure=True)
    b.start()
    try:
        yield b
    finally:
        b.stop()
        shutil.rmtree(data, ignore_errors=True)


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
