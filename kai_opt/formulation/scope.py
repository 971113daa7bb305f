"""What one model covers: the pending groups (in queue order, up to a pod budget), their pod shapes, the nodes
each shape may use, and the running pods that may be evicted for them.

Pods of one group with identical requests, GPU needs, scheduling signature and sub-group form a shape with a
count, so the model decides counts per (shape, node), never one boolean per pod and node. Candidate nodes of a
shape are capped: the nodes the greedy plan used, then the best-fitting others, then nodes where evictions could
make room.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kai_opt.fairshare.reclaim import can_reclaim, fits_strategy, leveled
from kai_opt.heuristics.actions import Actions
from kai_opt.heuristics.session import ACTIVE, Session
from kai_opt.heuristics.tasks import group_shape, pending_mask
from kai_opt.heuristics.victims import protected_by_min_runtime
from kai_opt.plan import Plan
from kai_opt.state import R_GPU, PodStatus

# config solver.keep_greedy_groups (default true): every group the greedy placed stays placed (the model may move
# it). False lets the model drop some for more priority-weighted GPUs (fragmentation-100-s0: 719 GPUs instead of
# 707), but then conformance with KAI falls from 147 to 139 of 154 (KAI's queue order is the rule there): measured,
# see docs/DESIGN-NOTES.md.
# (shape, candidate node) pairs in one model. 10,000 rather than 40,000 (measured 2026-12-01, 8 s solves of the
# tier-1 objective, one per quality instance at 100 and 1,000 nodes): at 100 nodes the models are the same or
# reach the same value, at 1,000 nodes the wider models were 2-3x larger and slower (topology-1000-s0: the
# improvement over the greedy plan found at 0.6 s instead of 4.5 s; gangs-1000-s1: no solution at all in 8 s, not
# even the hint, with 40,000). 5,000 lost value on fragmentation-100 (1,487k vs 1,529k tier-1).
PAIR_BUDGET = 10_000


@dataclass
class Shape:
    """Identical pending pods of one group (and sub-group)."""

    group: int
    subgroup: int  # global sub-group index, -1 = none
    pods: list[int]  # pending pods, task order
    kind: str  # "whole" | "share" | "none"
    gpus: int  # whole devices per pod
    share: int  # milli-GPU per device (shares); gpu-memory pods are converted per node
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # candidate nodes


@dataclass
class GroupScope:
    group: int
    queue: int
    shapes: list[int]  # indexes into Scope.shapes
    need: int  # pods still needed to reach minMember (0: satisfied already, elastic extras only)
    sub_need: dict[int, int]  # leaf sub-group -> pods still needed for its minMember
    preemptible: bool
    priority: int
    rank: int  # position in queue order (0 = first)
    topology: int
    required_level: int
    preferred_level: int
    fixed_domain: int  # required-level domain its active pods already sit in (-1: free)


@dataclass
class Victim:
    """A running unit that may be evicted: one elastic pod above a group's minimum, or a group's core."""

    group: int
    pods: list[int]
    core: bool
    beneficiaries: list[int]  # scope group indexes allowed to benefit (preempt: same queue, higher priority;
    # reclaim: other queues allowed to reclaim)
    reason_for: dict[int, str]  # beneficiary -> "preempt" | "reclaim"


@dataclass
class Scope:
    groups: list[GroupScope]
    shapes: list[Shape]
    victims: list[Victim]
    nodes: np.ndarray  # all model nodes
    excluded: list[int]  # pending groups left out (window, pod affinity, problems)
    notes: list[str]
    keep: dict[int, int] = field(default_factory=dict)  # scope group -> pods the greedy plan placed (kept at least)
    pools: list[list[int]] = field(default_factory=list)  # shapes that share placement variables (first = key)


def _shape_key(sess: Session, p: int) -> tuple:
    st = sess.state
    return (int(st.pod_sg[p]), tuple(st.pod_req[p].tolist()), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]),
            int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p]), int(st.pod_sig[p]))


def build_scope(sess: Session, acts: Actions, greedy: Plan, *, max_pods: int, per_shape_nodes: int = 24) -> Scope:
    st = sess.state
    notes: list[str] = []
    ready = acts.pending_groups()
    # queue order of the greedy's allocate pass: a group's rank is its first placement turn, others last
    order = {g: i for i, g in enumerate(dict.fromkeys(int(st.pod_pg[p.pod]) for p in greedy.placements))}
    ready.sort(key=lambda g: (order.get(g, math.inf), -int(st.pg_priority[g]), st.pg_keys[g]))
    groups: list[GroupScope] = []
    shapes: list[Shape] = []
    excluded: list[int] = []
    budget = max_pods
    greedy_nodes: dict[int, set[int]] = {}
    for pl in greedy.placements:
        if not pl.moved:
            greedy_nodes.setdefault(pl.pod, set()).add(pl.node)
    for g in ready:
        pods = st.group_pods(g)
        pend = pods[pending_mask(sess, pods)]
        if any(st.pods[p].pod_affinity or st.pods[p].pod_anti_affinity for p in pend.tolist()):
            excluded.append(g)
            continue
        if len(pend) > budget:
            excluded.append(g)
            continue
        budget -= len(pend)
        shape = group_shape(sess, g)
        active = np.isin(sess.status[pods], ACTIVE)
        need = max(0, int(st.pg_min_member[g]) - int(active.sum()))
        sub_need = {s: max(0, int(st.sg_min_member[s]) - int(np.isin(sess.status[sp], ACTIVE).sum()))
                    for s, sp in shape.leaves}
        by_key: dict[tuple, list[int]] = {}
        for p in pend.tolist():
            by_key.setdefault(_shape_key(sess, p), []).append(p)
        idx = []
        for key, members in by_key.items():
            p0 = members[0]
            kind = "whole" if st.pod_gpu_whole[p0] else ("share" if (st.pod_gpu_frac[p0] or st.pod_gpu_mem[p0])
                                                          else "none")
            idx.append(len(shapes))
            shapes.append(Shape(g, key[0], members, kind, int(st.pod_gpu_whole[p0]), int(st.pod_gpu_frac[p0])))
        topo = int(st.pg_topology[g])
        req_lvl = int(st.pg_required_level[g])
        fixed = -1
        if topo >= 0 and req_lvl >= 0 and active.any():
            doms = {int(st.topologies[topo].domain[req_lvl][int(sess.node[p])]) for p in pods[active].tolist()}
            fixed = doms.pop() if len(doms) == 1 else -2
        groups.append(GroupScope(g, int(st.pg_queue[g]), idx, need, sub_need, bool(st.pg_preemptible[g]),
                                 int(st.pg_priority[g]), len(groups), topo, req_lvl,
                                 int(st.pg_preferred_level[g]), fixed))
    if excluded:
        notes.append(f"{len(excluded)} pending podgroups outside the model (pod affinity or the "
                     f"{max_pods}-pod window); the greedy plan decides them")
    victims = _victims(sess, groups, {e.pod for e in greedy.evictions})
    # improve on the greedy plan, never against it: what it places stays placed (maybe elsewhere), and only pods it
    # evicts may be evicted (fewer is better). The greedy's consolidation moves are part of the session already
    # (apply_consolidation), so the groups they made room for are held like any other.
    evicted = {e.pod: e for e in greedy.evictions}
    victims = [v for v in victims if all(p in evicted for p in v.pods)]
    # the greedy judged its reclaim and preempt rules as the cycle went on: a beneficiary it chose is allowed
    scope_index = {gs.group: i for i, gs in enumerate(groups)}
    for v in victims:
        for p in v.pods:
            e = evicted[p]
            j = scope_index.get(e.beneficiary)
            if j is not None and e.reason in ("reclaim", "preempt") and j not in v.reason_for:
                v.beneficiaries.append(j)
                v.reason_for[j] = e.reason
    placed_count: dict[int, int] = {}
    for pl in greedy.placements:
        if not pl.moved:
            g = int(st.pod_pg[pl.pod])
            placed_count[g] = placed_count.get(g, 0) + 1
    replayed_for = {e.beneficiary for e in replayed_evictions(st, greedy)}
    keep = {i: placed_count[gs.group] for i, gs in enumerate(groups)
            if gs.group in placed_count and (sess.cfg.solver.keep_greedy_groups or gs.group in replayed_for)}
    # candidate nodes per shape: as many as a budget of (shape, node) pairs allows, at least per_shape_nodes. Wider
    # is what lets the model re-arrange the greedy's placements (fragmentation-100: 797 GPUs with every node a
    # candidate, 707 = the greedy's with 24)
    pools = shape_pools(sess, groups, shapes)
    cap = max(per_shape_nodes, PAIR_BUDGET // max(1, len(pools)))
    _candidate_nodes(sess, acts, shapes, pools, greedy_nodes, victims, cap)
    model_nodes = np.unique(np.concatenate([s.nodes for s in shapes])) if shapes else np.zeros(0, dtype=np.int64)
    in_model = set(model_nodes.tolist())
    victims = [v for v in victims if any(int(sess.node[p]) in in_model for p in v.pods)]
    return Scope(groups, shapes, victims, model_nodes, excluded, notes, keep, pools)


def shape_pools(sess: Session, groups: list[GroupScope], shapes: list[Shape]) -> list[list[int]]:
    """Shapes of different groups whose pods are interchangeable on every node (same requests, GPU needs and
    scheduling signature) share one count per node: the model then decides per (pool, node) and per shape how
    many of its pods go, so identical gangs cost one set of node variables (fragmentation-1000: about 1,000 shapes
    in 5 pools). A shape of a group with a required topology level keeps its own (the domain is the group's)."""
    by_key: dict[tuple, list[int]] = {}
    pools: list[list[int]] = []
    for gs in groups:
        own = gs.topology >= 0 and gs.required_level >= 0
        for s in gs.shapes:
            if own:
                pools.append([s])
                continue
            key = _shape_key(sess, shapes[s].pods[0])[1:]  # the sub-group does not change where a pod fits
            if key not in by_key:
                by_key[key] = []
                pools.append(by_key[key])
            by_key[key].append(s)
    return pools


def replayed_evictions(st, greedy: Plan) -> list:
    """The greedy evictions the model takes as given: consolidation, victims that were moved (reclaim and preempt
    re-place victims that fit elsewhere), every eviction on a node a moved pod lands on (the move counts on that
    room), and the rest of any group one of those belongs to (a victim keeps its minimum or goes whole)."""
    moved = [pl for pl in greedy.placements if pl.moved]
    if not moved and not any(e.reason == "consolidate" for e in greedy.evictions):
        return []
    moved_pods = {pl.pod for pl in moved}
    landing = {pl.node for pl in moved}
    groups = {int(st.pod_pg[e.pod]) for e in greedy.evictions
              if e.reason == "consolidate" or e.pod in moved_pods or int(st.pod_node[e.pod]) in landing}
    return [e for e in greedy.evictions if int(st.pod_pg[e.pod]) in groups]


def apply_consolidation(sess: Session, greedy: Plan) -> None:
    """Replay the greedy plan's moves (consolidation, and victims of reclaim or preempt that were re-placed) and
    their evictions on a fresh session: the model and the decoder start from there, so the room the moves made is
    there for the model too, and the groups they made room for stay placed (Scope.keep)."""
    st = sess.state
    for e in replayed_evictions(st, greedy):
        sess.evict(e.pod, e.reason, e.beneficiary)
    for pl in greedy.placements:
        if pl.moved:
            base = int(st.dev_start[pl.node])
            sess.place(pl.pod, pl.node, tuple(base + d for d in pl.devices), pipelined=True, moved=True)


def _victims(sess: Session, groups: list[GroupScope], candidates: set[int]) -> list[Victim]:
    """Running units some scoped group may evict, with the rule that allows it (KAI's preempt and reclaim), among
    the groups of the `candidates` pods (the greedy plan's victims)."""
    st, fs = sess.state, sess.fs
    if not groups:
        return []
    reclaimers: dict[int, bool] = {}
    requests = {i: _min_request(sess, gs) for i, gs in enumerate(groups)}
    for i, gs in enumerate(groups):
        reclaimers[i] = sess.cfg.actions.reclaim and can_reclaim(fs, sess.ledger, gs.queue, requests[i],
                                                                  preemptible=gs.preemptible)
    out: list[Victim] = []
    rule: dict[tuple[int, int], bool] = {}  # (scope group, victim queue) -> reclaim allowed at cycle start
    bound_now = (sess.status == PodStatus.BOUND) & (st.pod_pg >= 0)
    wanted = {int(st.pod_pg[p]) for p in candidates if bound_now[p]}
    running_groups = sorted(set(st.pod_pg[bound_now].tolist()) & wanted)
    for v in running_groups:
        if not st.pg_preemptible[v]:
            continue
        vq = int(st.pg_queue[v])
        bens: dict[int, str] = {}
        protected: dict[str, bool] = {}

        def is_protected(reason: str, v: int = v, protected: dict[str, bool] = protected) -> bool:
            if reason not in protected:
                protected[reason] = protected_by_min_runtime(sess, v, reason)
            return protected[reason]

        for i, gs in enumerate(groups):
            if gs.group == v:
                continue
            if gs.queue == vq:
                if (sess.cfg.actions.preempt and gs.priority > int(st.pg_priority[v])
                        and not is_protected("preempt")):
                    bens[i] = "preempt"
            elif reclaimers[i] and not is_protected("reclaim"):
                # compared where the two queue paths diverge (KAI's leveled queues): the victim side must be above
                # its allocatable share, or above deserved while the reclaimer side stays within its own
                # (MaintainFairShare / GuaranteeDeservedQuota), checked at cycle start; the same for every victim
                # of one queue (memoised: openb-1000 took 17 s here)
                key = (i, vq)
                if key not in rule:
                    rq, wq = leveled(sess.ledger, gs.queue, vq)
                    rule[key] = fits_strategy(fs, sess.ledger, requests[i], rq, wq, sess.ledger.allocated[wq])
                if rule[key]:
                    bens[i] = "reclaim"
        if not bens:
            continue
        pods = st.group_pods(v)
        bound = pods[sess.status[pods] == PodStatus.BOUND].tolist()
        m = int(st.pg_min_member[v])
        extras = bound[m:] if len(bound) > m else []
        core = bound[:m] if len(bound) > m else bound
        for p in reversed(extras):
            out.append(Victim(v, [p], False, list(bens), bens))
        if core:
            out.append(Victim(v, core, True, list(bens), bens))
    return out


def _min_request(sess: Session, gs: GroupScope) -> np.ndarray:
    st = sess.state
    pods = st.group_pods(gs.group)
    pend = pods[pending_mask(sess, pods)][: max(1, gs.need)]
    return sess.queue_request(pend.tolist()).sum(axis=0) if len(pend) else np.zeros(3)


def _candidate_nodes(sess: Session, acts: Actions, shapes: list[Shape], pools: list[list[int]],
                     greedy_nodes: dict[int, set[int]], victims: list[Victim], cap: int) -> None:
    """Candidate nodes per pool (every shape of a pool gets the same): the nodes the greedy used for them, the
    best-fitting others, and nodes where evictions could make room, up to `cap` (or 4 per pod)."""
    st = sess.state
    placer = acts.placer
    victim_nodes = np.zeros(st.n_nodes, dtype=bool)
    for v in victims:
        for p in v.pods:
            victim_nodes[int(sess.node[p])] = True
    future = sess.alloc - sess.held
    for pool in pools:
        s = shapes[pool[0]]
        p = s.pods[0]
        static = placer.static_mask(int(st.pod_sig[p]))
        cand = np.nonzero(static)[0]
        if len(cand) == 0:
            for k in pool:
                shapes[k].nodes = cand
            continue
        _, fits = placer.fit(p, cand)
        ok = fits | victim_nodes[cand]
        cand = cand[ok]
        hinted = sorted({n for k in pool for q in shapes[k].pods for n in greedy_nodes.get(q, ())})
        limit = max(cap, 4 * sum(len(shapes[k].pods) for k in pool))
        if len(cand) > limit:
            col = R_GPU if s.kind != "none" else 0
            free = future[cand, col]
            fitting = cand[np.argsort(free, kind="stable")]  # best fit first (fewest free that still fit)
            chosen = list(dict.fromkeys(hinted + fitting[:limit].tolist() + cand[victim_nodes[cand]][:limit].tolist()))
            cand = np.array(chosen, dtype=np.int64)
        else:
            cand = np.array(sorted(set(cand.tolist()) | set(hinted)), dtype=np.int64)
        for k in pool:
            shapes[k].nodes = cand
