"""A node's Python objects on transparent huge pages.

A plain key read touches a few objects (its kept answer, the dict slot that finds
it, its bytes) scattered over hundreds of MiB of heap: on 4 KiB pages nearly every
one of them costs a TLB miss, which a virtual machine pays twice (its own page
table, then the host's). Most kernels back memory with huge pages only where the
process asks for them (transparent huge pages in ``madvise`` mode), and Python's
small-object arenas never ask. With ``PYTHONMALLOC=malloc`` every object comes from
glibc's heap, and glibc's ``hugetlb`` tunable makes it ask. Both are read when the
interpreter starts, so :func:`restart_on_huge_pages` starts the process again with
them set, once, before it has done anything.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from pathlib import Path

log = logging.getLogger(__name__)

#: the kernel's transparent huge page mode, e.g. ``always [madvise] never``
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
#: glibc's malloc asks for huge pages with this (glibc 2.35 and later)
TUNABLE = "glibc.malloc.hugetlb=1"
GLIBC_SINCE = (2, 35)


def asked(environ: dict[str, str] | os._Environ[str]) -> bool:
    """Whether this process's heap asks for huge pages (it was started as
    :func:`huge_page_environ` says)."""
    return environ.get("PYTHONMALLOC") == "malloc" and TUNABLE in environ.get("GLIBC_TUNABLES", "")


def needed(environ: dict[str, str] | os._Environ[str], mode: str | None = None) -> bool:
    """Whether starting again would put the heap on huge pages: the kernel gives them on
    request (``madvise``; under ``always`` they come anyway), glibc can ask, and neither
    the allocator nor the tunable was chosen already (which also ends the restart)."""
    if "PYTHONMALLOC" in environ or TUNABLE in environ.get("GLIBC_TUNABLES", ""):
        return False
    if mode is None:
        try:
            mode = THP_MODE.read_text()
        except OSError:  # not Linux, or no transparent huge pages
            return False
    if "[madvise]" not in mode:
        return False
    libc, version = platform.libc_ver()
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    return libc == "glibc" and parts >= GLIBC_SINCE


def huge_page_environ(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """`environ` with the allocator and tunable that put the heap on huge pages."""
    tunables = [t for t in (environ.get("GLIBC_TUNABLES"), TUNABLE) if t]
    return {**environ, "PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": ":".join(tunables)}


def restart_on_huge_pages() -> None:
    """Replace this process with the same command on huge pages, when that helps (same
    pid: whoever started it still holds it); return when it does not."""
    if not sys.executable or not needed(os.environ):
        return  # an embedded interpreter has no command to run again
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(
            sys.executable, [sys.executable, *sys.orig_argv[1:]], huge_page_environ(os.environ)
        )
    except OSError as e:  # the interpreter cannot be run again: go on as it is
        log.warning("not restarted on huge pages: %s", e)
