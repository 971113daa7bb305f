"""Cluster totals, the queue table and pending work of a ClusterState (what `kai-opt show` prints)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.state import R_GPU, ClusterState, PodStatus
from kai_opt.state.resources import QR
from kai_opt.usage import queue_usage


def gpu_totals(state: ClusterState, node_used: np.ndarray | None = None,
               dev_used: np.ndarray | None = None) -> dict[str, float]:
    """GPUs total / used / free (fractions count), and fragmentation: free GPU capacity on nodes that are
    partially used (idle capacity that whole-node jobs cannot use), plus whole free devices."""
    used_milli = (state.node_used if node_used is None else node_used)[:, R_GPU]
    dev = state.dev_used if dev_used is None else dev_used
    total_milli = state.node_alloc[:, R_GPU]
    free_milli = np.maximum(total_milli - used_milli, 0)
    partial = (used_milli > 0) & (used_milli < total_milli)
    return {
        "total": float(total_milli.sum()) / 1000,
        "used": float(used_milli.sum()) / 1000,
        "free": float(free_milli.sum()) / 1000,
        "free_devices": int((dev == 0).sum()),
        "fragmentation": float(free_milli[partial].sum()) / 1000,
    }


def summarize(state: ClusterState) -> dict[str, Any]:
    usage = queue_usage(state)
    queues = []
    for q, name in enumerate(state.q_names):
        parent = int(state.q_parent[q])
        entry: dict[str, Any] = {"name": name, "parent": state.q_names[parent] if parent >= 0 else None,
                                 "priority": int(state.q_priority[q])}
        for j, res in enumerate(QR):
            entry[res] = {
                "quota": float(state.q_deserved[q, j]),
                "limit": float(state.q_limit[q, j]),
                "over_quota_weight": float(state.q_oqw[q, j]),
                "allocated": float(usage.allocated[q, j]),
                "requested": float(usage.requested[q, j]),
            }
        queues.append(entry)
    pending = []
    st = state.pod_status
    for g, key in enumerate(state.pg_keys):
        pods = state.group_pods(g)
        n_pending = int((st[pods] == PodStatus.PENDING).sum())
        if n_pending == 0:
            continue
        q = int(state.pg_queue[g])
        pend = pods[st[pods] == PodStatus.PENDING]
        req = state.pod_queue_request(pend)
        pending.append({
            "podgroup": key,
            "queue": state.q_names[q] if q >= 0 else None,
            "pending_pods": n_pending,
            "running_pods": int(np.isin(st[pods], (PodStatus.BOUND, PodStatus.RELEASING)).sum()),
            "min_member": int(state.pg_min_member[g]),
            "priority": int(state.pg_priority[g]),
            "preemptible": bool(state.pg_preemptible[g]),
            "gpus": round(float(req[:, 0].sum()), 3),
            "problem": state.pg_problem[g],
        })
    ok = state.node_ok
    return {
        "nodes": state.n_nodes,
        "nodes_schedulable": int(ok.sum()),
        "gpus": gpu_totals(state),
        "pods": {
            "running": int((st == PodStatus.BOUND).sum()),
            "releasing": int((st == PodStatus.RELEASING).sum()),
            "pending": int((st == PodStatus.PENDING).sum()),
            "gated": int((st == PodStatus.GATED).sum()),
        },
        "queues": queues,
        "pending_podgroups": pending,
        "warnings": list(state.warnings),
    }
