"""The pattern plan: a starting plan from a model over node classes, for the cycle's whole-GPU and CPU-only work.

Nodes that the cycle's pending shapes see alike (the same scheduling class, and the same count of each shape
fitting alone in their free room) form one class; a pattern is a multiset of pending shapes that fits the smallest
free room of a class's nodes, with no shape left that would still fit. One small CP-SAT model chooses how many of a
class's nodes take each pattern and which groups are placed, within the queues' limits and quotas, so packing
decisions are made over classes and counts, never per pod and node (Borg's equivalence classes; a cutting-stock
pattern model). The decoder gives each class's nodes their patterns and each placed group's pods a slot of their
shape, in O(pods); the checker and the plan choice judge the result like any other plan.

Only work whose fit is the room of one node takes part: groups whose pending pods need whole GPUs or none, without
GPU shares, sub-groups, topology constraints, pod (anti-)affinity or resource claims, all of them placed by the
starting plan or none, and none onto room being released. Everything else keeps the starting plan's decisions
(moves and evictions included), which the classes' room leaves out.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.fairshare.share import UNLIMITED
from kai_opt.formulation.model import EPS, QSCALE, scaled_up
from kai_opt.formulation.objective import Objective
from kai_opt.formulation.scope import apply_consolidation, apply_fixed
from kai_opt.formulation.unbeatable import hopeless_groups
from kai_opt.heuristics.cycle import plan_from_session
from kai_opt.heuristics.nodefilter import NodeFilter
from kai_opt.heuristics.session import Session
from kai_opt.plan import Plan
from kai_opt.state import ClusterState, PodStatus

PATTERN_CAP = 1_000  # patterns over all classes: beyond it the cycle's shapes mix too freely for this model
MAX_SHAPES = 16  # pending shapes: more, and the patterns explode
VISITS_PER_PATTERN = 20  # the pattern walk gives up after this many steps per pattern allowed
MAX_CLASSES = 32  # node classes: more, and the nodes are too unlike for the classes to pay for the time they take
# from the CP-SAT model (docs/DESIGN-NOTES.md, the pattern plan)
MODEL_SHARE = 0.1  # of the time budget, the most the pattern model's search may take


@dataclass
class PatternModel:
    """What the model decided, and its counts; `plan` is the decoded plan (None: see `why`)."""

    plan: Plan | None = None
    chosen: list[int] = field(default_factory=list)  # groups the model places that the starting plan does not
    classes: int = 0
    patterns: int = 0
    status: str = ""
    why: str = ""  # why there is no plan ('' when there is one)
    seconds: float = 0.0  # model and decoder
    moves_dropped: bool = False  # the plan does without the starting plan's consolidation


def eligible_groups(sess: Session, plan: Plan) -> tuple[dict[int, np.ndarray], set[int]]:
    """(group -> its pending pods, groups the plan places whole) for the groups the model may decide: not placed in
    part, not onto room being released (pipelined) and not for evictions. Judged in bulk per group."""
    st = sess.state
    pods = np.flatnonzero((sess.status == PodStatus.PENDING) & (st.pod_pg >= 0))
    if not len(pods):
        return {}, set()
    pods = pods[np.argsort(st.pod_pg[pods], kind="stable")]
    pg = st.pod_pg[pods]
    starts = np.flatnonzero(np.concatenate([[True], pg[1:] != pg[:-1]]))
    gs = pg[starts]
    sizes = np.diff(np.append(starts, len(pods)))
    fresh = [pl for pl in plan.placements if not pl.moved]
    placed = np.zeros(st.n_pods, dtype=bool)
    placed[[pl.pod for pl in fresh]] = True
    n_placed = np.add.reduceat(placed[pods].astype(np.int64), starts)
    bad = (st.pod_gpu_frac[pods] > 0) | (st.pod_gpu_mem[pods] > 0) | (st.pod_sg[pods] >= 0)
    fixed = np.zeros(st.n_groups, dtype=bool)
    fixed[[int(st.pod_pg[pl.pod]) for pl in fresh if pl.pipelined]] = True
    fixed[[e.beneficiary for e in plan.evictions if e.beneficiary >= 0]] = True
    ok = ~np.logical_or.reduceat(bad, starts) & ((n_placed == 0) | (n_placed == sizes)) & ~fixed[gs] \
        & (st.pg_topology[gs] < 0)
    groups: dict[int, np.ndarray] = {}
    whole: set[int] = set()
    for i in np.flatnonzero(ok).tolist():
        g = int(gs[i])
        seg = pods[starts[i]:starts[i] + sizes[i]]
        if st.pg_problem[g] is not None or any(
                st.pods[p].pod_affinity or st.pods[p].pod_anti_affinity or st.pods[p].resource_claims
                for p in seg.tolist()):
            continue
        groups[g] = seg
        if n_placed[i]:
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
    """The pattern model for starting plan `plan`, solved within budget_s: first without the plan's consolidation
    (its moves and the room they make), when the model then places every group the plan places; else beside it."""
    bare = _without_consolidation(state, plan)
    if bare is not None:
        out = _build(state, fs, config, bare[0], budget_s, helped=bare[1])
        if out.plan is not None or out.status not in ("INFEASIBLE", "MODEL_INVALID", ""):
            return out
    return _build(state, fs, config, plan, budget_s)


def _without_consolidation(st: ClusterState, plan: Plan) -> tuple[Plan, set[int]] | None:
    """`plan` without consolidation's evictions and moves, with the groups that wait for the room they release
    (the ones it made room for, and any other pipelined onto a node it empties) placed as if that room were free:
    the model then finds them room, or fails. Also returns those groups. None when the plan has no consolidation,
    moves that re-place victims of other evictions (reclaim and preempt keep those), or such a group also waits on
    a node where other evictions release room."""
    consolidated = {e.pod for e in plan.evictions if e.reason == "consolidate"}
    moved = {pl.pod for pl in plan.placements if pl.moved}
    if not consolidated or not moved <= consolidated:
        return None
    cons_nodes = {int(st.pod_node[p]) for p in consolidated}
    other_nodes = {int(st.pod_node[e.pod]) for e in plan.evictions if e.reason != "consolidate"}
    piped = [pl for pl in plan.placements if pl.pipelined and not pl.moved]
    helped = {e.beneficiary for e in plan.evictions if e.reason == "consolidate"}
    helped |= {int(st.pod_pg[pl.pod]) for pl in piped if pl.node in cons_nodes}
    if any(pl.node not in cons_nodes or pl.node in other_nodes for pl in piped if int(st.pod_pg[pl.pod]) in helped):
        return None
    return dataclasses.replace(
        plan, evictions=[e for e in plan.evictions if e.reason != "consolidate"],
        placements=[dataclasses.replace(pl, pipelined=False) if pl.pipelined and int(st.pod_pg[pl.pod]) in helped
                    else pl for pl in plan.placements if not pl.moved]), helped


def _build(state: ClusterState, fs: FairShare, config: Config, plan: Plan, budget_s: float, *,
           helped: set[int] | None = None) -> PatternModel:
    """build() for `plan`; `helped`: the groups consolidation made room for, when `plan` is without it (the model
    must place them all, so every one must take part)."""
    out = PatternModel()
    moves_dropped = helped is not None
    sess = Session(state, fs, config)
    groups, kept = eligible_groups(sess, plan)
    if helped is not None and not helped <= set(groups):
        out.why = "a group the consolidation made room for cannot take part"
        return out
    if len(groups) <= len(kept) and not moves_dropped:
        out.why = "no group left pending that the model could place"
        return out
    shapes = _shapes(state, groups)
    if len(shapes.rep) > MAX_SHAPES:
        out.why = f"{len(shapes.rep)} pending shapes (more than {MAX_SHAPES})"
        return out
    # the starting plan's other decisions stay (its moves and evictions included): the classes see the room they
    # leave free now (room being released is not counted). Replaying them is costly at scale, so the gates run on
    # the cycle start's room first: a stage that gives up does so before the replay (the model's classes are the
    # ones formed after it)
    free0, idle0 = sess.idle().astype(np.int64), sess.whole_idle.astype(np.int64)
    fit0 = _fit_alone(sess, shapes, free0, idle0)
    members0 = _class_members(state, free0, fit0)  # (the cheapest gate first: many classes is common at scale)
    if isinstance(members0, str):
        out.why = members0
        return out
    room = fit0.sum(axis=0)  # (the replay binds more: room only shrinks)
    left = [g for g in groups if g not in kept]
    refused = hopeless_groups(state, fs, config, left)  # by its queue's limits or quota at the cycle start
    if not moves_dropped and not any(all(room[s] >= k for s, k in shapes.counts[g].items())
                                     for g in left if g not in refused):
        out.why = "no group left pending fits the free room alone and its queue's limits"
        return out
    classes = _classes(sess, shapes, out, free0, idle0, fit0, members0)
    if classes is None:
        return out
    outside = sorted({int(state.pod_pg[pl.pod]) for pl in plan.placements if not pl.moved} - set(groups))
    apply_consolidation(sess, plan)
    apply_fixed(sess, plan, outside)
    for e in plan.evictions:  # the rest (stale gangs': no beneficiary), one by one in the plan's order
        if int(sess.status[e.pod]) == PodStatus.BOUND:
            sess.evict_many([e.pod], e.reason, e.beneficiary)
    if sess.log:  # the replay changed the room: the classes are formed again (unchanged, they are the gate's)
        free, idle = sess.idle().astype(np.int64), sess.whole_idle.astype(np.int64)
        classes = _classes(sess, shapes, out, free, idle, _fit_alone(sess, shapes, free, idle))
    if classes is None:
        return out
    solved = _solve(sess, config, groups, kept, shapes, classes, budget_s, out)
    if solved is None:
        return out
    placed, counts = solved
    out.chosen = [g for g in groups if g not in kept and g in placed]
    if not out.chosen and not moves_dropped:
        out.why = "the pattern model places nothing the starting plan leaves pending"
        return out
    _decode(sess, groups, placed, kept, shapes, classes, counts)
    out.plan = plan_from_session(sess, dict(plan.pending), plan.engine)
    out.moves_dropped = moves_dropped
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


def _fit_alone(sess: Session, sh: _Shapes, free: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """[N, S]: how many of each shape fit alone in `free` [N, R] and `idle` whole devices [N] (0 where its
    scheduling signature refuses the node), capped by the shape's demand."""
    st = sess.state
    nf = NodeFilter(sess)
    allowed = np.stack([nf.static_mask(int(st.pod_sig[p])) for p in sh.rep.tolist()], axis=1)
    fit = np.full((st.n_nodes, len(sh.rep)), np.iinfo(np.int64).max // 4, dtype=np.int64)
    for s in range(len(sh.rep)):
        for r in np.flatnonzero(sh.req[s] > 0):
            fit[:, s] = np.minimum(fit[:, s], np.maximum(free[:, r], 0) // sh.req[s, r])
        if sh.whole[s] > 0:
            fit[:, s] = np.minimum(fit[:, s], idle // sh.whole[s])
    return np.where(allowed, np.minimum(fit, sh.demand[None, :]), 0)


@functools.cache
def _row_hash_weights(n: int) -> np.ndarray:
    """n fixed odd int64 weights (made once per width, read-only): a row's dot product with them (wrapping) is its
    hash."""
    out = np.random.default_rng(0x5EED).integers(1, 2**62, size=n, dtype=np.int64) | 1
    out.setflags(write=False)
    return out


def _class_members(st: ClusterState, free: np.ndarray, fit: np.ndarray) -> list[np.ndarray] | str:
    """The nodes of each class: nodes with room for some shape, grouped by scheduling class and how many of each
    shape fit alone (`fit`: _fit_alone of `free`); or why there are none to model (no such node, too many
    classes)."""
    nodes = np.flatnonzero(fit.any(axis=1) & (free >= 0).all(axis=1))
    if not len(nodes):
        return "no node has room for any of the pending shapes"
    keys = np.column_stack([st.node_class[nodes].astype(np.int64), fit[nodes]])
    # rows that hash apart differ: more than MAX_CLASSES distinct hashes decide the gate without sorting the rows
    hashed = len(np.unique(keys @ _row_hash_weights(keys.shape[1])))
    if hashed > MAX_CLASSES:
        return f"at least {hashed} node classes (more than {MAX_CLASSES})"
    cls = np.unique(keys, axis=0, return_inverse=True)[1].ravel()
    members = [nodes[cls == c] for c in range(int(cls.max()) + 1)]
    if len(members) > MAX_CLASSES:
        return f"{len(members)} node classes (more than {MAX_CLASSES})"
    return members


def _classes(sess: Session, sh: _Shapes, out: PatternModel, free: np.ndarray, idle: np.ndarray,
             fit: np.ndarray, members: list[np.ndarray] | None = None) -> _Classes | None:
    """Nodes grouped by scheduling class and how many of each shape fit alone (`fit`: _fit_alone of `free` and
    `idle`; `members`: _class_members of them when known), with each class's maximal patterns; None (and out.why)
    when no node takes any shape or the classes or patterns are too many."""
    n_shapes = len(sh.rep)
    got = _class_members(sess.state, free, fit) if members is None else members
    if isinstance(got, str):
        out.why = got
        return None
    members = got
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


def _group_classes(st: ClusterState, groups: dict[int, np.ndarray], sh: _Shapes) -> list[list[int]]:
    """Groups interchangeable for the model (one queue, priority and preemptibility, the same pods per shape):
    one count variable each, never one per group."""
    by: dict[tuple[Any, ...], list[int]] = {}
    for g in groups:
        key = (int(st.pg_queue[g]), int(st.pg_priority[g]), bool(st.pg_preemptible[g]),
               tuple(sorted(sh.counts[g].items())))
        by.setdefault(key, []).append(g)
    return list(by.values())


def _solve(sess: Session, config: Config, groups: dict[int, np.ndarray], kept: set[int], sh: _Shapes, cl: _Classes,
           budget_s: float, out: PatternModel) -> tuple[set[int], dict[tuple[int, int], int]] | None:
    """The model: nodes per (class, pattern) and groups placed per group class (at least the ones in `kept`),
    within the queues' limits and non-preemptible quotas, most work placed (tier 1 of the objective). Returns
    (groups placed: the kept ones of each group class first, then by index; nodes per (class, pattern)) or None
    (out.why)."""
    st = sess.state
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
    obj = Objective(st, sess.fs)
    gcs = [sorted(gc, key=lambda g: (g not in kept, g)) for gc in _group_classes(st, groups, sh)]
    x: list[Any] = []
    use: list[list[Any]] = [[] for _ in range(n_shapes)]
    terms = []
    for k, gc in enumerate(gcs):
        least = sum(1 for g in gc if g in kept)
        v = m.new_int_var(least, len(gc), f"x{k}")
        m.add_hint(v, least)
        x.append(v)
        for s, n in sh.counts[gc[0]].items():
            use[s].append(n * v)
        terms.append(int(obj.work(groups[gc[0]]).sum()) * v)
    for s in range(n_shapes):
        m.add(sum(use[s]) <= sum(supply[s]))
    _queue_rows(m, sess, groups, gcs, x)
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
    counts = {key: int(solver.value(v)) for key, v in y.items()}
    placed = {g for gc, v in zip(gcs, x, strict=True) for g in gc[:int(solver.value(v))]}
    return placed, {key: k for key, k in counts.items() if k}


def _queue_rows(m: cp_model.CpModel, sess: Session, groups: dict[int, np.ndarray], gcs: list[list[int]],
                x: list[Any]) -> None:
    """What the queues allow on top of their allocation (the session's: the starting plan's fixed decisions in):
    per queue with a limit, everything placed below it; per queue with a deserved quota, the non-preemptible work
    placed below it (KAI's IsJobOverQueueCapacity, as the CP-SAT model writes it: model._queue_constraints)."""
    st, fs = sess.state, sess.fs
    scale = np.array(QSCALE)
    alloc = np.round(sess.ledger.allocated * scale).astype(np.int64)
    alloc_np = np.round(sess.ledger.allocated_np * scale).astype(np.int64)
    below: dict[int, list[tuple[Any, np.ndarray, bool]]] = {}
    for gc, v in zip(gcs, x, strict=True):
        g = gc[0]  # (a group class: one queue, the same requests)
        qreq = scaled_up(sess.queue_request(groups[g]).sum(axis=0))
        for q in st.q_ancestors[int(st.pg_queue[g])]:
            below.setdefault(q, []).append((v, qreq, bool(st.pg_preemptible[g])))
    for q, items in sorted(below.items()):
        for r in range(len(QSCALE)):
            lim, des = fs.limit[q, r], fs.deserved[q, r]
            if lim != UNLIMITED:
                bound = max(int(np.floor(lim * scale[r] + EPS)), int(alloc[q, r]))
                m.add(sum(int(a[r]) * v for v, a, _ in items if a[r]) <= bound - int(alloc[q, r]))
            if des != UNLIMITED:
                bound = max(int(np.floor(des * scale[r] + EPS)), int(alloc_np[q, r]))
                m.add(sum(int(a[r]) * v for v, a, pre in items if a[r] and not pre) <= bound - int(alloc_np[q, r]))


def _decode(sess: Session, groups: dict[int, np.ndarray], placed: set[int], kept: set[int], sh: _Shapes,
            cl: _Classes, counts: dict[tuple[int, int], int]) -> None:
    """Each class's nodes take their patterns (in node order), and each placed group's pods (the starting plan's
    groups first, then by index) take a slot of their shape on such a node and its first idle devices; bound in one
    bulk step. Every pattern fits the room of every node of its class, so no placement overfills a node."""
    st = sess.state
    slots: list[list[list[int]]] = [[] for _ in range(len(sh.rep))]  # shape -> [node, pods left]
    for c, members in enumerate(cl.members):
        at = 0
        for i, pat in enumerate(cl.patterns[c]):
            k = counts.get((c, i), 0)
            for n in members[at:at + k].tolist():
                for s in np.flatnonzero(pat).tolist():
                    slots[s].append([n, int(pat[s])])
            at += k
    cursor = [0] * len(sh.rep)
    idle = (sess.dev_held + sess.dev_rel) == 0
    free_devs: dict[int, list[int]] = {}  # node -> its idle devices not yet given out
    items: list[tuple[int, int, tuple[int, ...], bool]] = []
    for g in sorted(placed, key=lambda x: (x not in kept, x)):
        for p in groups[g].tolist():
            s = sh.of[_shape_key(st, p)]
            while slots[s][cursor[s]][1] == 0:
                cursor[s] += 1
            slot = slots[s][cursor[s]]
            slot[1] -= 1
            n, whole = slot[0], int(sh.whole[s])
            devices: tuple[int, ...] = ()
            if whole:
                devs = free_devs.get(n)
                if devs is None:
                    a = int(sess.dev_start[n])
                    devs = free_devs[n] = (a + np.flatnonzero(idle[a:int(sess.dev_start[n + 1])])).tolist()
                devices, devs[:whole] = tuple(devs[:whole]), []
            items.append((p, n, devices, False))
    sess.place_many(items)


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


def pattern_plan(state: ClusterState, fs: FairShare, config: Config, plan: Plan, budget_s: float) -> PatternModel:
    """The pattern model's plan for starting plan `plan` (PatternModel.plan; None with its why)."""
    t = time.perf_counter()
    pm = build(state, fs, config, plan, budget_s)
    if pm.plan is not None:
        pm.plan.solver, pm.plan.phases = plan.solver, plan.phases
    pm.seconds = time.perf_counter() - t
    return pm
