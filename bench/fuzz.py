"""``python -m bench fuzz [--examples N] [--internal N]``: the fuzz tests, many times bigger.

Runs ``tests/integration/test_openapi_fuzz.py`` (schemathesis over every route
of the OpenAPI document with auth off, on, and on with a policy on two nodes,
hypothesis on the internal routes and — with the policy — on every read route
with the table's own keys, the raw-socket fuzzer) with N examples per operation
instead of the suite's 10 (and with auth on without a policy, which the suite leaves to
this), and writes the case counts and the outcome to
BENCHMARKS.md. With the policy, every answer is judged by the test's oracle:
a row the policy forbids in any answer fails the run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from bench import common

TEST = "tests/integration/test_openapi_fuzz.py"
#: auth off, auth on, auth with a policy: each runs every operation
AUTH_MODES = 3


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench fuzz")
    parser.add_argument("--examples", type=int, default=400, help="per operation (schemathesis)")
    parser.add_argument("--internal", type=int, default=2000, help="internal-route examples")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.internal = 10, 50
    env = {
        **os.environ,
        "TABLECAST_FUZZ_EXAMPLES": str(args.examples),
        "TABLECAST_FUZZ_INTERNAL_EXAMPLES": str(args.internal),
        "TABLECAST_LONG": "1",
    }
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider", "-rA"],
        cwd=common.ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - started
    summary = re.findall(r"\d+ (?:passed|failed|error)", done.stdout)
    from tablecast.http.openapi import document

    operations = sum(len(ops) for ops in document()["paths"].values())
    m = common.machine()
    result = {
        "examples_per_operation": args.examples,
        "operations": operations,
        "internal_examples": args.internal,
        "auth_modes": AUTH_MODES,
        "outcome": summary,
        "returncode": done.returncode,
        "seconds": round(took),
    }
    common.save("fuzz", result)
    verdict = (
        "0 server errors, 0 crashes, 0 forbidden rows shown"
        if done.returncode == 0
        else "**failures, see below**"
    )
    section = f"""## Fuzzing

`{common.command()}` — {common.facts_line(m)}

| what | cases |
|---|---|
| schemathesis, every operation of `/openapi.json` ({operations}), kv + window + Avro-keyed tables, 2 nodes | up to {args.examples} per operation × {AUTH_MODES} auth modes (off, on, on with `--auth-policy`) |
| hypothesis, internal routes (scan, count) | {args.internal} × {AUTH_MODES} auth modes |
| hypothesis, every read route with the table's own keys, prefixes and bounds, under the policy | {args.internal} |
| raw-socket cases (malformed request lines, huge headers, bad encodings, pipelining, half-sent) | 11 × {AUTH_MODES} |

With the policy on, every answer (schemathesis' and hypothesis') is judged by the
oracle in `tests/integration/policy_oracle.py`: a row, table or count the token's
grants do not cover fails the run.

Outcome: {", ".join(summary)} in {took:.0f} s — {verdict}.
"""
    common.pytest_section("fuzz", section, done)
