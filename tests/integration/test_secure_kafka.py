"""tablecast against a secured Kafka (SASL_SSL, SCRAM-SHA-512, a private CA): the pipeline on
Spark, two serving nodes, the example's generator and `tablecast dev` all through one
--kafka-config file; a plaintext client is refused; wrong credentials, an untrusted CA or an
unreachable broker end a command within 60 s with one clear line and no secret in sight."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from tablecast.kafka import config, probe
from tablecast.kafka.broker import Broker, free_port
from tablecast.kafka.topics import end_offsets, ensure_topic
from tests import reference_model as ref

from ..support.procs import eventually, free_port_run
from .test_pipeline_restart import Row, batch, json_sender, kill_group, sel, start
from .test_pipeline_support import read_table
from .test_spark_cluster import GROUPING_APP, LONG, STR

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "stock_prices.py"


def _serve(bootstrap: str, kafka_config: Path | None, tmp: Path) -> tuple[int, str, float]:
    argv = [sys.executable, "-m", "tablecast.cli.main", "serve", "--app", "refused"]
    argv += ["--bootstrap-servers", bootstrap, "--port", str(free_port())]
    argv += ["--data-dir", str(tmp / "node")]
    if kafka_config is not None:
        argv += ["--kafka-config", str(kafka_config)]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=90)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def _variant(secure_broker: Broker, tmp: Path, name: str, edit) -> Path:  # type: ignore[no-untyped-def]
    props = secure_broker.client_config().props
    path = tmp / f"{name}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in edit(dict(props)).items()))
    return path


def _other_ca(tmp: Path) -> Path:
    from tablecast.kafka.secure import SecureMaterial

    other = SecureMaterial(tmp / "other-ca")
    other.ensure()
    return other.ca


def test_bad_settings_fail_fast_with_one_line(secure_broker: Broker, tmp_path: Path) -> None:
    password = secure_broker.material.password
    wrong = _variant(
        secure_broker,
        tmp_path,
        "wrong",
        lambda p: {**p, "sasl.jaas.config": p["sasl.jaas.config"].replace(password, "not-it")},
    )
    untrusted = _variant(
        secure_broker,
        tmp_path,
        "untrusted",
        lambda p: {**p, "ssl.truststore.location": str(_other_ca(tmp_path))},
    )
    cases = [
        (secure_broker.bootstrap_servers, wrong, "refused user 'admin'"),
        (secure_broker.bootstrap_servers, untrusted, "is not trusted"),
        (secure_broker.bootstrap_servers, None, "a secured broker?"),
        (f"127.0.0.1:{free_port()}", secure_broker.client_properties, "cannot reach Kafka"),
    ]
    # side by side: the unreachable cases each wait out the 45 s a starting broker is given
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = list(
            pool.map(lambda i: _serve(*cases[i][:2], tmp_path / f"case{i}"), range(len(cases)))
        )
    for (_, settings, cause), (code, output, took) in zip(cases, runs, strict=True):
        assert code != 0 and took < 60, (settings, code, took, output[-2000:])
        errors = [line for line in output.splitlines() if line.startswith("tablecast: error:")]
        assert len(errors) == 1 and cause in errors[0], output[-2000:]
        assert "Traceback" not in output
        assert password not in output


def test_plaintext_client_is_refused(secure_broker: Broker) -> None:
    config.use(None)
    with pytest.raises(probe.KafkaUnavailable):
        probe.check(secure_broker.bootstrap_servers, timeout=5)
    try:
        config.use(secure_broker.client_properties)
        probe.check(secure_broker.bootstrap_servers, timeout=30)
    finally:
        config.use(None)


def test_dev_pipeline_and_nodes_on_the_secured_broker(
    secure_broker: Broker, tmp_path: Path
) -> None:
    """The stock-price example end to end: its generator, the Spark pipeline and two nodes
    read and write Kafka only through SASL_SSL, configured by one --kafka-config file; the
    first node also answers SQL."""
    port = free_port_run(2)
    pg_port = free_port()
    out = tmp_path / "dev.out"
    settings = secure_broker.client_properties
    assert settings is not None

    def logs() -> str:
        return out.read_text() + "".join(
            p.read_text(errors="replace") for p in (tmp_path / "dev" / "logs").glob("*.log")
        )

    def up() -> bool:
        if dev.poll() is not None:  # fail now, with its reason, not when the wait runs out
            raise RuntimeError(f"dev exited with {dev.returncode}:\n{logs()[-4000:]}")
        return "is up" in out.read_text()

    with open(out, "wb") as sink:
        dev = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tablecast.cli.main",
                "dev",
                str(EXAMPLE),
                "--generate",
                "--nodes",
                "2",
                "--bootstrap-servers",
                secure_broker.bootstrap_servers,
                "--kafka-config",
                str(settings),
                "--port",
                str(port),
                "--pg-port",
                str(pg_port),
                "--data-dir",
                str(tmp_path / "dev"),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    try:
        try:
            eventually(up, timeout=300)
            urls = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]

            def aapl(url: str) -> dict | None:
                r = httpx.get(f"{url}/v1/tables/prices/keys/AAPL", timeout=5)
                return r.json() if r.status_code == 200 else None

            first = eventually(lambda: aapl(urls[0]), timeout=120)
            assert first["key"] == "AAPL" and first["value"]
            eventually(
                lambda: (aapl(urls[1]) or {}).get("offset", -1) >= first["offset"], timeout=60
            )
            # the generator keeps producing through SASL_SSL: the answer moves on
            eventually(
                lambda: (aapl(urls[0]) or {}).get("offset", -1) > first["offset"], timeout=60
            )
            dsn = f"host=127.0.0.1 port={pg_port} dbname=tablecast user=dev sslmode=disable"
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute(
                    'SELECT key, value, "offset" FROM prices WHERE key = %s',
                    ("AAPL",),
                ).fetchone()
            assert row is not None and row[0] == "AAPL" and row[1], row
            assert row[2] > first["offset"], row  # read now, through the same broker
        except AssertionError as e:
            raise AssertionError(f"{e}\n{logs()[-4000:]}") from e
    finally:
        dev.send_signal(signal.SIGTERM)
        code = dev.wait(60)
    text = logs()
    assert code == 0, text[-3000:]
    assert secure_broker.material.password not in text
    assert "SASL_SSL SCRAM-SHA-512 as 'admin'" in text  # each command says how it connects


@pytest.mark.long
def test_grouped_tables_are_exact_through_sasl_ssl_across_a_kill_9(
    secure_broker: Broker, tmp_path: Path
) -> None:
    """The stateful steps on the secured broker: a table group_by/reduce (its selector inside
    the retraction, state in Spark's store, the repartition topic written and read through
    SASL_SSL) and Spark's own stream count, with the driver killed by SIGKILL between two
    batches; both tables end equal to the reference."""
    settings = secure_broker.client_properties
    assert settings is not None
    bootstrap = secure_broker.bootstrap_servers
    unique = f"sec{time.monotonic_ns() % 10**8}"
    topic = f"{unique}-rows"
    app_file = tmp_path / "app.py"
    app_file.write_text(GROUPING_APP.format(app=unique, topic=topic))
    state, log = tmp_path / "state", tmp_path / "pipeline.log"
    rng = random.Random(17)
    history: list[Row] = []
    send = json_sender(bootstrap, topic, history)

    def run() -> subprocess.Popen[bytes]:
        return start(app_file, bootstrap, state, log, "--kafka-config", str(settings))

    config.use(settings)  # this test's own clients (produce, read back) speak SASL_SSL too
    proc = None
    try:
        ensure_topic(bootstrap, topic, 2)
        send(batch(rng, 1500))
        proc = run()
        sums, counts = f"{unique}.table.sums", f"{unique}.table.counts"
        eventually(lambda: sum(end_offsets(bootstrap, sums).values()) > 0, 300, 1.0)
        send(batch(rng, 1500))
        time.sleep(2)  # mid-stream: the batch is being read, grouped or written
        kill_group(proc, signal.SIGKILL)
        send(batch(rng, 500))
        proc = run()
        want = ref.table_group_reduce(history, sel, lambda a, b: a + b, lambda a, b: a - b)
        eventually(lambda: read_table(bootstrap, sums, STR, LONG) == want, 300, 2.0)
        eventually(lambda: read_table(bootstrap, counts, STR, LONG) == ref.stream_count(history))
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        if proc is not None:
            kill_group(proc, signal.SIGTERM)
        config.use(None)
    text = log.read_text()
    assert secure_broker.material.password not in text
    assert "SASL_SSL SCRAM-SHA-512" in text
