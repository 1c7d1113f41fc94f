"""A node's heap on transparent huge pages: when the node restarts itself for them, and
that the restart really gives the new interpreter the allocator and tunable."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from tablecast.node import huge_pages
from tablecast.node.huge_pages import TUNABLE, asked, huge_page_environ, needed

MADVISE = "always [madvise] never\n"


def _glibc_can_ask() -> bool:
    libc, version = platform.libc_ver()
    return libc == "glibc" and tuple(int(p) for p in version.split(".")[:2]) >= (2, 35)


def _clean_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONMALLOC", "GLIBC_TUNABLES")}


@pytest.mark.skipif(not _glibc_can_ask(), reason="glibc before 2.35 cannot ask for huge pages")
def test_a_kernel_that_gives_huge_pages_on_request_is_asked() -> None:
    assert needed({}, MADVISE)


@pytest.mark.parametrize("mode", ["[always] madvise never\n", "always madvise [never]\n"])
def test_no_restart_where_asking_changes_nothing(mode: str) -> None:
    """Under ``always`` the heap gets huge pages anyway; under ``never`` it cannot."""
    assert not needed({}, mode)


@pytest.mark.parametrize(
    "environ",
    [
        {"PYTHONMALLOC": "pymalloc"},  # the operator chose an allocator
        {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{TUNABLE}"},  # or the tunable
        {"PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": TUNABLE},  # already restarted
    ],
)
def test_no_restart_when_the_environment_already_chose(environ: dict[str, str]) -> None:
    assert not needed(environ, MADVISE)


def test_the_tunable_joins_the_operators_own() -> None:
    env = huge_page_environ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/h"})
    assert env == {
        "GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{TUNABLE}",
        "PYTHONMALLOC": "malloc",
        "HOME": "/h",
    }
    assert asked(env) and not asked({"PYTHONMALLOC": "malloc"})


def _host_restarts() -> bool:
    return needed(_clean_environ())


@pytest.mark.skipif(not _host_restarts(), reason="this host would not restart for huge pages")
def test_the_restart_runs_the_same_command_again_with_the_heap_asking() -> None:
    """The same pid runs the same command again, now with pymalloc off and the tunable on."""
    code = (
        "import os, sys\n"
        "from tablecast.node.huge_pages import restart_on_huge_pages\n"
        "print('start', os.getpid(), flush=True)\n"
        "restart_on_huge_pages()\n"
        "print('after', os.getpid(), os.environ.get('PYTHONMALLOC'), sys.argv[1:])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "an-argument"],
        env=_clean_environ(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(huge_pages.__file__).parents[2],
        check=True,
    ).stdout.split("\n")
    first, second, after = out[0], out[1], out[2]
    assert first.startswith("start ") and second == first  # ran twice, as one process
    assert after == f"after {first.split()[1]} malloc ['an-argument']"


@pytest.mark.skipif(not _host_restarts(), reason="this host would not restart for huge pages")
def test_an_interpreter_that_cannot_run_again_goes_on_as_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    huge_pages.restart_on_huge_pages()  # returns: no exec happened, no error raised
    assert "not restarted on huge pages" in caplog.text
