#!/usr/bin/env python3
"""Benchmark: fair-share division of a 4-level queue tree with ~10,000 queues (3 resources).

Usage: scripts/bench_fairshare.py [--leaves-per-parent 10] [--repeat 5]
Prints queues, levels and seconds per division (best and median of --repeat runs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from kai_opt.fairshare.share import divide_tree


def tree(fanout: tuple[int, ...], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    parent: list[int] = []
    level_nodes = [-1]
    for f in fanout:
        nxt = []
        for p in level_nodes:
            for _ in range(f):
                parent.append(p)
                nxt.append(len(parent) - 1)
        level_nodes = nxt
    n = len(parent)
    parent_arr = np.array(parent)
    leaf = np.ones(n, dtype=bool)
    leaf[parent_arr[parent_arr >= 0]] = False
    req = np.zeros((n, 3))
    req[leaf] = rng.integers(0, 64, size=(leaf.sum(), 3)) * np.array([1.0, 8000.0, 64e9])
    depth = np.zeros(n, dtype=int)
    for q in range(n):
        depth[q] = 0 if parent[q] < 0 else depth[parent[q]] + 1
    for q in np.argsort(-depth, kind="stable"):
        if parent[q] >= 0:
            req[parent[q]] += req[q]
    return {
        "parent": parent_arr,
        "deserved": rng.choice([0.0, 1.0, 2.0, 4.0], size=(n, 3)),
        "limit": rng.choice([-1.0, -1.0, 100.0], size=(n, 3)),
        "weight": rng.choice([1.0, 2.0, 3.0], size=(n, 3)),
        "priority": rng.choice([50, 100, 200], size=n),
        "creation": np.arange(n, dtype=float),
        "names": [f"q{i}" for i in range(n)],
        "requested": req,
        "levels": len(fanout),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fanout", default="10,10,10,9", help="children per queue at each level (top first)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    t = tree(tuple(int(x) for x in args.fanout.split(",")))
    total = np.array([80_000.0, 80_000.0 * 64_000, 80_000.0 * 512e9])

    def timed(memo: bool) -> float:
        start = time.perf_counter()
        divide_tree(total, t["parent"], t["deserved"], t["limit"], t["weight"], t["priority"], t["creation"],
                    t["names"], t["requested"], memo=memo)
        return time.perf_counter() - start

    times, again = [], []
    for _ in range(args.repeat):
        times.append(timed(memo=False))  # every division made afresh
        timed(memo=True)  # fills the divisions memo
        again.append(timed(memo=True))  # every division read from it (a cycle whose requests did not change)
    print(f"queues={len(t['names'])} levels={t['levels']} resources=3 "
          f"best={min(times):.3f}s median={statistics.median(times):.3f}s; "
          f"again from the divisions memo: median={statistics.median(again):.3f}s")


if __name__ == "__main__":
    main()
