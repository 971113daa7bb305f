#!/usr/bin/env python
"""Benchmark: start-up of the light commands (issue 22 item 6, goal: each under 0.3 s wall on the 2-core machine).

Runs `python -m kai_opt ARGS` (this tree's code: PYTHONPATH is the repository) RUNS times per command after one
warm-up run, with bytecode caching on (PYTHONDONTWRITEBYTECODE removed: an installed package has its .pyc files;
without them every run compiles the sources), output to /dev/null, and prints the median wall time and the median
CPU time (user + system of the child, from getrusage) with the load average before and after, since on a shared
machine wall time is mostly waiting for a core and CPU time is the comparable figure.

  scripts/bench_startup.py              # the four commands, 10 runs each
  scripts/bench_startup.py --runs 20 -- config --print-default
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = [["--version"], ["config", "--print-default"], ["schema"], ["manifests"]]


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one `python ARGV` in a fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("command", nargs="*", help="one command's arguments (default: the four light commands)")
    opts = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cases = [("(python -c pass)", ["-c", "pass"])]  # the interpreter's own start-up, for reference
    cases += [(" ".join(args), ["-m", "kai_opt", *args]) for args in ([opts.command] if opts.command else COMMANDS)]
    load_before = os.getloadavg()[0]
    rows = []
    for name, argv in cases:
        run_once(argv, env)  # warm-up: writes the bytecode caches
        samples = [run_once(argv, env) for _ in range(opts.runs)]
        rows.append((name, statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)))
    load_after = os.getloadavg()[0]
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, load average {load_before:.1f} -> "
          f"{load_after:.1f}, median of {opts.runs} runs of {sys.executable} -m kai_opt ARGS")
    print(f"{'command':<26} {'wall s':>7} {'CPU s':>7}")
    for name, wall, cpu in rows:
        print(f"{name:<26} {wall:>7.3f} {cpu:>7.3f}")


if __name__ == "__main__":
    main()
