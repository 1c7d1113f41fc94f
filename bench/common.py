"""What every benchmark shares: machine facts, pinned processes, wrk, and BENCHMARKS.md sections.

On this 2-core machine the server runs on core 0 and the load generator on
core 1 (``taskset``), and figures are compared as ratios within one run,
because runs differ by up to ~50% from one another.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BENCHMARKS = ROOT / "BENCHMARKS.md"
PLOTS = ROOT / "bench" / "plots"
OUT = RESULTS  # where save() writes raw results
SERVER_CPU = "0"
LOAD_CPU = "1"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "python": platform.python_version(),
    }


def pinned(cpus: str | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def wrk(
    url: str,
    script: str | None,
    seconds: int,
    connections: int = 64,
    rate_note: str = "",
    threads: int = 1,
) -> dict[str, Any]:
    """Run wrk on the load core; return req/s and latency percentiles (µs).

    More `threads` only help when the script's ``setup`` points each thread at
    another server (``thread.addr``): they all share the load core.
    """
    ensure_tools({"wrk": "wrk"})  # a fresh machine: Debian's wrk, once
    lua = _WRK_REPORT + (script or "")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(lua)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        done = subprocess.run(
            pinned(
                LOAD_CPU,
                [
                    "wrk",
                    f"-t{threads}",
                    f"-c{connections}",
                    f"-d{seconds}s",
                    "--latency",
                    "-s",
                    f.name,
                    url,
                ],
            ),
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        )
    finally:
        os.unlink(f.name)
    line = next((x for x in done.stdout.splitlines() if x.startswith("{")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed: {done.stdout}\n{done.stderr}")
    r = orjson.loads(line)
    r["rps"] = r["requests"] / (r["duration_us"] / 1e6)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # taskset execs wrk: wrk's own
    r["load_cpu_s"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return r


_WRK_REPORT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "p999_us": %d, "errors": %d, "non2xx": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency:percentile(99.9), e.connect + e.read + e.write + e.timeout,
    e.status))
end
"""


def random_key_script(
    path_prefix: str,
    keys: int,
    width: int = 7,
    key_prefix: str = "k",
    headers: dict[str, str] | None = None,
) -> str:
    """A wrk request function asking for uniformly random keys k0000000..k{keys-1}
    (or ``key:000000000000``.. with ``width=12, key_prefix="key:"``, Redis' names),
    each request with `headers` (e.g. a bearer token)."""
    extra = ""
    if headers:
        fields = ", ".join(f'["{k}"] = "{v}"' for k, v in headers.items())
        extra = f", {{{fields}}}"
    return f"""
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "{path_prefix}{key_prefix}" .. string.format("%0{width}d", math.random(0, {keys - 1})){extra})
end
"""


def du_bytes(path: Path) -> int:
    """The bytes of every file under `path`."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def du_mib(path: Path) -> float:
    return du_bytes(path) / 2**20


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def with_cpu(run: Any, *args: Any, pids: tuple[int, ...]) -> dict[str, Any]:
    """A wrk run plus the CPU each node process spent per request during it (µs).

    CPU per request is what another process on the server core cannot move much,
    where req/s drops with every time slice it takes: the steadier cost figure."""
    before = [cpu_seconds(p) for p in pids]
    result = run(*args)
    spent = [cpu_seconds(p) - b for p, b in zip(pids, before, strict=True)]
    result["cpu_us_per_request"] = [s / max(result["requests"], 1) * 1e6 for s in spent]
    return result


def wait_http(url: str, timeout: float = 120.0, proc: subprocess.Popen | None = None) -> float:
    """Seconds until `url` answers 200."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        if answers_200(url):
            return time.monotonic() - started
        time.sleep(0.05)
    raise TimeoutError(url)


