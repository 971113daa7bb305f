"""The pattern plan: a starting plan from a model over node classes, for the cycle's whole-GPU and CPU-only work.

Nodes that the cycle's pending shapes see alike (the same scheduling class, and the same count of each shape
fitting alone in their free room) form one class; a pattern is a multiset of pending shapes that fits the smallest
free room of a class's nodes, with no shape left that would still fit. One small CP-SAT model chooses how many of a
class's nodes take each pattern and which groups are placed, so packing decisions are made over classes and counts,
never per pod and node (Borg's equivalence classes; a cutting-stock pattern model). The greedy cycle then runs again
guided by it: each pod of a chosen group tries the nodes of the class the model gave its shape first, and the
checker and the plan choice judge the result like any other plan.

Only work whose fit is the room of one node takes part: groups whose pending pods need whole GPUs or none, without
GPU shares, sub-groups, topology constraints, pod (anti-)affinity or resource claims, all of them placed by the
starting plan or none, and none onto room being released. Everything else keeps the starting plan's decisions
(moves and evictions included), which the classes' room leaves out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.formulation.objective import Objective
from kai_opt.formulation.scope import apply_consolidation, apply_fixed
from kai_opt.heuristics.cycle import greedy_plan
from kai_opt.heuristics.nodefilter import NodeFilter
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan
from kai_opt.state import ClusterState, PodStatus

PATTERN_CAP = 1_000  # patterns over all classes: beyond it the cycle's shapes mix too freely for this model
MAX_SHAPES = 16  # pending shapes: more, and the patterns explode (the gangs family has 46 at 1,000 nodes)
VISITS_PER_PATTERN = 20  # the pattern walk gives up after this many steps per pattern allowed
MODEL_SHARE = 0.1  # of the time budget, the most the pattern model's search may take


@dataclass
class PatternModel:
    """What the model decided: per chosen group's pod, the node mask of its class (the guide), and its counts."""

    guide: dict[int, np.ndarray] = field(default_factory=dict)
    chosen: list[int] = field(default_factory=list)  # groups the model places that the starting plan does not
    classes: int = 0
    patterns: int = 0
    status: str = ""
    why: str = ""  # why there is no guide ('' when there is one)
    seconds: float = 0.0  # the model and the guided cycle


def eligible_groups(sess: Session, plan: Plan) -> tuple[dict[int, np.ndarray], set[int]]:
    """(group -> its pending pods, groups the plan places whole) for the groups the model may decide: not placed in
    part, not onto room being released (pipelined) and not for evictions."""
    st = sess.state
    pending = (sess.status == PodStatus.PENDING) & (st.pod_pg >= 0)
    placed = np.zeros(st.n_pods, dtype=bool)
    fresh = [pl for pl in plan.placements if not pl.moved]
    placed[[pl.pod for pl in fresh]] = True
    fixed = {int(st.pod_pg[pl.pod]) for pl in fresh if pl.pipelined} | {e.beneficiary for e in plan.evictions}
    pods = np.flatnonzero(pending)
    bad = (st.pod_gpu_frac[pods] > 0) | (st.pod_gpu_mem[pods] > 0) | (st.pod_sg[pods] >= 0)
    groups: dict[int, np.ndarray] = {}
    whole: set[int] = set()
    order = np.argsort(st.pod_pg[pods], kind="stable")
    pods, bad = pods[order], bad[order]
    cuts = np.flatnonzero(np.diff(st.pod_pg[pods])) + 1
    for seg, seg_bad in zip(np.split(pods, cuts), np.split(bad, cuts), strict=True):
        if not len(seg):
            continue
        g = int(st.pod_pg[seg[0]])
        if seg_bad.any() or g in fixed or st.pg_problem[g] is not None or st.pg_topology[g] >= 0:
            continue
        if any(st.pods[p].pod_affinity or st.pods[p].pod_anti_affinity or st.pods[p].resource_claims
               for p in seg.tolist()):
            continue
        n_placed = int(placed[seg].sum())
        if n_placed not in (0, len(seg)):
            continue
        groups[g] = seg
        if n_placed:
            whole.add(g)
    return groups, whole


def _shape_key(st: ClusterState, p: int) -> tuple[Any, ...]:
    return int(st.pod_sig[p]), st.pod_req[p].tobytes(), int(st.pod_gpu_whole[p])


@dataclass
class _Shapes:
    """The model's pending shapes: a representative pod each, its requests, and what each group asks of each."""

    of: dict[tuple[Any, ...], int]
    rep: np.ndarray  # [S] a pod of each shape
    req: np.ndarray  # [S, R]
    whole: np.ndarray  # [S] whole GPUs
    demand: np.ndarray  # [S] pending pods over all groups
    counts: dict[int, dict[int, int]]  # group -> shape -> pods


@dataclass
class _Classes:
    """Node classes: members, the smallest room of each, and each class's maximal patterns."""

    members: list[np.ndarray]
    patterns: list[list[np.ndarray]]  # per class: counts per shape


