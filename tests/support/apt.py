"""Debian packages the tests need beyond Python's (chromium, libfaketime), installed on first
use with apt-get when the tests run as root, as on a fresh CI machine."""

from __future__ import annotations

import os
import subprocess
import sys


def apt_install(package: str) -> str | None:
    """Install `package`; None when done, else why not (not root, or apt-get's error)."""
    if os.geteuid() != 0:
        return f"{package} is missing and only root may install it (apt-get install {package})"
    print(f"[tests] installing Debian's {package} (once) ...", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-q", package]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:  # a stale package index: refresh it once
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
        done = subprocess.run(command, env=env, capture_output=True, text=True)
    return None if done.returncode == 0 else done.stderr[-2000:]


#: libfaketime's thread-safe build, which the clock-skew tests preload into a node
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"


def faketime() -> str | None:
    """libfaketime's path, installed first if it is missing and we may; None if unavailable."""
    if not os.path.exists(FAKETIME_LIB):
        apt_install("libfaketime")
    return FAKETIME_LIB if os.path.exists(FAKETIME_LIB) else None
