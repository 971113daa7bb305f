"""Numbers that describe a plan's outcome (used by solve, bench and conformance)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.plan import Plan
from kai_opt.state import R_GPU, ClusterState
from kai_opt.summary import gpu_totals


def gpu_usage_after(state: ClusterState, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Node GPU milli used and device milli used once the plan has fully landed."""
    node = state.node_used[:, R_GPU] - state.node_releasing[:, R_GPU] + state.node_pipelined[:, R_GPU]
    dev = state.dev_used - state.dev_releasing + state.dev_pipelined
    node = node.copy()
    dev = dev.copy()
    for e in plan.evictions:
        n = int(state.pod_node[e.pod])
        per = state.pod_gpu_per_device(e.pod, n)
        for d in state.pod_devices(e.pod):
            dev[d] -= per
            node[n] -= per
    for p in plan.placements:
        per = state.pod_gpu_per_device(p.pod, p.node)
        for d in p.devices:
            dev[int(state.dev_start[p.node]) + d] += per
            node[p.node] += per
    return node, dev


def plan_summary(state: ClusterState, plan: Plan) -> dict[str, Any]:
    before = gpu_totals(state)
    node, dev = gpu_usage_after(state, plan)
    used = np.zeros_like(state.node_used)
    used[:, R_GPU] = node
    after = gpu_totals(state, node_used=used, dev_used=dev)
    placed_groups = {int(state.pod_pg[p.pod]) for p in plan.placements if not p.moved}
    return {
        "gpus_total": before["total"],
        "gpus_allocated_before": before["used"],
        "gpus_allocated_after": after["used"],
        "fragmentation_before": before["fragmentation"],
        "fragmentation_after": after["fragmentation"],
        "binds": len(plan.binds),
        "pipelines": len(plan.pipelines),
        "moves": len(plan.moves),
        "evictions": len(plan.evictions),
        "podgroups_placed": len(placed_groups),
        "podgroups_pending": len(plan.pending),
    }
