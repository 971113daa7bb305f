"""The fair-share table of every queue (what `kai-opt fairshare` prints and `explain --queue` builds on)."""

from __future__ import annotations

from typing import Any

from kai_opt.fairshare.share import FairShare
from kai_opt.state import ClusterState
from kai_opt.state.resources import QR


def fair_share_table(state: ClusterState, fs: FairShare) -> list[dict[str, Any]]:
    allocatable = fs.allocatable_share
    drf = fs.dominant_share()
    rows = []
    for q, name in enumerate(state.q_names):
        parent = int(state.q_parent[q])
        row: dict[str, Any] = {"name": name, "parent": state.q_names[parent] if parent >= 0 else None,
                               "priority": int(state.q_priority[q]), "drf_share": float(drf[q])}
        for r, res in enumerate(QR):
            entry: dict[str, Any] = {
                "deserved": float(fs.deserved[q, r]),
                "limit": float(fs.limit[q, r]),
                "over_quota_weight": float(fs.over_quota_weight[q, r]),
                "fair_share": float(fs.fair_share[q, r]),
                "allocatable_share": float(allocatable[q, r]),
                "allocated": float(fs.allocated[q, r]),
                "allocated_non_preemptible": float(fs.allocated_np[q, r]),
                "requested": float(fs.requested[q, r]),
            }
            if fs.usage is not None:  # time-based fair share: the queue's normalised past usage
                entry["usage"] = float(fs.usage[q, r])
            if fs.steps is not None:
                entry["steps"] = list(fs.steps[q][r])
            row[res] = entry
        rows.append(row)
    return rows
