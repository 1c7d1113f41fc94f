"""Every option of every command reads TABLECAST_<COMMAND>_<OPTION>; four options share one
variable across commands; serve reads a --config file; all validated like the flag.
Precedence: flag, per-command variable, shared variable, --config file, default."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tablecast.cli import main as cli
from tablecast.kafka import config as kafka_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No TABLECAST_ option variable of the machine or of another test reaches these, and
    what a command sets for its children (Kafka settings, replication) is undone."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("TABLECAST_") and name != "TABLECAST_NO_JVM":
            monkeypatch.delenv(name)
    monkeypatch.setattr(kafka_config, "_current", kafka_config._current)
    monkeypatch.setattr(cli, "_stop_on_signals", lambda: None)  # pytest keeps its handlers
    yield
    os.environ.clear()
    os.environ.update(saved)


def parsed(monkeypatch: pytest.MonkeyPatch, *argv: str) -> argparse.Namespace:
    """The arguments the command of `argv` gets, through the real entry point."""
    seen: list[argparse.Namespace] = []

    def handler(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    monkeypatch.setitem(cli._COMMANDS, argv[0], handler)
    assert cli.main(list(argv)) == 0
    return seen[0]


def refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of a command line refused as a usage error (exit 2)."""
    assert cli.main(list(argv)) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tablecast: error: "), lines
    return lines[0]


def test_per_command_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TABLECAST_SERVE_CACHE_MB", "7")
    monkeypatch.setenv("TABLECAST_SERVE_APP", "from-env")
    monkeypatch.setenv("TABLECAST_SERVE_HTTP_ENGINE", "granian")
    monkeypatch.setenv("TABLECAST_SERVE_DROP_RELEASED_AFTER", "1.5")
    args = parsed(monkeypatch, "serve")
    assert (args.cache_mb, args.app, args.http_engine) == (7, "from-env", "granian")
    assert args.drop_released_after == 1.5
    monkeypatch.setenv("TABLECAST_WATCH_FROM", "k1")
    monkeypatch.setenv("TABLECAST_WATCH_NO_SNAPSHOT", "yes")
    args = parsed(monkeypatch, "watch", "t")
    assert args.start == "k1" and args.no_snapshot is True
    monkeypatch.setenv("TABLECAST_QUERY_URL", "http://node:1")
    assert parsed(monkeypatch, "query", "t", "k").url == "http://node:1"
    monkeypatch.setenv("TABLECAST_RUN_MASTER", "local[3]")
    app = tmp_path / "app.py"
    app.write_text("")
    assert parsed(monkeypatch, "run", str(app)).master == "local[3]"


def test_kafka_options_read_their_action_then_the_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parsed(monkeypatch, "kafka", "start").port == 9092
    monkeypatch.setenv("TABLECAST_KAFKA_PORT", "9300")
    assert parsed(monkeypatch, "kafka", "start").port == 9300
    assert parsed(monkeypatch, "kafka", "stop").port == 9300
    monkeypatch.setenv("TABLECAST_KAFKA_START_PORT", "9400")
    assert parsed(monkeypatch, "kafka", "start").port == 9400
    assert parsed(monkeypatch, "kafka", "stop").port == 9300
    assert parsed(monkeypatch, "kafka", "start", "--port", "9500").port == 9500


def test_tablecast_port_never_moves_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLECAST_PORT", "8081")
    assert parsed(monkeypatch, "kafka", "start").port == 9092
    assert parsed(monkeypatch, "serve", "--app", "a").port == 8081
    args = parsed(monkeypatch, "demo")
    assert (args.port, args.kafka_port) == (8081, 9092)
    monkeypatch.setenv("TABLECAST_DEMO_KAFKA_PORT", "9555")
    assert parsed(monkeypatch, "demo").kafka_port == 9555


