#!/usr/bin/env python3
"""Where a trace-replay engine loses GPUs (issue 17): replay the openb trace (FGD protocol, `kai_opt.bench.trace`)
until 100% of the GPU capacity has arrived, then break the unallocated GPUs down by cause, and the dropped pods by
shape class and by why nothing took them.

Causes of the free GPU share at 100% arrived (each free milli-GPU counted once, first match wins):
- `cpu_stranded`: on a node whose free CPU is below the smallest CPU request of the typical GPU shapes (no GPU
  pod of the target workload fits there by CPU);
- `partial_device`: the free share on devices that are partly used (fractional leftovers of GPU shares);
- `whole_free`: whole free devices on nodes with CPU left (a 1-GPU pod of the right model and CPU would fit).

Dropped pods are classed by shape (cpu-only, share, 1-GPU, multi-GPU) and, on the cluster right after the cycle
that dropped them, by what stopped them: `no_gpu` (no allowed node has the GPUs, whatever its CPU), `no_cpu`
(some allowed node has the GPUs but none of those has the CPU/memory), `fits` (a node fits it after the cycle:
another pod of the batch took the place it could have had, or the engine left it).

Usage: PYTHONPATH=. python scripts/trace_diagnose.py --engines fgd,greedy,cpsat --seeds 1 [--config cfg.yaml]
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np

from kai_opt.bench import batch as batch_engines
from kai_opt.bench import openb, trace
from kai_opt.bench.openb import MILLI
from kai_opt.config import Config, load_config


def shape_class(pods: trace.Pods, i: int) -> str:
    k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
    if k == 0:
        return "cpu_only"
    if d < MILLI:
        return "share"
    return "gpu1" if k == 1 else "multi_gpu"


def drop_reason(cluster: trace.Cluster, pods: trace.Pods, i: int) -> str:
    if cluster.fits(pods, i).any():
        return "fits"
    k, d = int(pods.num_gpu[i]), int(pods.gpu_milli[i])
    gpu_ok = np.ones(len(cluster), dtype=bool)
    if k:
        gpu_ok = cluster.model_ok(int(pods.allowed[i]))
        gpu_ok &= (cluster.gpu_free >= d).any(axis=1) if d < MILLI else (cluster.gpu_free == MILLI).sum(axis=1) >= k
    return "no_cpu" if gpu_ok.any() else "no_gpu"


def free_breakdown(cluster: trace.Cluster, wl: trace.Workload) -> dict[str, float]:
    """Free GPUs at this moment by cause (in GPUs)."""
    gpu_cpu = wl.cpu[wl.milli > 0]
    min_cpu = int(gpu_cpu.min()) if gpu_cpu.size else 0
    stranded = cluster.cpu_free < min_cpu
    free = cluster.gpu_free
    valid = np.arange(free.shape[1])[None, :] < cluster.gpu_count[:, None]
    part = valid & (free > 0) & (free < MILLI)
    whole = valid & (free == MILLI)
    out = {
        "free_total": free.sum() / MILLI,
        "cpu_stranded": free[stranded].sum() / MILLI,
        "partial_device": (free * part)[~stranded].sum() / MILLI,
        "whole_free": (free * whole)[~stranded].sum() / MILLI,
        "min_gpu_shape_cpu_milli": min_cpu,
        "nodes_cpu_stranded_with_free_gpu": int((stranded & (free.sum(axis=1) > 0)).sum()),
    }
    return {k: round(float(v), 1) for k, v in out.items()}


def diagnose(nodes: openb.NodeList, podlist: openb.PodList, engine: str, seed: int, *, batch: int, inflate: float,
             consolidation: bool) -> dict[str, object]:
    cluster = trace.Cluster.from_nodes(nodes)
    seq = trace.pod_sequence(podlist, cluster.total_gpu_milli, seed, inflate)
    shapes = trace.Pods.from_list(podlist, cluster.models).take(seq)
    wl = trace.typical_workload(podlist, cluster.models)
    opts = {"consolidation": consolidation} if engine in ("greedy", "cpsat") else {}
    eng = trace._FACTORIES[engine](cluster, wl, np.random.default_rng([seed, 7919]), **opts)
    placed = np.zeros(len(shapes), dtype=bool)
    where: dict[int, trace.Placement] = {}
    statuses: dict[str, int] = {}
    req = shapes.request
    cap = cluster.total_gpu_milli
    arrived = np.cumsum(req)
    stop_at = int(np.searchsorted(arrived, cap))  # the pod whose arrival reaches 100%
    drops: Counter[tuple[str, str]] = Counter()
    drop_gpu: Counter[tuple[str, str]] = Counter()
    moves = 0
    t0 = time.perf_counter()
    first_drop: float | None = None
    for start in range(0, min(stop_at + 1, len(shapes)), batch):
        stop = min(start + batch, len(shapes))
        moves += trace.play_batch(eng, engine, cluster, shapes, start, stop, placed, where, statuses)
        for i in range(start, stop):
            if not placed[i]:
                key = (shape_class(shapes, i), drop_reason(cluster, shapes, i))
                drops[key] += 1
                drop_gpu[key] += int(req[i])
                if first_drop is None:
                    first_drop = round(float(arrived[i]) * 100 / cap, 2)
    n = min(stop + 0, len(shapes))
    used = float((req[:n] * placed[:n]).sum())
    return {
        "engine": engine, "seed": seed, "consolidation": consolidation if opts else None, "batch": batch,
        "arrived_pct": round(float(arrived[n - 1]) * 100 / cap, 2),
        "unallocated_pct": round(100 - used * 100 / cap, 2),
        "first_drop_at_arrived_pct": first_drop,
        "free": free_breakdown(cluster, wl),
        "dropped_pods": {f"{a}/{b}": c for (a, b), c in sorted(drops.items())},
        "dropped_gpus": {f"{a}/{b}": round(g / MILLI, 1) for (a, b), g in sorted(drop_gpu.items())},
        "moves": moves, "solver_status": statuses, "plan_hint": getattr(eng, "hints", None),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="fgd,greedy,cpsat")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--first-seed", type=int, default=42)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--inflate", type=float, default=1.3)
    ap.add_argument("--consolidation", choices=("on", "off"), default="off")
    ap.add_argument("--config", type=Path)
    ap.add_argument("--pods", type=Path)
    args = ap.parse_args()
    d = openb.default_trace_dir()
    assert d is not None, "no openb trace at ../shared/data/openb"
    nodes = openb.read_nodes(d / openb.DEFAULT_NODES)
    pods = openb.read_pods(args.pods or d / openb.DEFAULT_PODS)
    cfg = load_config(args.config) if args.config else Config()
    batch_engines.register(cfg)
    for engine in args.engines.split(","):
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            r = diagnose(nodes, pods, engine, seed, batch=args.batch, inflate=args.inflate,
                         consolidation=args.consolidation == "on")
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
