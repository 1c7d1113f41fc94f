"""Maven keeps the user's settings (their mirror wins; Maven Central only where they name
none), and each jar fetch says which set it fetches and, at the end, how many jars of what
size, on stderr whatever logging is set up (``./run setup`` sets up none).

No JVM runs here: ``mvn`` is a script that records its arguments and writes two jars."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tablecast import jvm

ROOT = Path(__file__).resolve().parents[2]

FAKE_MVN = """#!/bin/sh
echo "$@" > "$(dirname "$0")/args"
for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done
if [ -n "$FAKE_MVN_FAIL" ]; then echo "[ERROR] Could not resolve dependencies: refused"; exit 1; fi
mkdir -p "$out"
head -c 1500000 /dev/zero > "$out/kafka_2.13-4.0.0.jar"
head -c 500000 /dev/zero > "$out/kafka-clients-4.0.0.jar"
"""

MIRROR = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors><mirror><id>corp</id><mirrorOf>*</mirrorOf><url>https://repo.corp/m2</url></mirror>
  </mirrors>
</settings>
"""

PROXY_ONLY = """<?xml version="1.0"?>
<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <proxies><proxy><id>corp-proxy</id><host>proxy.corp</host><port>3128</port></proxy></proxies>
</settings>
"""


def fake_mvn(tmp: Path) -> Path:
    bin_dir = tmp / "maven" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "mvn").write_text(FAKE_MVN)
    (bin_dir / "mvn").chmod(0o755)
    return bin_dir


def user_settings(tmp: Path, text: str) -> Path:
    path = tmp / "home" / ".m2" / "settings.xml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


SETUP = ["-c", "from tablecast import jvm; jvm.jar_dir('kafka-broker')"]  # as ./run setup


def setup_jars(tmp: Path, argv: list[str] = SETUP, **env: str) -> tuple[int, list[str], list[str]]:
    """Fetch the broker's jars: (exit code, the stderr lines, the arguments mvn got)."""
    bin_dir = fake_mvn(tmp)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TABLECAST_", "MAVEN_"))}
    base.update(
        HOME=str(tmp / "home"),
        TABLECAST_CACHE_DIR=str(tmp / "cache"),
        PATH=f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin",
        PYTHONPATH=str(ROOT),
        **env,
    )
    done = subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=base,
    )
    args = (bin_dir / "args").read_text().split() if (bin_dir / "args").exists() else []
    return done.returncode, done.stderr.splitlines(), args


def test_a_fetch_says_which_set_and_how_many_jars_of_what_size(tmp_path: Path) -> None:
    code, err, args = setup_jars(tmp_path)
    assert code == 0, err
    assert any("fetching the jars of kafka-broker (the Kafka broker)" in line for line in err)
    assert any("kafka-broker: 2 jars, 2.0 MB" in line for line in err), err
    # no settings of the user's: every lookup goes to Maven Central, as before
    assert args[args.index("-s") + 1] == str(jvm.POM_ROOT / "settings.xml")


def test_the_users_mirror_wins(tmp_path: Path) -> None:
    mine = user_settings(tmp_path, MIRROR)
    code, err, args = setup_jars(tmp_path)
    assert code == 0, err
    assert "-s" not in args and "--settings" not in args  # Maven reads theirs itself
    assert any(f"mirror 'corp' of your Maven settings ({mine})" in line for line in err)


def test_settings_without_a_mirror_are_kept_and_central_added(tmp_path: Path) -> None:
    user_settings(tmp_path, PROXY_ONLY)
    code, err, args = setup_jars(tmp_path)
    assert code == 0, err
    merged = Path(args[args.index("-s") + 1])
    text = merged.read_text()
    assert "proxy.corp" in text and "https://repo.maven.apache.org/maven2" in text
    assert merged.is_relative_to(tmp_path / "cache")


def test_settings_named_in_maven_args_are_left_to_maven(tmp_path: Path) -> None:
    code, _, args = setup_jars(tmp_path, MAVEN_ARGS="-s /etc/corp/settings.xml")
    assert code == 0 and "-s" not in args


def test_a_failed_fetch_is_one_line(tmp_path: Path) -> None:
    argv = ["-m", "tablecast.jvm", "kafka-broker"]  # as the pipeline's image runs it
    code, err, _ = setup_jars(tmp_path, argv, FAKE_MVN_FAIL="1")
    assert code == 1
    errors = [line for line in err if line.startswith("tablecast: error: ")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    assert (
        "Maven could not fetch the jars of kafka-broker (mvn exit 1): Could not resolve"
        in (errors[0])
    )
    assert "kafka-broker.mvn.log" in errors[0]


def installed_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str
) -> tuple[list[str], str, Path]:
    """`jvm.maven_settings` alone, for a settings file Maven's installation holds (conf/
    beside bin/) and no user settings: its arguments, its source, and the file."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TABLECAST_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MAVEN_ARGS", raising=False)
    mvn = fake_mvn(tmp_path) / "mvn"
    installed = tmp_path / "maven" / "conf" / "settings.xml"
    installed.parent.mkdir()
    installed.write_text(text)
    return *jvm.maven_settings(str(mvn)), installed


def test_maven_settings_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args, source, installed = installed_settings(tmp_path, monkeypatch, MIRROR)
    assert args == [] and "mirror 'corp'" in source and str(installed) in source


#: Maven's own conf/settings.xml: one blocked mirror, which refuses plain-HTTP repositories
HTTP_BLOCKER = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors><mirror><id>maven-default-http-blocker</id><mirrorOf>external:http:*</mirrorOf>
    <url>http://0.0.0.0/</url><blocked>true</blocked></mirror></mirrors>
</settings>
"""


def test_a_blocked_mirror_is_not_the_users_choice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args, source, _ = installed_settings(tmp_path, monkeypatch, HTTP_BLOCKER)
    assert args == ["-s", str(jvm.POM_ROOT / "settings.xml")] and source == "Maven Central"
