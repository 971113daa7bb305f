"""A placed podgroup (or pod): where each pod goes, on which GPU devices, bind or pipeline (and which evictions
it waits for), the score terms that decided the node and the best alternatives.

The ranking is recomputed on the cluster as the rest of the plan leaves it, the group's pods placed one by one in
pod order as the plan places them (so a pod sees its siblings), inside the topology domain the group ended up
in — what the greedy placer weighed. For a CP-SAT plan it is the greedy view of the chosen node, next to the
model's packing term.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kai_opt.config import Strategy
from kai_opt.explain.context import Context, apply_plan, node_domain
from kai_opt.explain.scores import Ranking, device_choice, node_entry, rank_nodes, terms
from kai_opt.formulation.objective import TIERS, Objective
from kai_opt.heuristics.gang import _domains, _order_domains
from kai_opt.heuristics.placer import Placer
from kai_opt.heuristics.session import Session
from kai_opt.plan import Placement
from kai_opt.state import R_GPU, PodStatus

TERM_ORDER = ("preferred_affinity", "gpu_sharing", "availability", "resource_type", "other")


def explain_placed(ctx: Context, g: int, *, only: set[int] | None = None, alternatives: int = 3) -> dict[str, Any]:
    st = ctx.state
    placements = ctx.placements_of(g)
    sess = Session(st, ctx.fs, ctx.config)
    apply_plan(sess, ctx.plan, skip={pl.pod for pl in placements})
    placer = Placer(sess)
    masks, topo_info = _domain_masks(ctx, sess, g, placements)
    fragment_sizes = _pending_whole_sizes(ctx)
    pods = []
    for pl in placements:
        p = pl.pod
        if only is None or p in only:
            rk = rank_nodes(placer, p, masks.get(p))
            pods.append(_pod_entry(ctx, placer, pl, rk, alternatives, fragment_sizes))
        devices = tuple(int(st.dev_start[pl.node]) + d for d in pl.devices)
        sess.place(p, pl.node, devices, pipelined=pl.pipelined)
    out: dict[str, Any] = {"pods": pods}
    if topo_info:
        out["topology"] = topo_info
    made_room = [e for e in ctx.plan.evictions if e.beneficiary == g]
    if made_room:
        out["evicted_for_it"] = [{"pod": st.pods[e.pod].key, "reason": e.reason,
                                  "node": st.node_names[int(st.pod_node[e.pod])]} for e in made_room]
    if ctx.plan.engine == "cpsat":
        out["objective"] = _cpsat_terms(ctx, [pl.node for pl in placements])
    return out


def _pod_entry(ctx: Context, placer: Placer, pl: Placement, rk: Ranking, alternatives: int,
               fragment_sizes: list[int]) -> dict[str, Any]:
    st = ctx.state
    p, n = pl.pod, pl.node
    i = rk.index(n)
    entry: dict[str, Any] = {
        "pod": st.pods[p].key, "node": st.node_names[n], "gpu_devices": list(pl.devices),
        "how": "pipeline" if pl.pipelined else "bind",
        "feasible_nodes": len(rk.nodes), "considered_nodes": rk.considered,
    }
    devices = tuple(int(st.dev_start[n]) + d for d in pl.devices)
    entry["devices"] = device_choice(placer, p, n, devices, rk.strategy)
    if pl.pipelined:
        entry["waits_for"] = waits_for(ctx, n)
        entry["pipelined_because"] = _pipeline_cause(ctx, pl, i >= 0 and bool(rk.now[i]), entry["waits_for"])
    if i < 0:
        entry["chosen"] = {"note": "the greedy filter does not accept this node once the rest of the plan is in "
                                   "place (the engine decided it before later placements)"}
    else:
        entry["chosen"] = node_entry(placer, p, rk, i)
        entry["chosen"]["fragmentation"] = _fragmentation(st, p, float(rk.future[i]), rk.main, fragment_sizes)
        entry["decided_by"] = _decided_by(placer, p, rk, i)
    alts = []
    for j in range(len(rk.nodes)):
        if len(alts) >= alternatives:
            break
        if j == i:
            continue
        a = node_entry(placer, p, rk, j)
        a["fragmentation"] = _fragmentation(st, p, float(rk.future[j]), rk.main, fragment_sizes)
        alts.append(a)
    entry["alternatives"] = alts
    topo = int(st.pg_topology[int(st.pod_pg[p])])
    if topo >= 0:
        t = st.topologies[topo]
        entry["domains"] = {lvl: node_domain(st, topo, k, n) for k, lvl in enumerate(t.levels)}
    return entry


def _pipeline_cause(ctx: Context, pl: Placement, fits_now: bool, waits: list[dict[str, Any]]) -> str:
    g = int(ctx.state.pod_pg[pl.pod])
    if not fits_now and waits:
        return "its node has room only once the pods listed leave"
    if any(e.beneficiary == g for e in ctx.plan.evictions):
        return "evictions make room for its group: what they benefit is placed pipeline-only and binds together"
    return "its gang waits for releases elsewhere: a gang binds together (KAI pipelines the whole gang)"


def _decided_by(placer: Placer, p: int, rk: Ranking, i: int) -> str:
    """The first score term that separates the chosen node from the next best one."""
    st = placer.sess.state
    if len(rk.nodes) == 1:
        return "the only node where the pod fits"
    j = 1 if i == 0 else 0
    mine, other = terms(placer, p, rk, i), terms(placer, p, rk, j)
    other_name = st.node_names[int(rk.nodes[j])]
    for t in TERM_ORDER:
        a, b = mine.get(t, 0), other.get(t, 0)
        if a != b:
            verdict = "won" if a > b else "lost"
            return f"{verdict} on {t.replace('_', ' ')} against {other_name} ({a} vs {b})"
    if rk.fine[i] != rk.fine[j]:
        verdict = "won" if rk.fine[i] > rk.fine[j] else "lost"
        if rk.strategy == Strategy.fgd.value:
            return (f"{verdict} on fgd against {other_name}: score {rk.fine[i]:.3g} vs {rk.fine[j]:.3g} (higher: less "
                    "growth of GPU fragmentation and CPU/GPU imbalance)")
        unit = "GPUs" if rk.main == "gpu" else "CPU cores"
        return (f"{verdict} on {rk.strategy} against {other_name}: {rk.free[i]:g} vs {rk.free[j]:g} {unit} free "
                "now")
    verdict = "won" if i < j else "lost"
    return f"{verdict} on node name order against {other_name} (every score equal)"


def _fragmentation(st: Any, p: int, free: float, main: str, sizes: list[int]) -> dict[str, Any]:
    """GPUs the node keeps free after this pod (releases done), and whether a pending whole-GPU size still fits
    in them (stranded: none does)."""
    if main != "gpu":
        return {}
    left = round(free - float(st.pod_req[p, R_GPU]) / 1000.0, 3)
    usable = [s for s in sizes if s <= left]
    out: dict[str, Any] = {"gpus_left": left}
    if left > 0 and sizes:
        out["stranded"] = not usable
    return out


def _pending_whole_sizes(ctx: Context) -> list[int]:
    """Whole-GPU sizes of the pods still pending after the plan."""
    st = ctx.state
    pend = st.pod_status == PodStatus.PENDING
    pend[[pl.pod for pl in ctx.plan.placements if not pl.moved]] = False
    return sorted({int(x) for x in np.unique(st.pod_gpu_whole[pend]).tolist() if x > 0})


def waits_for(ctx: Context, n: int) -> list[dict[str, Any]]:
    """What must leave node n before a pipelined pod binds: the plan's evictions there and pods already being
    deleted there."""
    st = ctx.state
    out = []
    for e in ctx.plan.evictions:
        if int(st.pod_node[e.pod]) == n:
            ben = st.pg_keys[e.beneficiary] if e.beneficiary >= 0 else None
            out.append({"pod": st.pods[e.pod].key, "reason": e.reason, "beneficiary": ben})
    releasing = np.flatnonzero((st.pod_status == PodStatus.RELEASING) & (st.pod_node == n))
    for p in releasing.tolist():
        out.append({"pod": st.pods[p].key, "reason": "being deleted", "beneficiary": None})
    return out


def _domain_masks(ctx: Context, sess: Session, g: int,
                  placements: list[Placement]) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
    """Per pod, the nodes the placer chose among: the required domains (group and sub-groups) the group's pods
    ended up in. Also how the group's required domain ranked among the others (bin-pack order)."""
    st = ctx.state
    masks: dict[int, np.ndarray] = {}
    info: dict[str, Any] = {}
    if not placements:
        return masks, info
    pods = np.array([pl.pod for pl in placements])
    nodes = np.array([pl.node for pl in placements])
    topo, lvl = int(st.pg_topology[g]), int(st.pg_required_level[g])
    if topo >= 0 and lvl >= 0:
        dom = st.topologies[topo].domain[lvl]
        d = int(dom[nodes[0]])
        m = dom == d
        for p in pods.tolist():
            masks[p] = m
        need = float(st.pod_req[pods, R_GPU].sum())
        order = _order_domains(sess, topo, lvl, _domains(sess, topo, lvl, None), need,
                               ctx.config.placement.gpu.value == "spread")
        names = [name for name, _ in order]
        chosen = st.topologies[topo].domain_names[lvl][d]
        future = (sess.alloc[:, R_GPU] - sess.held[:, R_GPU]) / 1000.0
        info = {"topology": st.topologies[topo].name, "required_level": st.topologies[topo].levels[lvl],
                "domain": chosen, "domain_rank": names.index(chosen) + 1 if chosen in names else None,
                "domains": len(names), "domain_free_gpus": round(float(future[m].sum()), 3),
                "gpus_needed": round(need / 1000.0, 3),
                "rule": ("domains in bin-pack order: fewest free GPUs (top level first) that can hold the pods"
                         if ctx.config.placement.gpu.value != "spread" else "domains with the most free GPUs "
                         "first")}
    pref = int(st.pg_preferred_level[g])
    if topo >= 0 and pref >= 0:
        doms = {node_domain(st, topo, pref, int(n)) for n in nodes.tolist()}
        info.setdefault("topology", st.topologies[topo].name)
        info["preferred_level"] = st.topologies[topo].levels[pref]
        info["preferred_met"] = len(doms) == 1 and None not in doms
    for s in sorted({int(x) for x in st.pod_sg[pods].tolist() if x >= 0}):
        cur = s
        while cur >= 0:
            t, lv = int(st.sg_topology[cur]), int(st.sg_required_level[cur])
            if t >= 0 and lv >= 0:
                members = [i for i, p in enumerate(pods.tolist()) if _in_subtree(st, int(st.pod_sg[p]), cur)]
                dom = st.topologies[t].domain[lv]
                m = dom == int(dom[nodes[members[0]]])
                for i in members:
                    p = int(pods[i])
                    masks[p] = m if p not in masks else masks[p] & m
            cur = int(st.sg_parent[cur])
    return masks, info


def _in_subtree(st: Any, s: int, root: int) -> bool:
    while s >= 0:
        if s == root:
            return True
        s = int(st.sg_parent[s])
    return False


def _cpsat_terms(ctx: Context, nodes: list[int]) -> dict[str, Any]:
    """The CP-SAT objective's packing term (tier 3) at the nodes used: fuller nodes (0-10) score higher."""
    st = ctx.state
    used = sorted(set(nodes))
    full = Objective(st, ctx.fs).fullness(np.array(used, dtype=np.int64)).tolist() if used else []
    fullness = {st.node_names[n]: int(f) for n, f in zip(used, full, strict=True)}
    return {"tiers": list(TIERS), "solver": ctx.plan.solver.as_dict(), "packing_fullness": fullness}