def answers_200(url: str) -> bool:
    """Whether `url` answers 200 now (no answer: False)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def ensure_tools(packages: dict[str, str]) -> None:
    """Install the Debian package of each missing tool (``{"hey": "hey"}``), as root with apt-get;
    otherwise fail saying what to install, so that one command runs on a fresh machine."""
    missing = sorted({pkg for tool, pkg in packages.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SystemExit(f"missing tools; run: apt-get install -y {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", *missing], check=True, capture_output=True, env=env
    )


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def add_quick(parser: argparse.ArgumentParser) -> None:
    """The --quick option every benchmark takes (apply it with :func:`quick`)."""
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small, in a few minutes; writes to bench/results/quick/, not BENCHMARKS.md",
    )


def quick(args: argparse.Namespace) -> bool:
    """Whether this is a --quick run; its sections and plots then go to the scratch output."""
    if args.quick:
        use_scratch_output()
    return bool(args.quick)


def use_scratch_output() -> None:
    """Send BENCHMARKS.md sections and plots of this run to bench/results/quick/.

    Quick runs test the harness; they must not overwrite the committed figures.
    """
    global BENCHMARKS, PLOTS, OUT
    scratch = RESULTS / "quick"
    if scratch == OUT:
        return  # already (bench all --quick, then each bench's own --quick)
    scratch.mkdir(parents=True, exist_ok=True)
    # a copy of the real file, so the quick sections land among the others as they would
    if BENCHMARKS.exists():
        (scratch / "BENCHMARKS.md").write_text(BENCHMARKS.read_text())
    BENCHMARKS, PLOTS, OUT = scratch / "BENCHMARKS.md", scratch / "plots", scratch


def save(name: str, result: dict[str, Any]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return path


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) the section between this benchmark's markers in BENCHMARKS.md."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: block, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + block + "\n"
    )
    BENCHMARKS.write_text(text)


def pytest_section(name: str, markdown: str, done: subprocess.CompletedProcess[str]) -> None:
    """Put the section of a benchmark that is a pytest run into BENCHMARKS.md (with the end
    of pytest's output when it failed), print it, and exit with pytest's code on failure."""
    if done.returncode != 0:
        markdown += "\n```\n" + done.stdout[-3000:] + "\n```\n"
    write_section(name, markdown)
    print(markdown)
    if done.returncode != 0:
        raise SystemExit(done.returncode)


def publish(name: str, result: dict[str, Any], markdown: str) -> None:
    """Save a run's results, put its section into BENCHMARKS.md, and print the section."""
    save(name, result)
    write_section(name, markdown)
    print(markdown)


def command() -> str:
    return "python -m bench " + " ".join(sys.argv[1:])


def facts_line(m: dict[str, Any]) -> str:
    return (
        f"{m['date']}; {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python {m['python']}"
    )


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The middle run by req/s (of alternating runs, to damp this machine's noise)."""
    return sorted(runs, key=lambda r: r["rps"])[len(runs) // 2]


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"


def rounds_args(bench: str, argv: list[str]) -> argparse.Namespace:
    """The options of a benchmark of alternating pinned rounds: run length, table size, rounds."""
    p = argparse.ArgumentParser(prog=f"python -m bench {bench}")
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--keys", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=7)
    return p.parse_args(argv)


def ratio_spread(ratios: list[float]) -> dict[str, Any]:
    """Per-round ratios of alternating runs, with their median and interquartile range."""
    if len(ratios) < 2:  # one round: no spread to speak of
        return {"ratios": ratios, "ratio_median": ratios[0], "ratio_iqr": [ratios[0], ratios[0]]}
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return {"ratios": ratios, "ratio_median": statistics.median(ratios), "ratio_iqr": [q1, q3]}


def settled(iqr: list[float], target: float) -> str:
    """A ratio target is "met" only when the whole interquartile range clears it."""
    lo, hi = iqr
    return "met" if lo >= target else ("**missed**" if hi < target else "not settled")


def settled_below(iqr: list[float], target: float) -> str:
    """A ceiling is "met" only when the whole interquartile range stays at or under it."""
    lo, hi = iqr
    return "met" if hi <= target else ("**missed**" if lo > target else "not settled")


def rps_row(name: str, run: dict[str, Any]) -> str:
    """A Markdown table row: req/s, p50 and p99 in ms of one wrk run."""
    return (
        f"| {name} | {run['rps']:,.0f} | {run['p50_us'] / 1000:.2f} | {run['p99_us'] / 1000:.2f} |"
    )
