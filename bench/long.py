"""``python -m bench long``: every test marked ``long``, in one command.

They are the runs too long for CI's time: the kill -9 tests of the driver for every
operator the suite does not kill itself (stream-stream and foreign-key joins, session
windows, cogroup, transform_values, Real-time Mode, the secured broker),
the five-minute chaos soak, the generated-records tests on Spark of the joins and cogroup
(fixed steps on Spark and unit tests against the reference model stay in CI), and the checks
that the benchmark's Kafka Streams peers answer exactly the data loaded (a Maven build and
six JVMs), Debezium's events through its Avro converter and a registry (CI keeps its JSON
events and the registry formats), and ``tablecast dev`` stopped by SIGTERM (CI stops it
with a background SIGINT, which runs the same handler) or killed by SIGKILL. ``./run tests`` skips them
(``TABLECAST_LONG=1`` makes pytest run them); this writes the outcome and each test's
time to BENCHMARKS.md.
``--quick`` only collects them (a test of the harness).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from bench import common

# as ./run tests: two workers, whole modules each
WORKERS = ["-n", os.environ.get("TABLECAST_TEST_WORKERS", "2"), "--dist", "loadscope"]
TIMES = ["--durations=0", "--durations-min=1"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench long")
    parser.add_argument("--quick", action="store_true", help="collect the tests, run none")
    args = parser.parse_args(argv)
    env = {**os.environ, "TABLECAST_LONG": "1"}
    quick = ["--collect-only"] if args.quick else []
    started = time.monotonic()
    pytest = [sys.executable, "-m", "pytest", "tests", "-m", "long", "-q", "-rA"]
    done = subprocess.run(
        [*pytest, *quick, *WORKERS, "-p", "no:cacheprovider", *TIMES],
        cwd=common.ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - started
    # pytest's last line ("9 passed, 1 failed in 857.12s"): the tests' own output may hold
    # the same words
    last = next((ln for ln in reversed(done.stdout.splitlines()) if " in " in ln), "")
    summary = re.findall(r"\d+ (?:passed|failed|skipped|errors?)", last)
    # a test's name with its parameters ("test_x[jdk]"): each parametrization is a row
    name = r"(\w+(?:\[[^\]\s]*\])?)"
    times = re.findall(rf"^([\d.]+)s call\s+\S+::{name}", done.stdout, re.M)
    outcome = {
        test: status
        for status, test in re.findall(rf"^(PASSED|FAILED|ERROR) \S+::{name}", done.stdout, re.M)
    }
    result = {
        "outcome": summary,
        "returncode": done.returncode,
        "seconds": round(took),
        "tests": {test: float(s) for s, test in times},
        "long": not args.quick,
    }
    common.save("long", result)
    rows = "\n".join(
        f"| `{test}` | {float(s):.0f} | {outcome.get(test, '?').lower()} |" for s, test in times
    )
    section = f"""## The long tests: kill -9 of every operator, the five-minute soak

`{common.command()}` — {common.facts_line(common.machine())}

The tests marked `long`, which `./run tests` skips for CI's time. Each kill -9 test runs
the pipeline as its own process group, sends batches of thousands of
records, kills it with SIGKILL twice (once while a query writes a batch out, once at
another moment), restarts it from its checkpoint and compares every
table with the reference model of Kafka Streams' semantics. `./run tests` keeps one: the
grouped tables' (`test_kill_9_of_the_driver_leaves_every_table_exact`, killed once, while a
query writes a batch out; twice here), and no chaos soak: the five-minute one, with every
fault at least once, runs here. The checks that the benchmark's Kafka Streams peers
answer exactly the data loaded (a Maven build, two instances per HTTP server) run here too,
and so do the generated-records tests on Spark of the joins and cogroup (`*_match_kafka_streams*`
below); `./run tests` keeps each one's test of fixed steps on Spark and the unit tests
that hold its per-key logic to the reference model. `tablecast dev` stopped by SIGTERM
runs here; `./run tests` stops it with a background SIGINT, which runs the same handler.

| test | seconds | outcome |
|---|---|---|
{rows}

Outcome: {", ".join(summary)} in {took:.0f} s.
"""
    common.pytest_section("long", section, done)
