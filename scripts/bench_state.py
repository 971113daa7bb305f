#!/usr/bin/env python
"""Benchmark: ClusterState build for the scale instance (10,000 nodes x 8 GPUs, 100,000 running pods).

Each measurement runs in its own child process, so its peak RSS (resource.getrusage ru_maxrss) is its own:
  memory  generate objects, parse them into a Snapshot and gc.collect() (not timed), time build_state(snapshot)
  file    time load_snapshot(path) + build_state on a kubectl List JSON written beforehand by another child
Targets (the issue): parsed objects -> state <= 1 s; JSON file -> state <= 10 s; peak memory <= 2 GB.

  scripts/bench_state.py                       # full size, prints a table
  scripts/bench_state.py --nodes 1000 --running 10000 --pending 1000 --profile 15
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TARGET_MEMORY_S, TARGET_FILE_S, TARGET_RSS_MB = 1.0, 10.0, 2048.0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _timed(fn: Any, profile: int, res: dict[str, Any]) -> tuple[Any, float, str]:
    """Run fn; wall seconds returned, CPU seconds of this process in res["cpu_s"] (on a loaded machine the CPU
    time is what the same run takes on a quiet one: the work is single-threaded)."""
    prof = cProfile.Profile() if profile else None
    t = time.perf_counter()
    c = time.process_time()
    if prof:
        prof.enable()
    out = fn()
    if prof:
        prof.disable()
    dt = time.perf_counter() - t
    res["cpu_s"] = time.process_time() - c
    text = ""
    if prof:
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(profile)
        buf.write("\n")
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(profile)
        text = buf.getvalue()
    return out, dt, text


def child(args: argparse.Namespace) -> dict[str, Any]:
    from kai_opt.loaders import load_snapshot
    from kai_opt.state import build_state
    from models.generators import as_snapshot, scale, write_json

    res: dict[str, Any] = {}
    if args.child in ("memory", "write"):
        t = time.perf_counter()
        objs = scale(args.nodes, args.running, args.pending, args.seed, n_queues=args.queues)
        res["generate_s"] = time.perf_counter() - t
        if args.child == "write":
            t = time.perf_counter()
            write_json(objs, args.json)
            res["write_s"] = time.perf_counter() - t
            res["bytes"] = Path(args.json).stat().st_size
            return res
        t = time.perf_counter()
        snap = as_snapshot(objs)
        res["snapshot_s"] = time.perf_counter() - t
        t = time.perf_counter()
        gc.collect()  # the parse's GC debt (as_snapshot pauses the GC) is not build_state's to pay
        res["gc_s"] = time.perf_counter() - t
        res["rss_before_mb"] = _peak_mb()
        state, res["seconds"], res["profile"] = _timed(lambda: build_state(snap), args.profile, res)
    else:
        res["rss_before_mb"] = _peak_mb()
        t = time.perf_counter()

        def run() -> Any:
            snap = load_snapshot(args.json)
            res["load_s"] = time.perf_counter() - t
            return build_state(snap)

        state, res["seconds"], res["profile"] = _timed(run, args.profile, res)
        res["state_s"] = res["seconds"] - res["load_s"]
    res["peak_mb"] = _peak_mb()
    res["pods"], res["nodes"], res["groups"], res["queues"] = (state.n_pods, state.n_nodes, state.n_groups,
                                                               state.n_queues)
    res["warnings"] = len(state.warnings)
    return res


def run_child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--json", str(args.json), "--nodes", str(args.nodes),
           "--running", str(args.running), "--pending", str(args.pending), "--queues", str(args.queues),
           "--seed", str(args.seed), "--profile", str(args.profile)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--running", type=int, default=100_000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--queues", type=int, default=1_000, help="about this many queues in the 4-level tree")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (the best time is shown)")
    ap.add_argument("--json", type=Path, default=None, help="snapshot file to write and read (default: a temp file)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="print the top N cProfile rows per run")
    ap.add_argument("--child", choices=("memory", "write", "file"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        args.json = args.json or Path(tmp) / "scale.json"
        w = run_child("write", args)
        print(f"instance: {args.nodes} nodes, {args.running} running + {args.pending} pending pods, ~{args.queues} "
              f"queues; generated in {w['generate_s']:.2f} s; JSON {w['bytes'] / 2**20:.0f} MiB written in "
              f"{w['write_s']:.2f} s")
        results = {m: [run_child(m, args) for _ in range(args.repeat)] for m in ("memory", "file")}

    rows = []
    for mode, target in (("memory", TARGET_MEMORY_S), ("file", TARGET_FILE_S)):
        best = min(results[mode], key=lambda r: r["seconds"])
        peak = max(r["peak_mb"] for r in results[mode])
        detail = (f"untimed: snapshot parse {best['snapshot_s']:.2f} s, gc.collect {best['gc_s']:.2f} s"
                  if mode == "memory"
                  else f"load {best['load_s']:.2f} s + build {best['state_s']:.2f} s")
        ok = best["seconds"] <= target and peak <= TARGET_RSS_MB
        rows.append((mode, best["seconds"], target, peak, ok, detail, best))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'measurement':<26}{'seconds':>9}{'cpu s':>7}{'target':>8}{'peak MB':>9}{'target':>8}  {'ok':<4} detail")
    labels = {"memory": "parsed objects -> state", "file": "JSON file -> state"}
    for mode, secs, target, peak, ok, detail, res in rows:
        print(f"{labels[mode]:<26}{secs:>9.2f}{res['cpu_s']:>7.2f}{target:>8.0f}{peak:>9.0f}{TARGET_RSS_MB:>8.0f}  "
              f"{'yes' if ok else 'NO':<4} {detail}")
    for mode, *_, best in rows:
        print(f"[{mode}] state: {best['nodes']} nodes, {best['pods']} pods, {best['groups']} podgroups, "
              f"{best['queues']} queues, {best['warnings']} warnings")
        if best["profile"]:
            print(f"--- profile ({mode}) ---\n{best['profile']}")
    return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
