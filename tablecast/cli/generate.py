"""Runs the ``generate(bootstrap_servers)`` function of an App file (demo data)."""

from __future__ import annotations

import argparse
import contextlib
import logging

from tablecast.cli.appfile import load_module, stop_on_sigterm


def main() -> None:
    parser = argparse.ArgumentParser(prog="tablecast-generate")
    parser.add_argument("app_file")
    parser.add_argument("--bootstrap-servers", default="localhost:9092")
    args = parser.parse_args()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    generate = load_module(args.app_file).get("generate")
    if generate is None:
        raise SystemExit(f"tablecast: error: {args.app_file} has no generate(bootstrap_servers)")
    stop_on_sigterm()
    with contextlib.suppress(KeyboardInterrupt):
        generate(args.bootstrap_servers)


if __name__ == "__main__":
    main()
