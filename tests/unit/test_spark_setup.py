"""Running on a cluster: checkpoint locations as URIs, the package zip executors import,
the driver's address, and the spark-submit driver file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tablecast.pipeline.app import App
from tablecast.pipeline.run import spark as spark_setup
from tablecast.pipeline.run.layout import local_path


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TABLECAST_CHECKPOINT_DIR", "TABLECAST_STATE_DIR", "PYSPARK_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_checkpoints_go_under_a_uri_untouched_or_under_the_state_dir(tmp_path: Path) -> None:
    assert App("shop", checkpoint_dir="hdfs://nn:8020/tc/").resolve_checkpoint_dir() == (
        "hdfs://nn:8020/tc/shop"
    )
    assert App("shop", checkpoint_dir="file:///shared/ck").resolve_checkpoint_dir() == (
        "file:///shared/ck/shop"
    )
    assert App("shop", state_dir=tmp_path).resolve_checkpoint_dir() == str(
        tmp_path / "shop" / "checkpoints"
    )


def test_checkpoint_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TABLECAST_CHECKPOINT_DIR", "s3a://bucket/ck")
    assert App("a").resolve_checkpoint_dir() == "s3a://bucket/ck/a"


def test_local_path_of_a_checkpoint_location() -> None:
    assert local_path("file:///shared/my%20ck/a") == Path("/shared/my ck/a")
    assert local_path("/var/tc/a") == Path("/var/tc/a")
    assert local_path("relative/dir") == Path("relative/dir")
    assert local_path("hdfs://nn:8020/tc/a") is None
    assert local_path("s3a://bucket/a") is None


def test_driver_address_is_loopback_unless_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TABLECAST_DRIVER_HOST", raising=False)
    monkeypatch.delenv("TABLECAST_DRIVER_BIND_ADDRESS", raising=False)
    assert spark_setup.driver_address(False) == {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    monkeypatch.setenv("TABLECAST_DRIVER_HOST", "10.1.2.3")
    monkeypatch.setenv("TABLECAST_DRIVER_BIND_ADDRESS", "0.0.0.0")
    assert spark_setup.driver_address(False) == {
        "spark.driver.host": "10.1.2.3",
        "spark.driver.bindAddress": "0.0.0.0",
    }
    # spark-submit's --conf settings stand
    assert spark_setup.driver_address(True) == {}


def test_the_package_zip_is_importable_and_holds_only_modules(tmp_path: Path) -> None:
    archive = spark_setup.package_zip(tmp_path)
    import zipfile

    names = zipfile.ZipFile(archive).namelist()
    assert "tablecast/__init__.py" in names and "tablecast/pipeline/compile/keyed.py" in names
    assert not [n for n in names if "_jvm" in n or "_examples" in n or "__pycache__" in n]
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import tablecast.pipeline.compile.keyed, "
        "tablecast; print(tablecast.__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(archive)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(archive)), done.stdout


def test_the_spark_submit_driver_file_is_found_and_shadows_nothing() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tablecast.submit"], capture_output=True, text=True, timeout=60
    )
    driver = Path(done.stdout.strip())
    assert driver.name == "driver.py" and driver.exists()
    # spark-submit runs it as a script: its directory comes first on sys.path
    beside = {p.stem for p in driver.parent.glob("*.py")} - {"driver", "__init__", "__main__"}
    assert not beside & set(sys.stdlib_module_names)
