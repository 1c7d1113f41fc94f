"""``--help`` shows every option's default (or that it is required) and its variables."""

from __future__ import annotations

import re

import pytest

from tablecast.cli import main as cli


def help_of(capsys: pytest.CaptureFixture[str], *command: str) -> str:
    assert cli.main([*command, "--help"]) == 0
    # argparse wraps at the terminal's width: undo it, so a phrase is on one line
    return re.sub(r"\s+", " ", capsys.readouterr().out)


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


def test_serve_shows_defaults_and_variables(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(capsys, "serve")
    assert "(default: 8080; env TABLECAST_SERVE_PORT or TABLECAST_PORT)" in text
    assert "(default: 64; env TABLECAST_SERVE_CACHE_MB)" in text
    assert "(required; env TABLECAST_SERVE_APP)" in text
    assert "(default: loop; env TABLECAST_SERVE_HTTP_ENGINE)" in text
    assert "env TABLECAST_SERVE_CLUSTER_SECRET or TABLECAST_CLUSTER_SECRET" in text
    assert "(default: off; env TABLECAST_SERVE_AUTH_METRICS)" in text


def test_kafka_shows_its_own_port_variables(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(capsys, "kafka")
    assert "(default: 9092; env TABLECAST_KAFKA_<ACTION>_PORT or TABLECAST_KAFKA_PORT)" in text
    assert "TABLECAST_PORT)" not in text  # the HTTP port's variable is not the broker's


def test_every_option_of_every_command_shows_its_default_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = cli.build_parser()
    for name, sub in parser.commands.items():
        text = help_of(capsys, name)
        flags = {o.flag for o in sub.options}
        for action in sub._actions:
            if not set(action.option_strings) & flags:
                continue
            said = re.sub(r"\s+", " ", (action.help or "").replace("%%", "%"))
            # argparse also breaks lines after hyphens: compare without any whitespace
            assert re.sub(r"\s", "", said) in re.sub(r"\s", "", text), (name, action.option_strings)
            assert re.search(
                rf"\((default: [^;]+|required); env TABLECAST_{name.upper()}_[^)]*\)$", said
            ), (name, action.option_strings, said)
