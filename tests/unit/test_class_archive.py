"""A JVM's class-data archive is kept once, whole, and only when none is kept yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tablecast import jvm


@pytest.fixture
def archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    kept = tmp_path / "cache" / "class-archives" / "abc.jsa"
    monkeypatch.setattr(jvm, "class_archive", lambda classpath: kept)
    return kept


def test_a_jvm_writes_the_archive_while_none_is_kept_and_maps_it_after(
    archive: Path, tmp_path: Path
) -> None:
    dumped = tmp_path / "broker" / "classes.jsa"
    assert jvm.class_archive_options("a.jar") == []
    assert jvm.class_archive_options("a.jar", dump_to=dumped) == [
        f"-XX:ArchiveClassesAtExit={dumped}"
    ]
    dumped.parent.mkdir()
    dumped.write_bytes(b"first")
    jvm.keep_class_archive("a.jar", dumped)
    assert archive.read_bytes() == b"first"
    assert not dumped.exists()
    assert list(archive.parent.iterdir()) == [archive]  # no partial copy left behind
    options = [f"-XX:SharedArchiveFile={archive}"]
    assert jvm.class_archive_options("a.jar", dump_to=dumped) == options


def test_the_archive_kept_first_stays_and_later_ones_are_dropped(
    archive: Path, tmp_path: Path
) -> None:
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"first")
    dumped = tmp_path / "classes.jsa"
    dumped.write_bytes(b"second")
    jvm.keep_class_archive("a.jar", dumped)
    assert archive.read_bytes() == b"first"
    assert not dumped.exists()
    jvm.keep_class_archive("a.jar", dumped)  # a JVM killed before writing one: nothing to do
    assert archive.read_bytes() == b"first"
