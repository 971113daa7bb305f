"""The placer's verdicts and keys for a pod without a GPU share on the nodes a placement must judge again
(`Placer._judge`), and the FGD scorer's refresh of the nodes a placement changed (`FgdScorer._refresh`), in plain
loops numba compiles.

Both run thousands of times a cycle, most often on the one to three nodes the last placements touched; their array
form (`NodeFilter.fit`, `Placer.keys` with `FgdScorer.score` and `tie_keys`; `FragModel.device_levels` and `frag`)
then costs some forty array operations on arrays of one to three elements. These loops compute the same thing per
node. The array form stays the reference and what a one-shot process runs: each kernel's numpy form answers False
("not done here"), and the caller then runs its own path (tests/test_placer_judge.py checks the two agree).

What the loops judge (per position `pos[i]` of the kept arrays, node `nodes[i]`), as `NodeFilter._fit` and
`Placer.keys` do for a pod without a GPU share: each requested resource column once releases finish and now, whole
idle devices, the node's GPU total; the tier (availability, resource type, the topology score); then the
strategy's keys: bin-pack or spread on the pod's main resource, or FGD's score of the growth of the node's expected
fragmentation plus, for a GPU pod, BALANCE x the growth of its CPU/GPU imbalance, and FGD's tie keys.

Equal results: verdicts, tiers, bin-pack and spread keys and the tie keys are the same arithmetic in the same order.
FGD's growth is a weighted sum over the target shapes, which the array form leaves to BLAS (summed in blocks) and
the loops add in shape order: the two may differ in the last bits, so the score (an integer step of the growth)
differs only for a growth within a few ulps of one of its 99 steps; an unchanged node's growth is exactly 0 in both.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kai_opt.compiled import Kernel
from kai_opt.heuristics.session import DEV
from kai_opt.state.resources import R_CPU, R_GPU

BINPACK, SPREAD, FGD = 0, 1, 2  # the strategy's keys
NO_NODE = np.iinfo(np.int64).min  # a kept tier: the node may not take the pod
# tier steps of the placer's score (kai_opt/heuristics/placer.py has the others)
TIER_AVAILABILITY = 100
TIER_RESOURCE_TYPE = 10
BALANCE = 0.5  # weight of a GPU pod's CPU/GPU imbalance growth beside its fragmentation growth (FgdScorer)


def _judge_loops(pos: np.ndarray, nodes: np.ndarray, allow_pipeline: bool, cols: np.ndarray, req: np.ndarray,
                 whole: int, alloc: np.ndarray, held: np.ndarray, rel: np.ndarray, whole_idle: np.ndarray,
                 whole_future: np.ndarray, has_gpu: np.ndarray, topo: np.ndarray, strategy: int, col: int,
                 minus_rel: bool, cnt: np.ndarray, below: np.ndarray, ffree: np.ndarray, fcpu: np.ndarray,
                 frag: np.ndarray, access: np.ndarray, level_of: np.ndarray, t_num: np.ndarray, t_cpu: np.ndarray,
                 weight: np.ndarray, ratio: float, now_out: np.ndarray, k0: np.ndarray, k1: np.ndarray,
                 k2: np.ndarray, k3: np.ndarray) -> bool:
    gpu = req[R_GPU]
    x = req[R_CPU]
    gpu_pod = whole > 0
    for i in range(len(pos)):
        n = nodes[i]
        at = pos[i]
        future = True
        now = True
        for c in cols:
            free = alloc[n, c] - held[n, c]
            if free < req[c]:
                future = False
            if free - rel[n, c] < req[c]:
                now = False
        now = now and future
        if gpu_pod:
            if whole_idle[n] < whole:
                now = False
            if whole_future[n] < whole:
                future = False
            if gpu > 0:
                free = alloc[n, R_GPU] - held[n, R_GPU]
                if free < gpu:
                    future = False
                    now = False
                elif free - rel[n, R_GPU] < gpu:
                    now = False
        now_out[at] = now
        if not (future if allow_pipeline else now):
            k0[at] = NO_NODE
            continue
        tier = TIER_AVAILABILITY if now else 0
        if not gpu_pod and not has_gpu[n]:
            tier += TIER_RESOURCE_TYPE
        if len(topo):
            tier += topo[n]
        k0[at] = tier
        if strategy == FGD:
            cpu_after = fcpu[n] - x
            free_after = ffree[n] - whole * DEV
            growth = 0.0
            for m in range(len(weight)):
                lv = level_of[m]
                usable = access[n, m] and cnt[n, lv] - whole >= t_num[m] and cpu_after >= t_cpu[m]
                after = below[n, lv] if usable else free_after
                growth += (after - frag[n, m]) * weight[m]
            if gpu_pod and ratio > 0:
                growth += BALANCE * (abs(cpu_after - ratio * free_after) / ratio
                                     - abs(fcpu[n] - ratio * ffree[n]) / ratio)
            growth = min(max(growth, -1e5), 1e5)
            k1[at] = math.floor(100.0 / (1.0 + math.exp(growth / 1000.0)))
            if gpu_pod:
                k2[at] = -abs(float(cpu_after) - ratio * float(ffree[n] - gpu))
                k3[at] = 0.0
            else:
                k2[at] = -float(ffree[n])
                k3[at] = -float(cpu_after)
        else:
            free = alloc[n, col] - held[n, col]
            if minus_rel:
                free -= rel[n, col]
            k1[at] = -float(free) if strategy == BINPACK else float(free)
            k2[at] = 0.0
            k3[at] = 0.0
    return True


def _refresh_loops(nodes: np.ndarray, dev_start: np.ndarray, dev_held: np.ndarray, dev_rel: np.ndarray,
                   alloc: np.ndarray, held: np.ndarray, rel: np.ndarray, levels: np.ndarray, level_of: np.ndarray,
                   t_num: np.ndarray, t_cpu: np.ndarray, access: np.ndarray, cnt: np.ndarray, below: np.ndarray,
                   free: np.ndarray, cpu: np.ndarray, frag: np.ndarray, known: np.ndarray) -> bool:
    """FgdScorer._refresh of `nodes`: per node its devices' free share per level (how many hold at least it, the
    share on those below it), its free share and CPU, its fragmentation per target shape; its remembered growths
    dropped."""
    for n in nodes:
        total = 0
        for j in range(len(levels)):
            cnt[n, j] = 0
            below[n, j] = 0
        for d in range(dev_start[n], dev_start[n + 1]):
            a = DEV - dev_held[d] - dev_rel[d]
            total += a
            for j in range(len(levels)):
                if a >= levels[j]:
                    cnt[n, j] += 1
                else:
                    below[n, j] += a
        free[n] = total
        c = alloc[n, R_CPU] - held[n, R_CPU] - rel[n, R_CPU]
        cpu[n] = c
        for m in range(len(level_of)):
            lv = level_of[m]
            usable = access[n, m] and cnt[n, lv] >= t_num[m] and c >= t_cpu[m]
            frag[n, m] = below[n, lv] if usable else total
        for r in range(known.shape[0]):
            known[r, n] = np.nan
    return True


def _not_here(*args: Any) -> bool:
    """The numpy form: the caller runs its own array path (Placer._judge, FgdScorer._refresh)."""
    return False


JUDGE = Kernel("placer judge", _judge_loops, _not_here)
REFRESH = Kernel("FGD statistics refresh", _refresh_loops, _not_here)

# the FGD arrays of a judge under another strategy (read by no loop)
NO_FGD: tuple[np.ndarray, ...] = (np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0), dtype=np.int64),
                                  np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                  np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0), dtype=bool),
                                  np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
                                  np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64))
NO_TOPOLOGY = np.zeros(0, dtype=np.int64)
