"""Java is found through JAVA_HOME, then PATH, and must be 17 or newer; the pipeline needs
javac for its record-timestamp interceptor, with no fall-back to write time.

No JVM runs here: the commands run as child processes (the no-JVM guard of the fast
lane watches this process only) whose JAVA_HOME or PATH holds scripts named java and
javac that print a version and exit, and their Kafka is never reached."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tablecast import jvm
from tablecast.kafka.broker import free_port

ROOT = Path(__file__).resolve().parents[2]


def fake_jdk(root: Path, version: str, javac: bool = True) -> Path:
    """A directory laid out as a JDK (or, without javac, a JRE) whose programs only say
    their version, as the real ones do: java on stderr, javac on stdout."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    scripts = {"java": f"echo 'openjdk version \"{version}\" 2023-10-17' >&2"}
    if javac:
        scripts["javac"] = f"echo 'javac {version}'"
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return root


def failing_mvn(bin_dir: Path) -> None:
    """An mvn on PATH that fails as an unreachable repository does (reached only once the
    Java check passed)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    mvn = bin_dir / "mvn"
    mvn.write_text(
        "#!/bin/sh\necho '[ERROR] Could not transfer artifact: Connection refused'\nexit 1\n"
    )
    mvn.chmod(0o755)


def cli(tmp: Path, *argv: str, **env: str) -> tuple[int, list[str]]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TABLECAST_", "JAVA_"))}
    base.update(
        HOME=str(tmp / "home"),
        TABLECAST_CACHE_DIR=str(tmp / "cache"),
        PATH=str(tmp / "bin"),
        PYTHONPATH=str(ROOT),
    )
    base.update(env)
    done = subprocess.run(
        [sys.executable, "-m", "tablecast.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp,
        env=base,
    )
    return done.returncode, done.stderr.splitlines()


def error_line(lines: list[str]) -> str:
    errors = [line for line in lines if line.startswith("tablecast: error: ")]
    assert len(errors) == 1 and not any("Traceback" in line for line in lines), lines
    return errors[0]


def app_file(tmp: Path) -> str:
    path = tmp / "app.py"
    path.write_text("import tablecast as tc\n\napp = tc.App('java-check')\n")
    return str(path)


@pytest.mark.parametrize(
    ("said", "major"),
    [
        ('openjdk version "17.0.9" 2023-10-17', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('Picked up JAVA_TOOL_OPTIONS: -Xmx1g\njava version "1.8.0_392"', 8),
        ("javac 17.0.2", 17),
        ("command not found", None),
    ],
)
def test_major_version(said: str, major: int | None) -> None:
    assert jvm.major_version(said) == major


def test_an_old_java_in_java_home_is_one_line_naming_it(tmp_path: Path) -> None:
    old = fake_jdk(tmp_path / "jdk11", "11.0.21")
    fake_jdk(tmp_path / "path-jdk", "17.0.9")  # PATH's is new enough: JAVA_HOME comes first
    code, err = cli(
        tmp_path, "kafka", "start", "--port", str(free_port()), JAVA_HOME=str(old),
        PATH=str(tmp_path / "path-jdk" / "bin"),
    )  # fmt: skip
    assert code == 1
    line = error_line(err)
    assert f"{old}/bin/java" in line and "Java 11" in line and "Java 17 or newer" in line
    assert "openjdk-17-jdk-headless" in line


def test_an_old_java_on_path_is_one_line(tmp_path: Path) -> None:
    fake_jdk(tmp_path / "jdk8", "1.8.0_392")
    code, err = cli(
        tmp_path, "kafka", "start", "--port", str(free_port()), PATH=str(tmp_path / "jdk8" / "bin")
    )
    assert code == 1
    line = error_line(err)
    assert "Java 8" in line and "(from PATH)" in line


def test_no_java_at_all_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    code, err = cli(tmp_path, "kafka", "start", "--port", str(free_port()))
    assert code == 1
    assert "no java on PATH (and JAVA_HOME is not set)" in error_line(err)
    code, err = cli(
        tmp_path, "kafka", "start", "--port", str(free_port()), JAVA_HOME=str(tmp_path / "nowhere")
    )
    assert code == 1
    assert f"JAVA_HOME={tmp_path / 'nowhere'} has no bin/java" in error_line(err)


def test_java_home_wins_over_path(tmp_path: Path) -> None:
    """A Java 17 in JAVA_HOME passes though PATH's is 11: the broker then needs its jars,
    which Maven (failing here) would fetch."""
    new = fake_jdk(tmp_path / "jdk17", "17.0.9")
    fake_jdk(tmp_path / "jdk11", "11.0.21")
    failing_mvn(tmp_path / "jdk11" / "bin")
    code, err = cli(
        tmp_path, "kafka", "start", "--port", str(free_port()), "--data-dir", str(tmp_path / "k"),
        JAVA_HOME=str(new), PATH=str(tmp_path / "jdk11" / "bin"),
    )  # fmt: skip
    assert code == 1
    assert "Maven could not fetch the jars of kafka-broker" in error_line(err)


def test_the_pipeline_needs_javac(tmp_path: Path) -> None:
    jre = fake_jdk(tmp_path / "jre17", "17.0.9", javac=False)
    for argv in (
        ["run", app_file(tmp_path)],
        ["dev", app_file(tmp_path), "--port", str(free_port())],
    ):
        code, err = cli(tmp_path, *argv, "--bootstrap-servers", "127.0.0.1:1", JAVA_HOME=str(jre))
        assert code == 1, err
        line = error_line(err)
        assert "no bin/javac" in line and "record-timestamp interceptor" in line, line
        assert "openjdk-17-jdk-headless" in line


def test_no_silent_fall_back_to_write_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without javac the Spark jar set is refused rather than given without the interceptor
    (no process starts: the connector's jars are laid out as fetched already)."""
    monkeypatch.setenv("TABLECAST_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("JAVA_HOME", str(fake_jdk(tmp_path / "jre", "17.0.9", javac=False)))
    fetched = jvm._target("spark-kafka")
    fetched.mkdir(parents=True)
    (fetched / "kafka-clients-3.9.0.jar").write_bytes(b"")
    (fetched / ".complete").write_text("ok\n")
    assert not jvm.interceptor_compiled()
    with pytest.raises(jvm.JavaMissing, match="record-timestamp interceptor"):
        jvm.jars("spark-kafka")


CACHE = "-XX:ReservedCodeCacheSize=240m"


@pytest.mark.parametrize(
    ("given", "after"),
    [
        ("", f"-XX:TieredStopAtLevel=1 -XX:+UseSerialGC {CACHE}"),
        ("-Xmx2g", f"-Xmx2g -XX:TieredStopAtLevel=1 -XX:+UseSerialGC {CACHE}"),
        ("-XX:+UseG1GC", f"-XX:+UseG1GC -XX:TieredStopAtLevel=1 {CACHE}"),
        ("-XX:TieredStopAtLevel=4", f"-XX:TieredStopAtLevel=4 -XX:+UseSerialGC {CACHE}"),
        (
            "-XX:+UseZGC -XX:TieredStopAtLevel=4 -XX:ReservedCodeCacheSize=64m",
            "-XX:+UseZGC -XX:TieredStopAtLevel=4 -XX:ReservedCodeCacheSize=64m",
        ),
    ],
)
def test_dev_jvms_get_c1_and_the_serial_collector_unless_chosen(
    monkeypatch: pytest.MonkeyPatch, given: str, after: str
) -> None:
    monkeypatch.setenv("JDK_JAVA_OPTIONS", given)
    jvm.use_quick_jvm()
    assert os.environ["JDK_JAVA_OPTIONS"] == after
