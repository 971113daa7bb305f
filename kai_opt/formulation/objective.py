"""The cycle's objective, defined once (DESIGN section 4): three tiers, compared lexicographically.

1. **Work placed** (maximised): per pod placed, its GPUs in milli-GPU (a share: its fraction times its devices; a
   gpu-memory pod GPU_MEMORY_VALUE) plus POD_VALUE, times PRIORITY_BASE ** (its group's priority level among the
   cycle's priorities), times BELOW_SHARE_FACTOR when its queue is within its fair share at cycle start.
2. **Eviction cost** (minimised): per pod evicted or moved, its milli-GPU plus POD_VALUE, times PRIORITY_BASE **
   (its group's priority level).
3. **Packing** (maximised): per pod with GPUs placed, the fullness (0-10) of its node at cycle start.

The CP-SAT model's expressions (formulation/model.py), the plan choice (`plan_score`, formulation/solve.py) and
explain's breakdown (explain/placed.py) all read these weights from here.
"""

from __future__ import annotations

import numpy as np

from kai_opt.fairshare import FairShare
from kai_opt.plan import Plan
from kai_opt.state import R_GPU, ClusterState

DEV = 1000  # milli-GPU per device
POD_VALUE = 10  # every pod counts, CPU-only ones too
GPU_MEMORY_VALUE = 500  # a gpu-memory pod's work, whatever node it lands on
PRIORITY_BASE = 4  # one priority level outweighs work of every level below it, up to PRIORITY_BASE-fold
BELOW_SHARE_FACTOR = 2
FULLNESS_STEPS = 10
TIERS = ("work placed (priority-weighted GPUs, x2 within fair share)", "eviction cost",
         "packing (node fullness 0-10 at cycle start, per pod placed)")


class Objective:
    """The weights of one cycle: one priority scale (the cycle's distinct priorities) and the queues within their
    fair share at cycle start, for every plan of the cycle."""

    def __init__(self, state: ClusterState, fs: FairShare) -> None:
        self.state = state
        self.prios = np.unique(state.pg_priority)
        self.below_share = np.all(fs.allocated <= fs.fair_share + 1e-9, axis=1)

    def level_weight(self, groups: np.ndarray) -> np.ndarray:
        """PRIORITY_BASE ** priority level, per group (int64: exact)."""
        level = np.searchsorted(self.prios, self.state.pg_priority[np.asarray(groups, dtype=np.int64)])
        return np.power(PRIORITY_BASE, level).astype(np.int64)

    def work(self, pods: np.ndarray) -> np.ndarray:
        """Tier 1 per pod placed (int64)."""
        st = self.state
        pods = np.asarray(pods, dtype=np.int64)
        whole = st.pod_gpu_whole[pods].astype(np.int64) * DEV
        frac = st.pod_gpu_frac[pods].astype(np.int64) * st.pod_gpu_ndev[pods].astype(np.int64)
        mem = np.where(st.pod_gpu_mem[pods] > 0, GPU_MEMORY_VALUE, 0)
        per = np.where(whole > 0, whole, np.where(frac > 0, frac, mem)) + POD_VALUE
        groups = st.pod_pg[pods]
        factor = np.where(self.below_share[st.pg_queue[groups]], BELOW_SHARE_FACTOR, 1)
        return per * self.level_weight(groups) * factor

    def eviction_cost(self, pods: np.ndarray) -> np.ndarray:
        """Tier 2 per pod evicted or moved (int64)."""
        st = self.state
        pods = np.asarray(pods, dtype=np.int64)
        return (st.pod_req[pods, R_GPU].astype(np.int64) + POD_VALUE) * self.level_weight(st.pod_pg[pods])

    def fullness(self, nodes: np.ndarray) -> np.ndarray:
        """Tier 3 per GPU pod placed on each node: its GPUs in use at cycle start, 0-10 (0 without GPUs)."""
        st = self.state
        nodes = np.asarray(nodes, dtype=np.int64)
        alloc = st.node_alloc[nodes, R_GPU].astype(np.int64)
        held = (st.node_used - st.node_releasing + st.node_pipelined)[nodes, R_GPU].astype(np.int64)
        return np.where(alloc > 0, FULLNESS_STEPS * held // np.maximum(alloc, 1), 0)

    def score(self, plan: Plan) -> tuple[float, float]:
        """(tier 1, tier 2) of a plan: work placed (moves are not new work) and the cost of its evictions (a
        move is an eviction too)."""
        pods = np.array([pl.pod for pl in plan.placements if not pl.moved], dtype=np.int64)
        victims = np.array([e.pod for e in plan.evictions], dtype=np.int64)
        value = float(self.work(pods).sum()) if len(pods) else 0.0  # exact: integers well below 2^53
        cost = float(self.eviction_cost(victims).sum()) if len(victims) else 0.0
        return value, cost
