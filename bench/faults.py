"""``python -m bench faults``: the kill -9 tests too long for CI's time, with the suite's own.

Runs every test marked ``long`` (TABLECAST_LONG=1: kill -9 of the driver mid-stream for
stream-stream joins, session windows, cogroup and foreign-key joins) together with the
kill -9 tests `./run tests` keeps (grouped tables, transform_values, Real-time Mode),
and writes the outcome and each test's time to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from bench import common

TESTS = [
    "tests/integration/test_pipeline_restart.py",
    "tests/integration/test_pipeline_transform.py::test_transform_values_state_survives_kill_9_of_the_driver",
]

TIMES = ["--durations=0", "--durations-min=1"]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench faults")
    parser.add_argument("--quick", action="store_true", help="the suite's kill -9 tests only")
    args = parser.parse_args(argv)
    env = {**os.environ, "TABLECAST_LONG": "0" if args.quick else "1"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:cacheprovider", "-rA", *TIMES],
        cwd=common.ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - started
    summary = re.findall(r"\d+ (?:passed|failed|skipped|error)", done.stdout)
    times = re.findall(r"^([\d.]+)s call\s+\S+::(\w+)", done.stdout, re.M)
    outcome = {
        name: status
        for status, name in re.findall(r"^(PASSED|FAILED|ERROR) \S+::(\w+)", done.stdout, re.M)
    }
    result = {
        "outcome": summary,
        "returncode": done.returncode,
        "seconds": round(took),
        "tests": {name: float(s) for s, name in times},
        "long": not args.quick,
    }
    common.save("faults", result)
    rows = "\n".join(
        f"| `{name}` | {float(s):.0f} | {outcome.get(name, '?').lower()} |" for s, name in times
    )
    section = f"""## kill -9 of the driver, every operator

`{common.command()}` — {common.facts_line(common.machine())}

Each test runs the pipeline as its own process group, sends batches of thousands of
records, kills the group with SIGKILL twice (once while a query writes a batch out, once
at another moment), restarts it from its checkpoint and compares every table with the
reference model of Kafka Streams' semantics. `./run tests` keeps the grouped-table,
transform_values and Real-time Mode ones; the joins', sessions' and cogroup's (marked
`long`) run here only.

| test | seconds | outcome |
|---|---|---|
{rows}

Outcome: {", ".join(summary)} in {took:.0f} s.
"""
    if done.returncode != 0:
        section += "\n```\n" + done.stdout[-3000:] + "\n```\n"
    common.write_section("faults", section)
    print(section)
    if done.returncode != 0:
        raise SystemExit(done.returncode)
