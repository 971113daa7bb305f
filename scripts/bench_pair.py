#!/usr/bin/env python
"""Benchmark: the cycle of two source trees on the scale instance, run at the same time, for speed-ups.

This machine's speed drifts by 1.5x within an hour, so two trees timed one after the other can differ by more than
a change is worth. Here each round starts one child process per side together (on 2 cores, one each): whatever the
machine does in that minute, it does to both. Each child loads the instance (bench_greedy's cached state: --cache-dir,
built once when missing), runs one warm-up cycle and then --cycles cycles, and reports each cycle's wall time and
phases. Printed: per round the cycles of each side, then each side's medians and the paired ratios new / base (the
median over the rounds' cycle pairs) of the whole cycle and of each phase.

A side is a git revision (checked out into a temporary worktree, removed afterwards) or a directory holding a source
tree ("." for this working tree), as in compare_plans.py (its `trees`). With the greedy engine (the default here)
each side uses one core; the cpsat engine's solver and forked workers would take the other side's core.

  scripts/bench_pair.py 125b2fb .                      # 10,000 nodes, 4 rounds x 2 cycles
  scripts/bench_pair.py HEAD~1 HEAD --nodes 1000 --rounds 6 --cycles 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, pathlib, pickle, sys, time
import kai_opt
if not pathlib.Path(kai_opt.__file__).resolve().is_relative_to(pathlib.Path(sys.path[0]).resolve()):
    sys.exit(f"kai_opt imported from {kai_opt.__file__}, not from {sys.path[0]}")
from kai_opt.compiled import compile_when_used
compile_when_used()  # as the long-lived benchmarks and `kai-opt run`
from kai_opt.config import Config
from kai_opt.engine import run_cycle
path, engine, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "rb") as f:
    state = pickle.load(f)
config = Config.model_validate({"engine": engine})
for i in range(cycles + 1):
    t = time.perf_counter()
    plan, _ = run_cycle(state, config)
    wall = time.perf_counter() - t
    if i:  # (the first cycle warms caches and compiles: not measured)
        print(json.dumps({"cycle": wall, **{k: float(v) for k, v in plan.phases.items() if k != "total"}}), flush=True)
"""


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _round(sides: list[Path], path: Path, engine: str, cycles: int) -> list[list[dict[str, float]]]:
    """One round: every side's child started together; each side's measured cycles."""
    procs = [subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(tree)!r})\n" + CHILD,
                               str(path), engine, str(cycles)], cwd=tree, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for tree in sides]
    out = []
    for tree, proc in zip(sides, procs, strict=True):
        stdout, stderr = proc.communicate()
        if proc.returncode:
            sys.exit(f"the child for {tree} failed:\n{stderr[-4000:]}")
        out.append([json.loads(line) for line in stdout.splitlines() if line.startswith("{")])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="git revision or source tree (before)")
    ap.add_argument("new", nargs="?", default=".", help="git revision or source tree (after); default: .")
    ap.add_argument("--nodes", type=int, default=10_000, help="scale instance size (x 10 pods per node)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cycles", type=int, default=2, help="measured cycles per child, after one warm-up cycle")
    ap.add_argument("--engine", default="greedy", choices=("greedy", "cpsat"))
    ap.add_argument("--cache-dir", default="/tmp", help="where bench_greedy caches the built states (pickle)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    greedy = _script("bench_greedy")
    path = greedy.state_path(args.cache_dir, args.nodes, args.seed)
    runs: list[list[dict[str, float]]] = [[], []]
    with _script("compare_plans").trees((args.base, args.new), "bench_pair") as sides:
        if not path.exists():  # built and cached once (the children load it)
            greedy._state(args, args.nodes)
        for r in range(args.rounds):
            got = _round(sides, path, args.engine, args.cycles)
            for side, rows in enumerate(got):
                runs[side] += rows
            times = [" ".join(f"{x['cycle']:.3f}" for x in rows) for rows in got]
            print(f"round {r + 1}: {args.base} {times[0]}  {args.new} {times[1]}", flush=True)
    keys = list(runs[0][0])
    print(f"{args.nodes} nodes, engine {args.engine}, {args.rounds} rounds x {args.cycles} cycles, run together")
    print(f"{'':10s}" + "".join(f"{k[:9]:>10s}" for k in keys))
    for spec, rows in zip((args.base, args.new), runs, strict=True):
        print(f"{spec[:10]:10s}" + "".join(f"{statistics.median(x[k] for x in rows):10.3f}" for k in keys))
    print(f"{'new/base':10s}" + "".join(f"{_paired(runs, k):10.3f}" for k in keys))
    return 0


def _paired(runs: list[list[dict[str, float]]], key: str) -> float:
    """Median over the cycle pairs (the same round and cycle of each side) of new / base; nan when base is 0."""
    ratios = [b[key] / a[key] for a, b in zip(runs[0], runs[1], strict=True) if a[key] > 0]
    return statistics.median(ratios) if ratios else float("nan")


if __name__ == "__main__":
    sys.exit(main())