def build(state: ClusterState, fs: FairShare, config: Config, plan: Plan, budget_s: float) -> PatternModel:
    """The pattern model for starting plan `plan`, solved within budget_s."""
    out = PatternModel()
    sess = Session(state, fs, config)
    groups, kept = eligible_groups(sess, plan)
    if len(groups) <= len(kept):
        out.why = "no group left pending that the model could place"
        return out
    shapes = _shapes(state, groups)
    if len(shapes.rep) > MAX_SHAPES:
        out.why = f"{len(shapes.rep)} pending shapes (more than {MAX_SHAPES})"
        return out
    # the starting plan's other decisions stay (its moves and evictions included): the classes see the room they
    # leave free now (room being released is not counted)
    apply_consolidation(sess, plan)
    apply_fixed(sess, plan, sorted({int(state.pod_pg[pl.pod]) for pl in plan.placements if not pl.moved}
                                   - set(groups)))
    classes = _classes(sess, shapes, out)
    if classes is None:
        return out
    chosen = _solve(state, fs, config, groups, kept, shapes, classes, budget_s, out)
    if chosen is None:
        return out
    z, supply = chosen
    out.chosen = [g for g in groups if g not in kept and g in z]
    if not out.chosen:
        out.why = "the pattern model places nothing the starting plan leaves pending"
        return out
    out.guide = _guide(state, groups, z, shapes, classes, supply)
    return out


def _shapes(st: ClusterState, groups: dict[int, np.ndarray]) -> _Shapes:
    of: dict[tuple[Any, ...], int] = {}
    reps: list[int] = []
    counts: dict[int, dict[int, int]] = {}
    for g, pods in groups.items():
        per: dict[int, int] = {}
        for p in pods.tolist():
            key = _shape_key(st, p)
            s = of.get(key)
            if s is None:
                s = of[key] = len(reps)
                reps.append(p)
            per[s] = per.get(s, 0) + 1
        counts[g] = per
    demand = np.zeros(len(reps), dtype=np.int64)
    for per in counts.values():
        for s, k in per.items():
            demand[s] += k
    rep = np.array(reps, dtype=np.int64)
    return _Shapes(of, rep, st.pod_req[rep].astype(np.int64), st.pod_gpu_whole[rep].astype(np.int64), demand,
                   counts)


