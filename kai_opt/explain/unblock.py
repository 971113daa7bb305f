"""What would unblock a pending podgroup: a minimal change found by a solver (the model: unblock_model.py).

1. base: every hard part on, every relaxation off. Feasible: it fits on the cluster as the plan leaves it.
   Infeasible: CP-SAT's sufficient_assumptions_for_infeasibility names hard parts that block together.
2. best fit: the gang's minimum off, queues off: how many of the pods it needs fit on the nodes at best (per
   sub-group; with a required topology, inside the best domain).
3. each relaxation kind alone, minimising its amount: "evict these 2 pods of queue X", "2 more GPUs free in one
   rack", "queue limit +4 GPUs", "minMember 6 instead of 8", ...; a kind that is not enough alone is skipped.
4. when no kind suffices alone: all together, minimising a weighted sum.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.explain.context import qty
from kai_opt.explain.shapes import Need
from kai_opt.explain.unblock_model import FAMILIES, QSCALE, WEIGHT, UnblockModel
from kai_opt.explain.victims import Unit
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import DEV, Session
from kai_opt.state.resources import QR

OK = (cp_model.OPTIMAL, cp_model.FEASIBLE)
WORKLOAD = ("minmember", "topology")  # relaxations that change the workload rather than the cluster
PROTECTED = {"min_runtime": "younger than the min runtime", "action_disabled": "the action is disabled",
             "victim_queue_at_or_below_fair_share": "its queue is at or below its fair share",
             "reclaimer_over_fair_share": "the pending queue is at its fair share"}


def unblock(sess: Session, placer: Placer, need: Need, units: list[Unit]) -> dict[str, Any]:
    t0 = time.perf_counter()
    um = UnblockModel(sess, placer, need, units)
    out: dict[str, Any] = {"model": {"node_classes": len(um.cls.rep), "nodes": int(um.cls.count.sum()),
                                     "victim_units": len(units), "variables": len(um.m.proto.variables),
                                     "constraints": len(um.m.proto.constraints)}}
    core = list(um.core.values())
    lv_true, lv_false = um.default_levels()
    fams = list(um.fam.values())
    status, solver = um.solve(core + lv_true, lv_false + fams)
    out["fits"] = status in OK
    if status == cp_model.INFEASIBLE:
        out["blocking"] = _core(um, solver)
    out["best_fit"] = best_fit(um)
    if um.topos and not out["fits"] and out["best_fit"].get("pods", 0) < need.need:
        out["topology"] = domain_fit(um)
    options: list[dict[str, Any]] = []
    if not out["fits"]:
        alone = set()
        for fam in _applicable(um):
            if fam == "topology":
                found = _topology_options(um)
                options += found
                alone |= {"topology"} if found else set()
                continue
            others = [um.fam[f] for f in FAMILIES if f != fam]
            status, solver = um.solve(core + lv_true + [um.fam[fam]], lv_false + others, _cost(um, fam))
            if status in OK:
                options.append(describe(um, solver, [fam]))
                alone.add(fam)
        # the cheapest mix of the kinds that are not enough alone, e.g. more room and a higher limit; changes to
        # the workload itself (minMember, topology) join only when nothing else worked
        mix = [f for f in _applicable(um) if f not in alone and (not options or f not in WORKLOAD)]
        if len(mix) > 1 or (not options and mix):
            rest = [lit for name, lit in um.core.items() if not name.startswith("topology")]
            off = [um.fam[f] for f in FAMILIES if f not in mix]
            if "topology" not in mix:
                rest += lv_true
                off += lv_false
            status, solver = um.solve(rest, off, _combined_cost(um, mix))
            if status in OK:
                used = [f for f in FAMILIES if f in mix and _used(um, solver, f)]
                if len(used) > 1 or not options:
                    options.append(describe(um, solver, used))
    out["options"] = options
    out["model"]["seconds"] = round(time.perf_counter() - t0, 3)
    return out


def _cost(um: UnblockModel, fam: str) -> Any:
    terms = um.cost.get(fam, [])
    return sum(terms) if terms else None


def _applicable(um: UnblockModel) -> list[str]:
    """The relaxation kinds that can change anything for this group (others are not solved)."""
    out = []
    for fam in FAMILIES:
        if fam == "topology":
            ok = bool(um.topos)
        elif fam == "affinity":
            ok = any(not um.cls.static[si, k] for si, k in um.x)
        elif fam == "minmember":
            ok = um.need.need > 1 or any(k > 1 for k in um.need.sub_need.values())
        else:
            ok = bool(um.cost.get(fam))
        if ok:
            out.append(fam)
    return out


def _used(um: UnblockModel, solver: cp_model.CpSolver, fam: str) -> bool:
    """Whether a solution relaxes `fam` at all."""
    if fam == "topology":
        return any(not solver.boolean_value(um.lev[ci][t.level]) for ci, t in enumerate(um.topos))
    if fam == "affinity":
        return any(not um.cls.static[si, k] and solver.value(x) > 0 for (si, k), x in um.x.items())
    cost = _cost(um, fam)
    return cost is not None and solver.value(cost) > 0


def _combined_cost(um: UnblockModel, fams: list[str] | None = None) -> Any:
    total: Any = 0
    for fam in fams if fams is not None else FAMILIES:
        if fam == "topology":
            for ci, t in enumerate(um.topos):
                levs = um.lev[ci]
                total += WEIGHT[fam] * (sum((t.level - lv) * lit for lv, lit in enumerate(levs))
                                        + (t.level + 1) * (1 - sum(levs)))
            continue
        if fam == "affinity":
            total += WEIGHT[fam] * um.fam[fam]
            continue
        c = _cost(um, fam)
        if c is not None:
            total += WEIGHT[fam] * c
    return total


def _core(um: UnblockModel, solver: cp_model.CpSolver) -> list[str]:
    names = {lit.Index(): name for name, lit in um.core.items()}
    out = []
    for i in solver.sufficient_assumptions_for_infeasibility():
        if i in names:
            out.append(_core_text(um, names[i]))
    return out


def _core_text(um: UnblockModel, name: str) -> str:
    st = um.st
    kind, _, rest = name.partition(":")
    if kind == "gang":
        n = um.need.need
        return (f"the gang's minimum: {n} more pod{'s' if n != 1 else ''}" if not um.need.elastic
                else "one more pod of the elastic group") + " on the nodes (capacity)"
    if kind in ("limit", "quota"):
        q, r = rest.rsplit(":", 1)
        what = "limit" if kind == "limit" else "deserved quota (non-preemptible work)"
        return f"queue {q!r} {QR[int(r)]} {what}"
    t = um.topos[int(rest)]
    return f"{t.name}: required {st.topologies[t.topo].levels[t.level]} (one domain)"


def best_fit(um: UnblockModel) -> dict[str, Any]:
    """How many of the pods the gang needs fit at best on the nodes (queues not counted)."""
    m, need = um.m, um.need
    lv_true, lv_false = um.default_levels()
    y = m.new_int_var(0, need.need, "useful")
    m.add(y <= um.placed)
    ys = {}
    for sg, tot in um.sub_total.items():
        ys[sg] = m.new_int_var(0, need.sub_need[sg], f"useful[{sg}]")
        m.add(ys[sg] <= tot)
    weight = sum(need.sub_need.values()) + 1
    off = [lit for name, lit in um.core.items() if name != "gang" and not name.startswith("topology")]
    status, solver = um.solve(lv_true, [um.core["gang"], *off, *um.fam.values(), *lv_false],
                              weight * y + sum(ys.values()), maximize=True)
    if status not in OK:
        return {}
    fit = int(solver.value(y))
    out: dict[str, Any] = {"pods": fit, "needed": need.need,
                           "text": (f"all {need.need} pods it needs fit on the nodes" if fit >= need.need else
                                    f"only {fit} of {need.need} pods fit" if fit else
                                    f"none of the {need.need} pods it needs fits")}
    if ys:
        out["subgroups"] = {um.st.sg_names[sg]: {"pods": int(solver.value(v)), "needed": need.sub_need[sg]}
                            for sg, v in ys.items()}
    doms = _domains_used(um, solver)
    if doms:
        out["domains"] = doms
    return out


def domain_fit(um: UnblockModel, top: int = 5) -> dict[str, Any]:
    """For the first required topology constraint: pods that fit now in each domain (exact for one pod shape, at
    most otherwise), the best domains first, and what the best one lacks (its cheapest capacity relaxation)."""
    st, cls, need = um.st, um.cls, um.need
    t = um.topos[0]
    dom = cls.domains[(t.topo, t.level)]
    names = st.topologies[t.topo].domain_names[t.level]
    fit = np.zeros(len(names), dtype=np.int64)
    promise = np.zeros(len(names), dtype=np.int64)  # pods with the domain's GPUs all free
    ok = dom >= 0
    for si in t.shapes:
        per = np.where(cls.static[si], cls.count * cls.cap_now[si], 0)
        most = np.where(cls.static[si], cls.count * cls.cap_max[si], 0)
        fit += np.minimum(np.bincount(dom[ok], weights=per[ok], minlength=len(names)).astype(np.int64),
                          len(need.shapes[si].pods))
        promise += np.bincount(dom[ok], weights=most[ok], minlength=len(names)).astype(np.int64)
    fit = np.minimum(fit, need.need)
    present = np.unique(dom[ok])  # the domains the model kept (classes.DOMAINS_KEPT most promising)
    order = present[np.lexsort((present, -promise[present], -fit[present]))][:top]
    out: dict[str, Any] = {"constraint": t.name, "level": st.topologies[t.topo].levels[t.level],
                           "needed": need.need, "domains": {names[d]: int(fit[d]) for d in order.tolist()}}
    if t.fixed >= 0:
        out["fixed_domain"] = names[t.fixed]
    if len(order):
        best = int(order[0])
        o = um.dom.get((0, t.level, best))
        if o is not None:
            lv_true, lv_false = um.default_levels()
            others = [um.fam[f] for f in FAMILIES if f != "capacity"]
            status, solver = um.solve(list(um.core.values()) + lv_true + [o, um.fam["capacity"]], lv_false + others,
                                      _cost(um, "capacity"))
            if status in OK:
                text, det = _capacity_text(um, solver)
                out["best"] = {"domain": names[best], "pods": int(fit[best]), "lacks": text or None,
                               "details": det}
            else:
                usable = (dom == best) & cls.static[t.shapes].any(axis=0)
                have = int((cls.count * cls.gpus)[usable].sum())
                want = sum(need.shapes[si].gpu_milli for si in t.shapes) / max(1, len(t.shapes)) * need.need / 1000
                out["best"] = {"domain": names[best], "pods": int(fit[best]),
                               "lacks": f"room: it cannot hold them even with all its GPUs free ({have} GPUs on "
                                        f"nodes its pods may use, about {want:g} needed)"}
    return out


def _domains_used(um: UnblockModel, solver: cp_model.CpSolver) -> dict[str, str]:
    st = um.st
    out = {}
    for (ci, lv, d), o in um.dom.items():
        t = um.topos[ci]
        if lv == t.level and solver.boolean_value(um.lev[ci][lv]) and solver.boolean_value(o):
            out[t.name] = st.topologies[t.topo].domain_names[lv][d]
    return out


def _topology_options(um: UnblockModel) -> list[dict[str, Any]]:
    """Per required topology constraint: the closest wider level (or none) that lets the group fit."""
    out = []
    core_rest = [lit for name, lit in um.core.items() if not name.startswith("topology")]
    others = [um.fam[f] for f in FAMILIES]
    for ci, t in enumerate(um.topos):
        for lv in [*range(t.level - 1, -1, -1), None]:
            lv_true, lv_false = um.default_levels({ci: lv})
            status, solver = um.solve(core_rest + lv_true, lv_false + others)
            if status in OK:
                opt = describe(um, solver, ["topology"])
                levels = um.st.topologies[t.topo].levels
                if lv is None:
                    opt["text"] = f"{t.name}: without its required {levels[t.level]} (spread over domains)"
                else:
                    dom = [um.st.topologies[t.topo].domain_names[lv][d] for (c, level, d), o in um.dom.items()
                           if c == ci and level == lv and solver.boolean_value(o)]
                    opt["text"] = (f"{t.name}: required level {levels[lv]} instead of {levels[t.level]} "
                                   f"(fits in {dom[0] if dom else 'one domain'})")
                opt["details"] = {"constraint": t.name, "level": levels[lv] if lv is not None else None}
                out.append(opt)
                break
    return out


def describe(um: UnblockModel, solver: cp_model.CpSolver, fams: list[str]) -> dict[str, Any]:
    """One option as text lines (and details) from a solution."""
    parts: list[str] = []
    details: dict[str, Any] = {}
    for fam in fams:
        fn = _DESCRIBE.get(fam)
        if fn is None:
            continue
        text, det = fn(um, solver)
        if text:
            parts.append(text)
            details[fam] = det
    return {"change": "+".join(fams), "text": "; ".join(parts), "details": details}


def _evict_text(um: UnblockModel, solver: cp_model.CpSolver) -> tuple[str, Any]:
    st = um.st
    chosen = [u for u, e in zip(um.units, um.e, strict=True) if solver.boolean_value(e)]
    if not chosen:
        return "", None
    by: dict[tuple[str, str, str | None], list[str]] = defaultdict(list)
    for u in chosen:
        by[(u.action, st.q_names[int(st.pg_queue[u.group])], u.protected)] += [st.pods[p].key for p in u.pods]
    texts = []
    for (action, q, protected), pods in by.items():
        how = action if protected is None else f"{action} would not: {PROTECTED[protected]}"
        texts.append(f"evict {len(pods)} pod{'s' if len(pods) > 1 else ''} of queue {q!r} ({how}): "
                     f"{', '.join(pods[:6])}{' ...' if len(pods) > 6 else ''}")
    return "; ".join(texts), [{"action": a, "queue": q, "protected": pr, "pods": pods}
                              for (a, q, pr), pods in by.items()]


def _capacity_text(um: UnblockModel, solver: cp_model.CpSolver) -> tuple[str, Any]:
    st, cls = um.st, um.cls
    gpu_milli, cpu_milli, nodes = 0, 0, []
    for k, (w, s, c) in um.cap_terms.items():
        w_v, s_v, c_v = (int(solver.value(e)) if not isinstance(e, int) else e for e in (w, s, c))
        if w_v or s_v or c_v:
            gpu_milli += w_v * DEV + s_v
            cpu_milli += c_v
            n = int(cls.rep[k])
            nodes.append({"node": st.node_names[n], "like_it": int(cls.count[k]),
                          "gpus": int(cls.gpus[k]), "free_gpus": int(um.sess.whole_future[n]),
                          "more_gpus": round((w_v * DEV + s_v) / DEV, 3), "more_cpu_cores": round(c_v / 1000, 3)})
    if not (gpu_milli or cpu_milli):
        return "", None
    amount = []
    if gpu_milli:
        amount.append(f"{gpu_milli / DEV:g} more GPU{'s' if gpu_milli != DEV else ''}")
    if cpu_milli:
        amount.append(f"{cpu_milli / 1000:g} more CPU cores")
    where = " free on nodes that match"
    doms = _domains_used(um, solver)
    if doms:
        level = um.st.topologies[um.topos[0].topo].levels[um.topos[0].level].rsplit("/", 1)[-1]
        where = f" free in one {level} ({', '.join(doms.values())})"
    example = max(nodes, key=lambda e: e["more_gpus"] + e["more_cpu_cores"])
    text = " and ".join(amount) + where + f", e.g. on {example['node']} ({example['free_gpus']} of " \
        f"{example['gpus']} GPUs free now)"
    return text, {"gpus": gpu_milli / DEV, "cpu_cores": cpu_milli / 1000, "nodes": nodes, "domains": doms}


def _quantity_text(um: UnblockModel, solver: cp_model.CpSolver, fam: str) -> tuple[str, Any]:
    st = um.st
    texts, det = [], []
    for (a, r), v in um.relax_vars.get(fam, []):
        val = int(solver.value(v))
        if val <= 0:
            continue
        amount = val / QSCALE[r]
        shown = qty(QR[r], amount)
        what = "limit" if fam == "limit" else "deserved quota"
        texts.append(f"queue {st.q_names[a]!r} {what} +{shown}")
        det.append({"queue": st.q_names[a], "resource": QR[r], "increase": amount,
                    "current": float((um.sess.fs.limit if fam == "limit" else um.sess.fs.deserved)[a, r])})
    if texts and fam == "quota":
        texts[-1] += " (or make the workload preemptible)"
    return "; ".join(texts), det


def _minmember_text(um: UnblockModel, solver: cp_model.CpSolver) -> tuple[str, Any]:
    st, need = um.st, um.need
    g = need.group
    texts, det = [], []
    for sg, v in um.relax_vars.get("minmember", []):
        val = int(solver.value(v))
        if val <= 0:
            continue
        if sg is None:
            cur = int(st.pg_min_member[g])
            texts.append(f"minMember {cur - val} instead of {cur}")
            det.append({"subgroup": None, "min_member": cur - val, "current": cur})
        else:
            cur = int(st.sg_min_member[sg])
            texts.append(f"subgroup {st.sg_names[sg]} minMember {cur - val} instead of {cur}")
            det.append({"subgroup": st.sg_names[sg], "min_member": cur - val, "current": cur})
    return "; ".join(texts), det


def _affinity_text(um: UnblockModel, solver: cp_model.CpSolver) -> tuple[str, Any]:
    st, cls = um.st, um.cls
    why: dict[str, int] = defaultdict(int)
    for (si, k), x in um.x.items():
        if not cls.static[si, k] and solver.value(x) > 0:
            n = int(cls.rep[k])
            sig = st.sigs[int(st.pod_sig[um.need.shapes[si].pod])]
            reason = sig.first_failure(st.node_labels[n], st.node_taints[n], st.node_names[n]) or "excluded"
            why[reason] += int(np.ceil(solver.value(x) / max(1, int(cls.cap_max[si, k]))))
    if not why:
        return "", None
    text = "accept nodes it now excludes: " + ", ".join(f"~{c} node(s) that {r}" for r, c in why.items())
    return text, dict(why)


def _topology_text(um: UnblockModel, solver: cp_model.CpSolver) -> tuple[str, Any]:
    texts, det = [], []
    for ci, t in enumerate(um.topos):
        levels = um.st.topologies[t.topo].levels
        used = [lv for lv, lit in enumerate(um.lev[ci]) if solver.boolean_value(lit)]
        if used and used[0] == t.level:
            continue
        texts.append(f"{t.name}: required level {levels[used[0]]} instead of {levels[t.level]}" if used else
                     f"{t.name}: without its required {levels[t.level]}")
        det.append({"constraint": t.name, "level": levels[used[0]] if used else None})
    return "; ".join(texts), det


_DESCRIBE = {
    "topology": _topology_text,
    "evict": _evict_text,
    "capacity": _capacity_text,
    "limit": lambda um, s: _quantity_text(um, s, "limit"),
    "quota": lambda um, s: _quantity_text(um, s, "quota"),
    "minmember": _minmember_text,
    "affinity": _affinity_text,
}
