"""``python -m bench NAME [options]``: run a benchmark, save bench/results/NAME.json, update BENCHMARKS.md."""

from __future__ import annotations

import importlib
import logging
import sys

BENCHES = {"serving": "bench.serving", "cluster": "bench.cluster"}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHES:
        raise SystemExit(f"usage: python -m bench {{{'|'.join(BENCHES)}}} [options]")
    importlib.import_module(BENCHES[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
