#!/usr/bin/env python
"""Benchmark: kai-opt beside KAI-Scheduler itself, on the same snapshot ZIPs, interleaved.

KAI's own actions run through the harness in ../shared/peers/kai (its README: `build.sh` builds `kai-peer` from
KAI-Scheduler's source archive, cold about 15 minutes); kai-opt runs `kai-opt solve ZIP -o json` with the default
config (engine cpsat, 1 s budget). Both plans are counted the same way by the harness's `compare.py` (GPUs placed
= bound + pipelined, evictions, pending groups). Instances: kai-opt's scale generator at the given sizes
(`to_kai_zip.py --scale N`) and the light production-like shape (`light_zip.py`: 4,000 nodes, 12 queues, a few
pending gangs, like KAI-Scheduler issue #315). The ZIPs are cached in --cache-dir. Each instance runs --repeats
times, KAI and kai-opt alternating; printed per instance: medians of KAI's action time and process time, kai-opt's
cycle and process time, their ratios, and each one's GPUs placed and evictions (KAI's plan varies between runs:
Go map order). A KAI run that does not finish within --timeout is reported as such.

  scripts/bench_kai.py                                   # scale 1000 and the light shape, 3 repeats
  scripts/bench_kai.py --sizes 1000,5000 --repeats 1 --timeout 900
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PEER = ROOT.parent / "shared" / "peers" / "kai"
sys.path.insert(0, str(PEER))


def _zip(cache: Path, name: str, args: list[str]) -> Path:
    path = cache / f"{name}.zip"
    if not path.exists():
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, *args, "-o", str(path)], check=True, env=env, stdout=subprocess.DEVNULL)
    return path


def _harness() -> Path:
    out = subprocess.run(["bash", str(PEER / "build.sh")], check=True, text=True, stdout=subprocess.PIPE)
    return Path(out.stdout.strip().splitlines()[-1]) / "kai-peer"


def _run(cmd: list[str], timeout: float) -> tuple[float, str | None]:
    """(wall seconds, stdout; None when it timed out or failed)."""
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t, None
    return time.perf_counter() - t, proc.stdout if proc.returncode == 0 else None


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def main() -> int:
    import compare  # the harness's counting (../shared/peers/kai/compare.py)

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000", help="scale instance sizes (comma-separated; '' for none)")
    ap.add_argument("--light", action=argparse.BooleanOptionalAction, default=True, help="the light 4,000-node shape")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds a KAI run may take")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kai-opt-bench-kai"))
    args = ap.parse_args()
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    instances = [(f"scale-{n}", ["--scale", n]) for n in args.sizes.split(",") if n.strip()]
    if args.light:
        instances.append(("light-4000", []))
    peer = _harness()
    rows: list[dict[str, Any]] = []
    for name, extra in instances:
        script = PEER / ("light_zip.py" if name.startswith("light") else "to_kai_zip.py")
        zpath = _zip(args.cache_dir, name, [str(script), *extra])
        table, node_mem = compare.pod_gpus(zpath)
        kai: list[dict[str, Any]] = []
        ours: list[dict[str, Any]] = []
        kai_wall: list[float] = []
        our_wall: list[float] = []
        timeouts = 0
        for _ in range(args.repeats):
            wall, out = _run([str(peer), "-filename", str(zpath)], args.timeout)
            if out is None:
                timeouts += 1
            else:
                kai.append(compare.metrics(json.loads(out[out.find("{"):]), table, node_mem))
                kai_wall.append(wall)
            wall, out = _run(["kai-opt", "solve", str(zpath), "-o", "json"], args.timeout)
            if out is not None:
                ours.append(compare.metrics(json.loads(out[out.find("{"):]), table, node_mem))
                our_wall.append(wall)
        row = {
            "instance": name, "runs": args.repeats, "kai_timeouts": timeouts,
            "kai_actions_s": _median([k["actions_s"] for k in kai]), "kai_process_s": _median(kai_wall),
            "kaiopt_cycle_s": _median([o["cycle_s"] for o in ours if o["cycle_s"] is not None]),
            "kaiopt_process_s": _median(our_wall),
            "kai_gpus": _median([k["gpus_placed"] for k in kai]),
            "kaiopt_gpus": _median([o["gpus_placed"] for o in ours]),
            "kai_evictions": _median([k["evictions"] for k in kai]),
            "kaiopt_evictions": _median([o["evictions"] for o in ours]),
            "kaiopt_status": sorted({o["solver_status"] for o in ours}),
            "kai_gpus_range": [min(k["gpus_placed"] for k in kai), max(k["gpus_placed"] for k in kai)] if kai else None,
        }
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print("| instance | KAI actions s | kai-opt cycle s | ratio | KAI process s | kai-opt process s | ratio | "
          "GPUs placed KAI / kai-opt | evictions KAI / kai-opt | kai-opt status |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        if r["kai_actions_s"] is None:
            kai_a = kai_p = f"did not finish in {args.timeout:g} s"
            ratio_a = ratio_p = "n/a"
        else:
            kai_a, kai_p = _fmt(r["kai_actions_s"]), _fmt(r["kai_process_s"])
            ratio_a = _fmt((r["kaiopt_cycle_s"] or 0) / r["kai_actions_s"], ".3f")
            ratio_p = _fmt((r["kaiopt_process_s"] or 0) / r["kai_process_s"], ".3f")
        print(f"| {r['instance']} | {kai_a} | {_fmt(r['kaiopt_cycle_s'])} | {ratio_a} | {kai_p} | "
              f"{_fmt(r['kaiopt_process_s'])} | {ratio_p} | {_fmt(r['kai_gpus'], '.1f')} / "
              f"{_fmt(r['kaiopt_gpus'], '.1f')} | {_fmt(r['kai_evictions'], '.0f')} / "
              f"{_fmt(r['kaiopt_evictions'], '.0f')} | {', '.join(r['kaiopt_status'])} |")
    print(f"\nmedians of {args.repeats} interleaved runs each; ratio = kai-opt / KAI (below 1: kai-opt faster); KAI's "
          "GPUs placed ranged " + "; ".join(f"{r['instance']} {r['kai_gpus_range'][0]:.1f}-{r['kai_gpus_range'][1]:.1f}"
                                            for r in rows if r["kai_gpus_range"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
