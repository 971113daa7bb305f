"""A pending podgroup: the plan's own reasons (verbatim, with their details), then everything that applies on
the cluster as the plan leaves it — node-level reason counts per pod shape, how many of the pods it needs fit at
best (per sub-group), its queue's limits, quota and fair share, why reclaim and preempt could not help, its
topology domains — and what would unblock it (explain/unblock.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.explain.context import Context, qty
from kai_opt.explain.nodes import node_reasons
from kai_opt.explain.quota import queue_checks
from kai_opt.explain.shapes import group_need
from kai_opt.explain.unblock import unblock
from kai_opt.explain.victims import analyse_victims
from kai_opt.plan import Reason


def reason_dict(r: Reason) -> dict[str, Any]:
    out: dict[str, Any] = {"code": r.code, "message": r.message}
    if r.details:
        out["details"] = r.details
    return out


def explain_pending(ctx: Context, g: int, *, solve: bool = True) -> dict[str, Any]:
    st = ctx.state
    out: dict[str, Any] = {"reasons": [reason_dict(r) for r in ctx.plan.pending.get(g, [])]}
    if st.pg_problem[g] is not None:
        out["summary"] = [f"{st.pg_problem[g]}: the podgroup cannot be scheduled at all"]
        return out
    sess, placer = ctx.after, ctx.placer
    need = group_need(sess, g)
    out["gang"] = {"min_member": int(st.pg_min_member[g]), "active": need.active, "pending": need.pending,
                   "needed": need.need, "elastic": need.elastic,
                   "subgroups": {st.sg_names[s]: {"min_member": int(st.sg_min_member[s]), "needed": k}
                                 for s, k in sorted(need.sub_need.items())}}
    if not need.shapes:
        out["summary"] = ["no pending pods left to place"]
        return out
    out["nodes"] = node_reasons(placer, need)
    request = need.request(sess)
    out["queue"] = queue_checks(sess, g, request)
    feasible = np.zeros(st.n_nodes, dtype=bool)
    for s in need.shapes:
        feasible |= placer.static_mask(int(st.pod_sig[s.pod]))
    va = analyse_victims(sess, g, request, feasible)
    out["victims"] = va.report
    if solve:
        out["unblock"] = unblock(sess, placer, need, va.units)
    out["summary"] = summary(out)
    return out


def summary(ex: dict[str, Any]) -> list[str]:
    """One line per finding, in the order a reader needs them."""
    lines: list[str] = []
    for n in ex.get("nodes", []):
        who = f"{n['pods']} pod(s) like {n['pod']}" + (f" (subgroup {n['subgroup']})" if n["subgroup"] else "")
        lines.append(f"nodes: {who}: {n['message']}")
    ub = ex.get("unblock", {})
    bf = ub.get("best_fit") or {}
    if bf:
        text = f"gang: {bf['text']}"
        if bf.get("subgroups"):
            text += " (" + ", ".join(f"subgroup {k}: {v['pods']} of {v['needed']}" for k, v in
                                     bf["subgroups"].items()) + ")"
        if bf.get("domains") and bf.get("pods"):
            text += " in " + ", ".join(bf["domains"].values())
        lines.append(text)
    q = ex.get("queue") or {}
    for v in q.get("over_limit", []):
        whose = "its queue" if v["own_queue"] else "ancestor queue"
        res = v["resource"]
        lines.append(f"queue: over limit: {whose} {v['queue']!r} {res} limit {qty(res, v['limit'])}, allocated "
                     f"{qty(res, v['allocated'])} + requested {qty(res, v['requested'])} "
                     f"(over by {qty(res, v['over_by'])})")
    for v in q.get("non_preemptible_over_quota", []):
        res = v["resource"]
        lines.append(f"queue: non-preemptible over quota: {v['queue']!r} {res} quota {qty(res, v['quota'])}, "
                     f"non-preemptible allocated {qty(res, v['allocated_non_preemptible'])} + requested "
                     f"{qty(res, v['requested'])} (over by {qty(res, v['over_by'])})")
    if q and not q.get("within_fair_share", True):
        over = [res for res, e in q["fair_share"].items() if e["allocated"] + e["requested"] > e["fair_share"] + 1e-9]
        res = over[0] if over else "gpu"
        e = q["fair_share"][res]
        lines.append(f"queue: fair share reached: {q['queue']!r} allocated {qty(res, e['allocated'])} + requested "
                     f"{qty(res, e['requested'])} > fair share {qty(res, e['fair_share'])}: it may not reclaim")
    for action, rep in (ex.get("victims") or {}).items():
        lines.append(f"{action}: " + _victim_line(rep))
    topo = ub.get("topology")
    if topo:
        if any(topo["domains"].values()):
            doms = ", ".join(f"{d} {c}/{topo['needed']}" for d, c in topo["domains"].items())
            line = f"topology: no {topo['level']} domain has room for {topo['needed']} pods (pods that fit: {doms})"
        else:
            line = f"topology: no {topo['level']} domain has room for even one of its pods"
        best = topo.get("best")
        if best and best.get("lacks"):
            line += f"; best {best['domain']} lacks: {best['lacks']}"
        lines.append(line)
    if ub:
        if ub.get("fits"):
            lines.append("unblock: it fits on the cluster as this plan leaves it (releases in flight or the "
                         "order of this cycle kept it waiting)")
        for b in ub.get("blocking", []):
            lines.append(f"blocking: {b}")
        for o in ub.get("options", []):
            lines.append(f"unblock ({o['change']}): {o['text']}")
        if not ub.get("fits") and not ub.get("options"):
            lines.append("unblock: no change within the model's reach makes it fit")
    return lines


def _victim_line(rep: dict[str, Any]) -> str:
    if not rep:
        return "nothing to evaluate"
    parts = []
    allowed = rep.get("allowed", True)
    if not allowed:
        why = rep.get("why_not")
        if isinstance(why, dict):
            parts.append(f"not allowed: queue {why['queue']!r} would exceed its "
                         f"{'fair share' if why['bound'] == 'fair_share' else 'quota'}")
        else:
            parts.append(f"not allowed: {why}")
    eligible = "eligible" if allowed else "it could take otherwise"
    labels = {"eligible": eligible, "non_preemptible": "non-preemptible", "min_runtime": "protected by min-runtime",
              "not_lower_priority": "not lower priority",
              "victim_queue_at_or_below_fair_share": "their queue at or below its fair share"}
    for key, label in labels.items():
        e = rep.get(key)
        if e is not None:
            parts.append(f"{e['groups']} group(s) {label} ({e['gpus']:g} GPUs)")
    return "; ".join(parts)
