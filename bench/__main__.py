"""``python -m bench NAME [options]``: run a benchmark, save bench/results/NAME.json, update BENCHMARKS.md.

``python -m bench all [--quick]`` runs every benchmark in turn, in one process;
``--quick`` runs each small, in a few minutes, and writes to bench/results/quick/
instead of BENCHMARKS.md and bench/plots/ (a test of the harness, not figures).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import time

BENCHES = {
    "serving": "bench.serving",
    "stores": "bench.stores",
    "cluster": "bench.cluster",
    "anchors": "bench.anchors",
    "spark_cluster": "bench.spark_cluster",
    "fuzz": "bench.fuzz",
    "long": "bench.long",
    "https": "bench.https",
    "auth": "bench.auth",
    "chaos": "bench.chaos",
    "watch": "bench.watch",
    "history": "bench.history",
    "console": "bench.console",
    "concurrency": "bench.concurrency",
    "cold": "bench.cold",
    "stream_count": "bench.stream_count",
    "redis_get": "bench.redis_get",
    "recovery": "bench.recovery",
    "checkpoints": "bench.checkpoints",
    "processes": "bench.processes",
    "builds": "bench.builds",
    "rolling": "bench.rolling",
    "grpc_get": "bench.grpc_get",
    "attach": "bench.attach",
    "streams_restore": "bench.streams_restore",
    "restore_floor": "bench.restore_floor",
    "unknown_partitioner": "bench.unknown_partitioner",
    "pg_get": "bench.pg_get",
    "pg_fuzz": "bench.pg_fuzz",
}
# the pipeline benchmark is written by another change; run it once its module exists
if importlib.util.find_spec("bench.pipeline") is not None:
    BENCHES["pipeline"] = "bench.pipeline"

# small options for `all --quick`; a module's own QUICK_ARGS wins, else it gets --quick
QUICK = {
    "serving": ["--seconds", "2", "--keys", "20000", "--ingest", "100000", "--restart", "100000"],
    "cluster": ["--seconds", "2", "--keys", "20000"],
    "stores": ["--keys", "20000", "--reads", "50000"],
    "https": ["--seconds", "2", "--keys", "20000", "--rounds", "3"],
    "auth": ["--seconds", "2", "--keys", "20000", "--rounds", "3"],
    "chaos": ["--minutes", "3"],
    "rolling": ["--nodes", "3", "--partitions", "6", "--keys", "2000"],
    "console": ["--rounds", "3", "--keys", "200"],
    "attach": ["--mb", "20", "--operations", "5000", "--rounds", "1"],
    "unknown_partitioner": ["--keys", "5000", "--seconds", "1", "--rounds", "3"],
    "pg_get": ["--keys", "5000", "--seconds", "2", "--rounds", "3"],
    "pg_fuzz": ["--cases", "300"],
}

log = logging.getLogger("bench")


def run_all(argv: list[str]) -> None:
    quick = "--quick" in argv
    if quick:
        from bench import common

        common.use_scratch_output()
    failed = []
    for name, module_name in BENCHES.items():
        module = importlib.import_module(module_name)
        args = getattr(module, "QUICK_ARGS", QUICK.get(name, ["--quick"])) if quick else []
        log.info("=== bench %s %s", name, " ".join(args))
        started = time.monotonic()
        try:
            module.main(args)
        except Exception:
            # one broken benchmark must not cost the others' figures
            log.exception("bench %s failed", name)
            failed.append(name)
        log.info("=== bench %s done in %.0f s", name, time.monotonic() - started)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


def main() -> None:
    # the processes a benchmark starts read each module's bytecode, written the first time one
    # imports it, as an installed package's are (./run does the same): with
    # PYTHONDONTWRITEBYTECODE set, every node start would compile tablecast again
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    names = [*BENCHES, "all"]
    if len(sys.argv) < 2 or sys.argv[1] not in names:
        raise SystemExit(f"usage: python -m bench {{{'|'.join(names)}}} [options]")
    if sys.argv[1] == "all":
        run_all(sys.argv[2:])
    else:
        importlib.import_module(BENCHES[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    main()
