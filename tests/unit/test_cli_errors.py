"""Every failure of the command line is one line, ``tablecast: error: <message>``, with no
traceback unless -v (before or after the command): exit 2 for a wrong command line, 1 for
a failure at run time, 130 for Ctrl-C. Run through the real entry point."""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import tablecast
from tablecast.cli import main as cli
from tablecast.kafka import config as kafka_config


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No TABLECAST_ option variable of the machine or of another test reaches these."""
    saved = dict(os.environ)
    for name in list(os.environ):
        if name.startswith("TABLECAST_") and name != "TABLECAST_NO_JVM":
            monkeypatch.delenv(name)
    monkeypatch.setattr(kafka_config, "_current", kafka_config._current)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err.splitlines()


def one_line(lines: list[str]) -> str:
    assert len(lines) == 1, lines
    assert lines[0].startswith("tablecast: error: "), lines
    return lines[0]


def _app_file(tmp_path: Path, body: str) -> str:
    path = tmp_path / "app.py"
    path.write_text(body)
    return str(path)


def test_a_missing_app_file_is_one_line_and_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = run(capsys, "explain", str(tmp_path / "missing.py"))
    assert code == 2
    assert "missing.py: no such file" in one_line(err)


def test_an_app_file_without_an_app_is_one_line_at_run_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = run(capsys, "explain", _app_file(tmp_path, "x = 1\n"))
    assert code == 1
    assert "expected exactly one tablecast.App, found 0" in one_line(err)


def test_an_app_file_that_raises_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = run(capsys, "explain", _app_file(tmp_path, "raise KeyError('nope')\n"))
    assert code == 1
    assert "failed while loading: KeyError" in one_line(err)


def test_a_missing_secret_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "secret")
    code, err = run(capsys, "serve", "--app", "a", "--auth-jwt-secret-file", missing)
    assert code == 2
    assert f"--auth-jwt-secret-file: cannot read {missing}" in one_line(err)
    code, err = run(capsys, "serve", "--app", "a", "--cluster-secret-file", missing)
    assert code == 2
    assert f"--cluster-secret-file: cannot read {missing}" in one_line(err)


def test_argparse_errors_are_one_line_not_the_usage_block(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for argv in (
        ["serve", "--app", "a", "--bogus"],
        ["kafka", "bogus"],
        ["query", "table-only"],
        [],
    ):
        code, err = run(capsys, *argv)
        assert code == 2, argv
        line = one_line(err)
        assert "usage:" not in line


def test_an_invalid_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(capsys, "serve", "--app", "a", "--port", "eighty")
    assert code == 2 and "--port: invalid int value: 'eighty'" in one_line(err)
    code, err = run(capsys, "serve", "--app", "a", "--listeners", "0")
    assert code == 2 and "--listeners: 1 to 64, not 0" in one_line(err)
    code, err = run(capsys, "serve", "--app", "a", "--rate-limit", "0")
    assert code == 2 and "--rate-limit is a positive number" in one_line(err)
    code, err = run(capsys, "serve", "--app", "a", "--tls-cert", "c.pem")
    assert code == 2 and "--tls-cert: cannot read c.pem" in one_line(err)


def test_options_that_do_not_go_together_are_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cert = tmp_path / "c.pem"
    cert.write_text("")
    code, err = run(capsys, "serve", "--app", "a", "--tls-cert", str(cert))
    assert code == 2 and "--tls-cert and --tls-key go together" in one_line(err)
    code, err = run(capsys, "serve", "--app", "a", "--auth-metrics")
    assert code == 2 and "--auth-metrics needs" in one_line(err)


def test_verbose_before_or_after_the_command_shows_the_traceback(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "secret")
    for argv in (
        ["-v", "serve", "--app", "a", "--auth-jwt-secret-file", missing],
        ["serve", "-v", "--app", "a", "--auth-jwt-secret-file", missing],
        ["serve", "--app", "a", "--auth-jwt-secret-file", missing, "--verbose"],
    ):
        code, err = run(capsys, *argv)
        assert code == 2, argv
        assert err[0].startswith("Traceback"), err
        assert err[-1].startswith("tablecast: error: ") and "cannot read" in err[-1]


def test_kafka_unreachable_is_a_failure_at_run_time(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from tablecast.kafka import probe

    def unreachable(bootstrap_servers: str, timeout: float = 0) -> None:
        raise probe.KafkaUnavailable(f"cannot reach Kafka at {bootstrap_servers}: no answer")

    monkeypatch.setattr(probe, "check", unreachable)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["serve", "--app", "a", "--port", str(port), "--data-dir", str(tmp_path / "n")]
    code, err = run(capsys, *argv)
    assert code == 1
    assert "cannot reach Kafka at localhost:9092" in one_line(err)


def test_a_node_that_cannot_be_reached_is_a_failure_at_run_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err = run(capsys, "tables", "--url", "http://127.0.0.1:1")
    assert code == 1
    assert "cannot reach http://127.0.0.1:1" in one_line(err)


@pytest.mark.parametrize(
    ("raised", "code", "says"),
    [
        (RuntimeError("the Kafka broker exited during start"), 1, "the Kafka broker exited"),
        (KeyError("x"), 1, "KeyError: 'x' (-v shows where)"),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), 1, "/x/y: No such file"),
        (SystemExit("tablecast: error: a child said so"), 1, "error: a child said so"),
        (RuntimeError("first line\nsecond line"), 1, "error: first line"),
    ],
)
def test_main_turns_any_exception_into_the_one_line(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    raised: BaseException,
    code: int,
    says: str,
) -> None:
    def handler(args: object) -> int:
        raise raised

    monkeypatch.setitem(cli._COMMANDS, "tables", handler)
    got, err = run(capsys, "tables")
    assert got == code
    line = one_line(err)
    assert says in line and "second line" not in line


def test_ctrl_c_is_130_without_a_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def handler(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli._COMMANDS, "tables", handler)
    assert run(capsys, "tables") == (130, [])


def test_help_and_version_still_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--version"]) == 0
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert capsys.readouterr().out.split() == ["tablecast", pyproject["project"]["version"]]
    assert tablecast.__version__ == pyproject["project"]["version"]
    assert cli.main(["serve", "--help"]) == 0
    assert "usage: tablecast serve" in capsys.readouterr().out