def _classes(sess: Session, sh: _Shapes, out: PatternModel) -> _Classes | None:
    """Nodes grouped by scheduling class and how many of each shape fit alone (capped by its demand), with each
    class's maximal patterns; None (and out.why) when no node takes any shape or the patterns are too many."""
    st = sess.state
    n_shapes = len(sh.rep)
    free = sess.idle().astype(np.int64)  # [N, R]: free now (room being released is not counted)
    idle = sess.whole_idle.astype(np.int64)  # [N]
    nf = NodeFilter(sess)
    allowed = np.stack([nf.static_mask(int(st.pod_sig[p])) for p in sh.rep.tolist()], axis=1)  # [N, S]
    fit = np.full((st.n_nodes, n_shapes), np.iinfo(np.int64).max // 4, dtype=np.int64)
    for s in range(n_shapes):
        for r in np.flatnonzero(sh.req[s] > 0):
            fit[:, s] = np.minimum(fit[:, s], np.maximum(free[:, r], 0) // sh.req[s, r])
        if sh.whole[s] > 0:
            fit[:, s] = np.minimum(fit[:, s], idle // sh.whole[s])
    fit = np.where(allowed, np.minimum(fit, sh.demand[None, :]), 0)
    nodes = np.flatnonzero(fit.any(axis=1) & (free >= 0).all(axis=1))
    if not len(nodes):
        out.why = "no node has room for any of the pending shapes"
        return None
    keys = np.column_stack([st.node_class[nodes].astype(np.int64), fit[nodes]])
    cls = np.unique(keys, axis=0, return_inverse=True)[1].ravel()
    members = [nodes[cls == c] for c in range(int(cls.max()) + 1)]
    patterns: list[list[np.ndarray]] = []
    total = 0
    for m in members:
        shapes_c = [s for s in range(n_shapes) if fit[m[0], s] > 0]
        room = free[m].min(axis=0)  # the smallest room of the class: every pattern fits every member
        pats = _maximal_patterns(shapes_c, sh.req, sh.whole, sh.demand, room, int(idle[m].min()),
                                 PATTERN_CAP - total)
        if pats is None:
            out.why = f"more than {PATTERN_CAP} patterns (or their walk too long)"
            return None
        total += len(pats)
        patterns.append(pats)
    out.classes, out.patterns = len(members), total
    return _Classes(members, patterns)


def _solve(state: ClusterState, fs: FairShare, config: Config, groups: dict[int, np.ndarray], kept: set[int],
           sh: _Shapes, cl: _Classes, budget_s: float,
           out: PatternModel) -> tuple[set[int], list[list[list[int]]]] | None:
    """The model: nodes per (class, pattern) and groups placed, every group in `kept` included, most work placed
    (tier 1 of the objective). Returns (groups placed, per shape its [class, pods] supplied) or None (out.why)."""
    m = cp_model.CpModel()
    n_shapes = len(sh.rep)
    supply: list[list[Any]] = [[] for _ in range(n_shapes)]
    y: dict[tuple[int, int], Any] = {}
    for c, pats in enumerate(cl.patterns):
        size = len(cl.members[c])
        vs = []
        for i, pat in enumerate(pats):
            v = y[(c, i)] = m.new_int_var(0, size, f"y{c}_{i}")
            vs.append(v)
            for s in np.flatnonzero(pat).tolist():
                supply[s].append(int(pat[s]) * v)
        if vs:
            m.add(sum(vs) <= size)
    obj = Objective(state, fs)
    z: dict[int, Any] = {}
    use: list[list[Any]] = [[] for _ in range(n_shapes)]
    terms = []
    for g, pods in groups.items():
        v = z[g] = m.new_bool_var(f"z{g}")
        if g in kept:
            m.add(v == 1)
        m.add_hint(v, 1 if g in kept else 0)
        for s, k in sh.counts[g].items():
            use[s].append(k * v)
        terms.append(int(obj.work(pods).sum()) * v)
    for s in range(n_shapes):
        m.add(sum(use[s]) <= sum(supply[s]))
    m.maximize(sum(terms))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    if config.solver.deterministic:  # reproducible: a deterministic limit
        solver.parameters.max_deterministic_time = max(0.01, budget_s)
        solver.parameters.random_seed = config.solver.seed
    else:
        solver.parameters.max_time_in_seconds = max(0.01, budget_s)
    status = solver.solve(m)
    out.status = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        out.why = f"the pattern model found no solution ({out.status})"
        return None
    slots: list[list[list[int]]] = [[] for _ in range(n_shapes)]
    for (c, i), v in y.items():
        k = solver.value(v)
        if k:
            pat = cl.patterns[c][i]
            for s in np.flatnonzero(pat).tolist():
                slots[s].append([c, k * int(pat[s])])
    return {g for g, v in z.items() if solver.value(v)}, slots


def _guide(st: ClusterState, groups: dict[int, np.ndarray], placed: set[int], sh: _Shapes, cl: _Classes,
           slots: list[list[list[int]]]) -> dict[int, np.ndarray]:
    """Each placed group's pod -> the node mask of a class supplying its shape (group order)."""
    masks = []
    for members in cl.members:
        mask = np.zeros(st.n_nodes, dtype=bool)
        mask[members] = True
        masks.append(mask)
    guide: dict[int, np.ndarray] = {}
    for g, pods in groups.items():
        if g not in placed:
            continue
        for p in pods.tolist():
            for slot in slots[sh.of[_shape_key(st, p)]]:
                if slot[1] > 0:
                    slot[1] -= 1
                    guide[p] = masks[slot[0]]
                    break
    return guide


def _maximal_patterns(shapes: list[int], req: np.ndarray, whole: np.ndarray, demand: np.ndarray, cap: np.ndarray,
                      idle: int, limit: int) -> list[np.ndarray] | None:
    """Every multiset of `shapes` fitting (cap, idle whole devices) to which none of them can be added (a count
    never above the shape's demand); None when there are more than `limit`, or the walk takes more than
    VISITS_PER_PATTERN x `limit` steps."""
    n_shapes = len(req)
    out: list[np.ndarray] = []
    counts = np.zeros(n_shapes, dtype=np.int64)
    steps = [VISITS_PER_PATTERN * max(limit, 1)]

    def fits_one(s: int, room: np.ndarray, room_idle: int) -> bool:
        return bool((req[s] <= room).all()) and whole[s] <= room_idle and counts[s] < demand[s]

    def walk(i: int, room: np.ndarray, room_idle: int) -> bool:
        steps[0] -= 1
        if steps[0] < 0:
            return False
        if i == len(shapes):
            if any(fits_one(s, room, room_idle) for s in shapes):
                return True  # not maximal
            if len(out) >= limit:
                return False
            out.append(counts.copy())
            return True
        s = shapes[i]
        most = int(demand[s])
        for r in np.flatnonzero(req[s] > 0):
            most = min(most, int(room[r] // req[s, r]))
        if whole[s] > 0:
            most = min(most, room_idle // int(whole[s]))
        for k in range(max(most, 0), -1, -1):
            counts[s] = k
            if not walk(i + 1, room - k * req[s], room_idle - k * int(whole[s])):
                counts[s] = 0
                return False
        counts[s] = 0
        return True

    if not walk(0, cap.copy(), idle):
        return None
    return [p for p in out if p.any()]


def guided_plan(state: ClusterState, fs: FairShare, config: Config, plan: Plan,
                actions: tuple[str, ...] | None, budget_s: float) -> tuple[Plan | None, PatternModel]:
    """The greedy cycle guided by the pattern model (None with the model's why when there is no guide)."""
    t = time.perf_counter()
    pm = build(state, fs, config, plan, budget_s)
    if not pm.guide:
        return None, pm
    alt = greedy_plan(state, fs, config, actions, guide=pm.guide)
    alt.solver = plan.solver
    pm.seconds = time.perf_counter() - t
    return alt, pm