def test_dev_kafka_port(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text("")
    monkeypatch.setenv("TABLECAST_DEV_KAFKA_PORT", "9333")
    monkeypatch.setenv("TABLECAST_DEV_GENERATE", "on")
    args = parsed(monkeypatch, "dev", str(app))
    assert (args.kafka_port, args.generate) == (9333, True)


def test_shared_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=PLAINTEXT\n")
    monkeypatch.setenv("TABLECAST_BOOTSTRAP_SERVERS", "shared:9092")
    monkeypatch.setenv("TABLECAST_KAFKA_CONFIG", str(props))
    monkeypatch.setenv("TABLECAST_CLUSTER_SECRET", "s3")
    args = parsed(monkeypatch, "serve", "--app", "a")
    assert (args.bootstrap_servers, args.kafka_config, args.cluster_secret) == (
        "shared:9092",
        str(props),
        "s3",
    )
    app = tmp_path / "app.py"
    app.write_text("")
    assert parsed(monkeypatch, "run", str(app)).bootstrap_servers == "shared:9092"
    assert parsed(monkeypatch, "dev", str(app)).bootstrap_servers == "shared:9092"


def test_precedence_flag_command_shared_config_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    conf = tmp_path / "serve.toml"
    conf.write_text('app = "a"\nport = 1111\ncache_mb = 3\n')
    argv = ["serve", "--config", str(conf)]
    args = parsed(monkeypatch, *argv)
    assert (args.port, args.cache_mb, args.answers_mb) == (1111, 3, 128)  # file, file, default
    monkeypatch.setenv("TABLECAST_PORT", "2222")
    assert parsed(monkeypatch, *argv).port == 2222
    monkeypatch.setenv("TABLECAST_SERVE_PORT", "3333")
    assert parsed(monkeypatch, *argv).port == 3333
    assert parsed(monkeypatch, *argv, "--port", "4444").port == 4444


def test_the_config_file_may_be_yaml_and_named_by_a_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    conf = tmp_path / "serve.yaml"
    conf.write_text("app: a\nblock-cache-mb: 9\nauth_metrics: true\nauth-jwt-secret: s\n")
    monkeypatch.setenv("TABLECAST_SERVE_CONFIG", str(conf))
    args = parsed(monkeypatch, "serve")
    assert (args.app, args.block_cache_mb, args.auth_metrics) == ("a", 9, True)


def test_unknown_config_keys_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = tmp_path / "serve.toml"
    conf.write_text('app = "a"\ncache_md = 3\nbogus = 1\n')
    line = refused(capsys, "serve", "--config", str(conf))
    assert "unknown key(s) bogus, cache_md" in line
    conf.write_text('app = "a"\nport = "eighty"\n')
    line = refused(capsys, "serve", "--config", str(conf))
    assert f"port in {conf} (--port): invalid int value: 'eighty'" in line
    line = refused(capsys, "serve", "--config", str(tmp_path / "none.toml"))
    assert "--config: cannot read" in line


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TABLECAST_SERVE_HTTP_ENGINE", "bogus", "invalid choice: 'bogus'"),
        ("TABLECAST_SERVE_PORT", "eighty", "invalid int value: 'eighty'"),
        ("TABLECAST_PORT", "eighty", "invalid int value: 'eighty'"),
        ("TABLECAST_SERVE_LISTENERS", "0", "(--listeners): 1 to 64, not 0"),
        ("TABLECAST_SERVE_RATE_LIMIT", "-1", "(--rate-limit) is a positive number"),
        ("TABLECAST_SERVE_AUTH_METRICS", "maybe", "'maybe' is neither on"),
    ],
)
def test_a_bad_variable_is_refused_like_the_flag_naming_it(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    value: str,
    says: str,
) -> None:
    monkeypatch.setenv(variable, value)
    line = refused(capsys, "serve", "--app", "a")
    assert line.startswith(f"tablecast: error: {variable} ") and says in line


def test_switch_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, on in (("1", True), ("TRUE", True), ("Yes", True), ("off", False), ("0", False)):
        monkeypatch.setenv("TABLECAST_KAFKA_SECURE", value)
        assert parsed(monkeypatch, "kafka", "status").secure is on, value
    monkeypatch.setenv("TABLECAST_KAFKA_SECURE", "")  # empty: as if unset
    assert parsed(monkeypatch, "kafka", "status").secure is False


def test_a_required_option_may_come_from_its_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    line = refused(capsys, "serve")
    assert "--app is required (or TABLECAST_SERVE_APP" in line
    monkeypatch.setenv("TABLECAST_SERVE_APP", "a")
    assert parsed(monkeypatch, "serve").app == "a"


def test_every_option_of_every_command_has_its_variable() -> None:
    parser = cli.build_parser()
    for name, sub in parser.commands.items():
        for opt in sub.options:
            assert f"TABLECAST_{name.upper()}_{opt.key}" in sub.variables(opt), (name, opt.flag)


#: read by library code rather than by an option, or set for the image build
NOT_OPTIONS = {"TABLECAST_CACHE_DIR", "TABLECAST_STATE_DIR", "TABLECAST_MASTER"}


def test_deploy_sets_only_variables_the_cli_reads() -> None:
    """A manifest or image that sets a variable no option reads configures nothing."""
    parser = cli.build_parser()
    read = {v for sub in parser.commands.values() for o in sub.options for v in sub.variables(o)}
    for path in (ROOT / "deploy").rglob("*"):
        if path.is_file():
            for name in re.findall(r"\bTABLECAST_[A-Z0-9_]+", path.read_text()):
                assert name in read | NOT_OPTIONS, f"{path.relative_to(ROOT)}: {name}"
