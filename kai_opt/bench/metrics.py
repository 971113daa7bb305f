"""What `kai-opt bench run` measures about one plan on one instance, and timing percentiles.

- GPUs allocated: held by every pod once the plan has landed (releases done, pipelines bound, evictions gone);
  priority-weighted: our pods' GPUs x priority / 100. Both are compared with the LP bound (kai_opt.bench.bound).
- fragmentation: FGD's expected fragmentation after the plan, sum over schedulable nodes of sum_m p_m F_n(m),
  where M is the instance's pending GPU pod shapes (CPU, per-GPU share, GPU count) with their frequencies p_m
  and F_n(m) is n's free GPU share that m cannot use (all of it when m does not fit n at all);
- fairness: the largest deviation, over leaf queues, of the GPUs a queue holds after the plan from its fair share
  (compute_fair_share at the start of the cycle).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kai_opt.bench import trace
from kai_opt.bench.baselines import cluster_view, pending_pods, target_workload
from kai_opt.bench.bound import pod_dra_gpus, pod_gpu_at, pod_weight
from kai_opt.fairshare import FairShare
from kai_opt.plan import Plan
from kai_opt.state import R_GPU, ClusterState, PodStatus
from kai_opt.usage import subtree_sum

MILLI = 1000
ACTIVE = (PodStatus.BOUND, PodStatus.PIPELINED)


def _amount(state: ClusterState, p: int, n: int) -> np.ndarray:
    a = state.pod_req[p].copy()
    if state.pod_gpu_mem[p]:
        a[R_GPU] = state.pod_gpu_per_device(p, n) * int(state.pod_gpu_ndev[p])
    return a


def usage_after(state: ClusterState, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(node used [N, R], device used [D]) once the plan has landed."""
    node = (state.node_used - state.node_releasing + state.node_pipelined).astype(np.int64)
    dev = (state.dev_used - state.dev_releasing + state.dev_pipelined).astype(np.int64)
    for e in plan.evictions:
        n = int(state.pod_node[e.pod])
        node[n] -= _amount(state, e.pod, n)
        dev[state.pod_devices(e.pod)] -= state.pod_gpu_per_device(e.pod, n)
    for pl in plan.placements:
        node[pl.node] += _amount(state, pl.pod, pl.node)
        per = state.pod_gpu_per_device(pl.pod, pl.node)
        for d in pl.devices:
            dev[int(state.dev_start[pl.node]) + d] += per
    return node, dev


def where_after(state: ClusterState, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(our pods active after the plan, their nodes)."""
    node = state.pod_node.astype(np.int64).copy()
    active = state.pod_ours & np.isin(state.pod_status, ACTIVE)
    for e in plan.evictions:
        active[e.pod] = False
    for pl in plan.placements:
        active[pl.pod] = True
        node[pl.pod] = pl.node
    pods = np.nonzero(active)[0]
    return pods, node[pods]


def gpus_allocated(state: ClusterState, plan: Plan) -> tuple[float, float]:
    """(GPUs held by all pods, priority-weighted GPUs of our pods) after the plan; DRA GPUs count as GPUs."""
    node, _ = usage_after(state, plan)
    pods, nodes = where_after(state, plan)
    weighted = float((pod_weight(state, pods) * (pod_gpu_at(state, pods, nodes) + pod_dra_gpus(state, pods))).sum()
                     ) / MILLI
    dra = 0.0
    if state.dra is not None:
        active = np.isin(state.pod_status, ACTIVE)
        active[[e.pod for e in plan.evictions]] = False
        active[[pl.pod for pl in plan.placements]] = True
        dra = float(pod_dra_gpus(state, np.nonzero(active)[0]).sum())
    return float(node[:, R_GPU].sum() + dra) / MILLI, weighted


class Fragmentation:
    """FGD's expected fragmentation against the instance's pending GPU shapes (fixed before any engine runs)."""

    def __init__(self, state: ClusterState) -> None:
        self.workload = target_workload(state, pending_pods(state), gpu_only=True, coverage=1.0)

    def gpus(self, state: ClusterState, plan: Plan) -> tuple[float, float]:
        """(expected unusable free GPUs, as % of the free GPUs) on schedulable nodes after the plan."""
        node, dev = usage_after(state, plan)
        free = np.maximum(state.node_alloc - node, 0)
        cluster = cluster_view(state, free, np.clip(MILLI - dev, 0, MILLI))
        ok = state.node_ok
        free_gpus = float(cluster.gpu_free[ok].sum()) / MILLI
        if self.workload is None or free_gpus <= 0:
            return 0.0, 0.0
        frag = trace.FgdPolicy(cluster, np.random.default_rng(0), self.workload).node_fragmentation()
        gpus = float(frag[ok].sum()) / MILLI
        return gpus, 100.0 * gpus / free_gpus


def fairness(state: ClusterState, fs: FairShare, plan: Plan) -> float:
    """Largest |GPUs held after the plan - fair share| over leaf queues (GPUs)."""
    if not state.n_queues:
        return 0.0
    delta = np.zeros((state.n_queues, 3))
    moved = {pl.pod for pl in plan.placements if pl.moved}
    changes = [(pl.pod, pl.node, 1.0) for pl in plan.placements if not pl.moved]
    changes += [(e.pod, int(state.pod_node[e.pod]), -1.0) for e in plan.evictions if e.pod not in moved]
    for p, n, sign in changes:
        q = int(state.pg_queue[state.pod_pg[p]])
        if q >= 0:
            delta[q] += sign * state.pod_queue_request(np.array([p]), np.array([n]))[0]
    after = fs.allocated + subtree_sum(state, delta)
    leaves = state.q_is_leaf
    return float(np.abs(after[leaves, 0] - fs.fair_share[leaves, 0]).max(initial=0.0))


def counts(state: ClusterState, plan: Plan) -> dict[str, int | float]:
    """Pods, gangs and GPUs the plan places, evictions and moves."""
    placed = [pl for pl in plan.placements if not pl.moved]
    return {
        "pods_placed": len(placed),
        "gangs_placed": len({int(state.pod_pg[pl.pod]) for pl in placed}),
        "gpus_placed": round(sum(state.pod_gpu_per_device(pl.pod, pl.node) * len(pl.devices) for pl in placed)
                             / MILLI, 4),
        "evictions": sum(1 for e in plan.evictions if e.reason != "consolidate"),
        "moves": len(plan.moves),
    }


def pending_before(state: ClusterState) -> dict[str, int]:
    pods = pending_pods(state)
    return {"pods_pending": len(pods), "gangs_pending": len(set(state.pod_pg[pods].tolist()))}


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    a = np.asarray(samples, dtype=np.float64)
    return {"p50": round(float(np.percentile(a, 50)), 6), "p95": round(float(np.percentile(a, 95)), 6)}


def phase_percentiles(runs: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per phase (first-seen order), p50/p95 over the repeats that have it."""
    names = list(dict.fromkeys(k for r in runs for k in r))
    return {k: percentiles([r[k] for r in runs if k in r]) for k in names}


def ratio(value: float, bound: float) -> float | None:
    return None if not bound > 0 else round(value / bound, 6)


def summary(rows: Sequence[dict[str, Any]], key: str = "ratio") -> dict[tuple[str, str], float]:
    """Mean of `key` per (family, engine) over the rows that have it."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.get(key) is not None:
            acc.setdefault((r["family"], r["engine"]), []).append(float(r[key]))
    return {k: float(np.mean(v)) for k, v in acc.items()}
