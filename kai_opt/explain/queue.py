"""A queue: its fair share computed step by step, level by level from the top of the tree (what each division
had to share, the siblings' deserved, weights, priorities and requests, the deserved pass, over-quota rounds and
leftovers, the limit), its allocatable share, usage and DRF share, and its pending work with the plan's reasons.

The division is run again with a recorder on the sibling sets above the queue (fairshare/share.py); the result
must equal the cycle's fair share (checked)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.explain.context import Context, qty
from kai_opt.fairshare import compute_fair_share
from kai_opt.fairshare.division import QueueShare
from kai_opt.heuristics.session import ACTIVE
from kai_opt.state import PodStatus
from kai_opt.state.resources import QR

UNLIMITED = -1.0


def explain_queue(ctx: Context, q: int) -> dict[str, Any]:
    st, fs = ctx.state, ctx.fs
    path = st.q_ancestors[q][::-1]  # top level first
    levels: dict[tuple[int, int], dict[str, Any]] = {}

    def record(parent: int, r: int, amount: float, shares: list[QueueShare], left: float) -> None:
        mine = next((s for s in shares if s.index in path), None)
        if mine is None:
            return
        levels[(path.index(mine.index), r)] = {
            "divided_by": st.q_names[parent] if parent >= 0 else "cluster",
            "amount": amount, "left_undivided": left,
            "siblings": [_share(s) for s in sorted(shares, key=lambda s: s.name)],
            "queue": mine.name, "steps": list(mine.steps),
        }

    again = compute_fair_share(st, total=fs.total, recorder=record, watch=set(path), history=fs.history,
                               k_value=fs.k_value)
    consistent = bool(np.allclose(again.fair_share[path], fs.fair_share[path]))
    allocatable = fs.allocatable_share[q]
    drf = float(fs.dominant_share()[q])
    resources: dict[str, Any] = {}
    for r, res in enumerate(QR):
        resources[res] = {
            "deserved": float(fs.deserved[q, r]), "limit": float(fs.limit[q, r]),
            "over_quota_weight": float(fs.over_quota_weight[q, r]), "requested": float(fs.requested[q, r]),
            "fair_share": float(fs.fair_share[q, r]), "allocatable_share": float(allocatable[r]),
            "allocated": float(fs.allocated[q, r]), "allocated_non_preemptible": float(fs.allocated_np[q, r]),
            "allocated_after_plan": float(ctx.after.ledger.allocated[q, r]),
            "levels": [levels[(i, r)] for i in range(len(path)) if (i, r) in levels],
            "allocatable_rule": _allocatable_rule(res, float(fs.deserved[q, r]), float(fs.fair_share[q, r]),
                                                  float(fs.limit[q, r]), float(allocatable[r])),
        }
    parent = int(st.q_parent[q])
    return {
        "queue": st.q_names[q], "parent": st.q_names[parent] if parent >= 0 else None,
        "path": [st.q_names[a] for a in path], "priority": int(st.q_priority[q]), "leaf": bool(st.q_is_leaf[q]),
        "children": [st.q_names[c] for c in st.q_children[q]], "drf_share": round(drf, 6),
        "over_fair_share": bool(np.all(fs.fair_share[q] < fs.allocated[q])),
        "consistent_with_cycle": consistent, "resources": resources, "work": queue_work(ctx, q),
    }


def _share(s: QueueShare) -> dict[str, Any]:
    return {"queue": s.name, "deserved": s.deserved, "limit": s.limit, "weight": s.weight, "priority": s.priority,
            "request": s.request, "requestable": s.requestable, "fair_share": s.fair_share}


def _allocatable_rule(res: str, deserved: float, fair: float, limit: float, out: float) -> str:
    if deserved == UNLIMITED:
        return f"deserved unlimited: allocatable = limit ({qty(res, limit)})"
    text = f"max(deserved {qty(res, deserved)}, fair share {qty(res, fair)})"
    if limit != UNLIMITED:
        text += f" capped by limit {qty(res, limit)}"
    return f"{text} = {qty(res, out)}"


def queue_work(ctx: Context, q: int) -> dict[str, Any]:
    """Podgroups of the queue's subtree: pending after the plan (with the plan's reasons), placed or evicted by
    it, and running untouched (counted)."""
    st, plan = ctx.state, ctx.plan
    inside = np.array([q in anc for anc in st.q_ancestors], dtype=bool)
    mine = np.flatnonzero(np.isin(st.pg_queue, np.flatnonzero(inside)))
    mine_set = set(mine.tolist())
    placed: dict[int, int] = {}
    for pl in plan.placements:
        g = int(st.pod_pg[pl.pod])
        if g in mine_set and not pl.moved:
            placed[g] = placed.get(g, 0) + 1
    evicted: dict[int, int] = {}
    for e in plan.evictions:
        g = int(st.pod_pg[e.pod])
        if g in mine_set:
            evicted[g] = evicted.get(g, 0) + 1
    pending = [{"podgroup": st.pg_keys[g], "priority": int(st.pg_priority[g]),
                "reasons": [{"code": r.code, "message": r.message} for r in reasons]}
               for g, reasons in sorted(plan.pending.items()) if g in mine_set]
    holding = np.isin(ctx.after.status, (*ACTIVE, PodStatus.RELEASING)) & (st.pod_pg >= 0)
    groups = set(np.unique(st.pod_pg[holding]).tolist()) & mine_set
    running = len(groups - set(placed) - set(evicted))
    return {"podgroups": len(mine), "pending": pending,
            "placed": {st.pg_keys[g]: n for g, n in sorted(placed.items())},
            "evicted": {st.pg_keys[g]: n for g, n in sorted(evicted.items())}, "running_untouched": running}
