"""What one model covers: the pending groups (in queue order, up to a pod budget), their pod shapes, the nodes
each shape may use, and the running pods that may be evicted for them.

Pods of one group with identical requests, GPU needs, scheduling signature and sub-group form a shape with a
count, so the model decides counts per (shape, node), never one boolean per pod and node. Candidate nodes of a
shape are capped: the nodes the greedy plan used, then the best-fitting others, then nodes where evictions could
make room.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kai_opt.config import Config
from kai_opt.fairshare.reclaim import can_reclaim, fits_strategy_many, leveled_many
from kai_opt.heuristics.actions import Actions
from kai_opt.heuristics.cheapest_victims import queue_paths
from kai_opt.heuristics.session import ACTIVE, Session
from kai_opt.heuristics.tasks import group_shape, pending_mask
from kai_opt.heuristics.victims import protected_by_min_runtime
from kai_opt.plan import Eviction, Placement, Plan
from kai_opt.state import R_GPU, ClusterState, PodStatus

# config solver.keep_greedy_groups (default true): every group the greedy placed stays placed (the model may move
# it); KAI's queue order is the rule there (docs/DESIGN-NOTES.md).
# (shape, candidate node) pairs in one model: wider models are larger and slower to their first improvement,
# narrower ones lose value (docs/DESIGN-NOTES.md, "Model size constants").
PAIR_BUDGET = 10_000
PAIRS_PER_SECOND = 3_000  # and at most this many per second of the time budget (a pair is a variable, and on a
# node where shares go, one per device and share size): what one model can build, solve and decode in time


FIXED_PER_DECISION = 0.00007  # s per decision of the greedy plan the CP-SAT stage spends whatever the model's
# size: replaying the decisions outside the window, then checking and scoring the whole plan


def model_seconds(cfg: Config, decisions: int = 0) -> float:
    """The part of the time budget that sizes the model: the budget less the fixed work over the greedy plan's
    `decisions` (placements and evictions), and never less than a tenth of it."""
    budget = cfg.solver.time_budget_s
    return max(0.1 * budget, budget - FIXED_PER_DECISION * decisions)


def pair_budget(cfg: Config, decisions: int = 0) -> int:
    """(pool, candidate node) pairs of one model under this configuration's time budget."""
    return min(PAIR_BUDGET, int(PAIRS_PER_SECOND * model_seconds(cfg, decisions)))


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
    greedy_for: int = -1  # the scope group the greedy plan evicted it for (its turn dates the eviction)


@dataclass
class Pool:
    """Pods interchangeable on every node: the pending shapes of one or more groups and running pods that
    consolidation may move. The model counts the pool's pods per candidate node."""

    shapes: list[int]  # indexes into Scope.shapes
    movers: list[int] = field(default_factory=list)  # indexes into Scope.movers
    nodes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # candidate nodes
    pod: int = -1  # one of its pods (requests, GPU needs, scheduling signature)


@dataclass
class Mover:
    """Running pods of one group on one node, holding the same devices (shares) or one pod (whole GPUs), that
    the model may move to another node to make room (consolidation: each one re-placed in the same plan)."""

    pool: int
    group: int
    node: int
    pods: list[int]


@dataclass
class Scope:
    groups: list[GroupScope]
    shapes: list[Shape]
    victims: list[Victim]
    nodes: np.ndarray  # all model nodes
    excluded: list[int]  # pending groups left out (window, pod affinity, problems)
    notes: list[str]
    keep: dict[int, int] = field(default_factory=dict)  # scope group -> pods the greedy plan placed (kept at least)
    pools: list[Pool] = field(default_factory=list)
    movers: list[Mover] = field(default_factory=list)
    move_for: list[int] = field(default_factory=list)  # scope groups a move may serve (consolidation's rules)
    turn: dict[int, int] = field(default_factory=dict)  # scope group -> its turn in the greedy's queue order
    # what the excluded groups' fixed decisions and the replayed evictions and moves changed per leaf queue, at
    # their turn: (turn, leaf queue, queue resources placed less evicted); a reclaimer's fair-share check sees
    # only the turns before its own
    late_work: list[tuple[int, int, np.ndarray]] = field(default_factory=list)


def _shape_key(sess: Session, p: int) -> tuple[Any, ...]:
    st = sess.state
    return (int(st.pod_sg[p]), tuple(st.pod_req[p].tolist()), int(st.pod_gpu_whole[p]), int(st.pod_gpu_frac[p]),
            int(st.pod_gpu_mem[p]), int(st.pod_gpu_ndev[p]), int(st.pod_sig[p]))


def build_scope(sess: Session, acts: Actions, greedy: Plan, *, max_pods: int, max_groups: int | None = None,
                per_shape_nodes: int = 24) -> Scope:
    """What the model covers. Pending groups outside it (the window, pod affinity, a sub-group's required
    topology) keep the greedy plan's decisions: they are applied to `sess` here (apply_fixed), so the model sees
    the room they leave, and the decoder applies the same."""
    st = sess.state
    notes: list[str] = []
    ready = acts.pending_groups()
    # the greedy's decision order: a group's rank is its first placement turn, others last
    turns = greedy.turns or list(dict.fromkeys(int(st.pod_pg[p.pod]) for p in greedy.placements))
    order = {g: i for i, g in enumerate(turns)}
    ready.sort(key=lambda g: (order.get(g, math.inf), -int(st.pg_priority[g]), st.pg_keys[g]))
    groups: list[GroupScope] = []
    shapes: list[Shape] = []
    # groups the greedy's replayed evictions were made for (apply_consolidation): the decode session has those
    # evictions whatever the model says, so these groups are always in the model (and held), window or not
    replayed = replayed_evictions(st, greedy)
    replayed_for = {e.beneficiary for e in replayed}
    greedy_nodes: dict[int, set[int]] = {}
    for pl in greedy.placements:
        if not pl.moved:
            greedy_nodes.setdefault(pl.pod, set()).add(pl.node)
    sub_domain = subgroup_domains(st)
    pending_now = sess.status[st.pg_pods] == PodStatus.PENDING
    pending_pods = {g: st.pg_pods[a:b][pending_now[a:b]] for g in ready
                    for a, b in ((int(st.pg_pod_start[g]), int(st.pg_pod_start[g + 1])),)}
    eligible = [g for g in ready if not sub_domain[g] and not any(
        st.pods[p].pod_affinity or st.pods[p].pod_anti_affinity for p in pending_pods[g].tolist())]
    placed_count = placed_per_group(st, greedy)
    window, excluded = _in_and_out(sess, greedy, ready, _window(
        eligible, pending_pods, placed_count, replayed_for, max_pods,
        len(eligible) if max_groups is None else max_groups,
        Counter(e.beneficiary for e in greedy.evictions if e.beneficiary >= 0)))
    turn_of = {g: i for i, g in enumerate(ready)}
    kept_as_greedy = fixed_decisions(sess, greedy, excluded)
    late_work = fixed_work(sess, kept_as_greedy, turn_of) + replayed_work(sess, greedy, replayed, turn_of)
    apply_fixed(sess, greedy, excluded, kept_as_greedy)
    for g in (g for g in ready if g in window):  # (apply_fixed changed no pending pod of these groups)
        pods = st.group_pods(g)
        pend = pending_pods[g]
        shape = group_shape(sess, g)
        active = np.isin(sess.status[pods], ACTIVE)
        need = max(0, int(st.pg_min_member[g]) - int(active.sum()))
        sub_need = {s: max(0, int(st.sg_min_member[s]) - int(np.isin(sess.status[sp], ACTIVE).sum()))
                    for s, sp in shape.leaves}
        by_key: dict[tuple[Any, ...], list[int]] = {}
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
        notes.append(f"{len(excluded)} pending podgroups outside the model (pod affinity, a sub-group's "
                     f"required topology or the window of {max_pods} pods, a pod evicted for a group counting "
                     f"{VICTIM_WEIGHT}, and {max_groups or len(eligible)} groups) "
                     "keep the greedy plan's decisions")
    scope_groups = {gs.group for gs in groups}
    # victim groups the greedy evicted for a scoped group by a rule it judged at that group's turn (the session's
    # ledger here is a later one): their units exist whatever the cycle-start rules below say
    chosen = {int(st.pod_pg[e.pod]) for e in greedy.evictions
              if e.reason in ("reclaim", "preempt") and e.beneficiary in scope_groups}
    victims = _victims(sess, groups, {e.pod for e in greedy.evictions}, chosen)
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
            if j is not None and e.reason in ("reclaim", "preempt"):
                v.greedy_for = j
                if j not in v.reason_for:
                    v.beneficiaries.append(j)
                    v.reason_for[j] = e.reason
    # a beneficiary whose placement a later search took back (WITHDRAWN) ends placed by no plan, and its victims' room
    # went to groups placed after it: their eviction is a placed beneficiary's of theirs (the first in turn order)
    for v in victims:
        if v.greedy_for >= 0 and groups[v.greedy_for].group not in placed_count:
            why = v.reason_for[v.greedy_for]
            alive = [j for j in v.beneficiaries if v.reason_for[j] == why and groups[j].group in placed_count]
            v.greedy_for = min(alive, key=lambda j: turn_of[groups[j].group]) if alive else -1
    keep = {i: placed_count[gs.group] for i, gs in enumerate(groups)
            if gs.group in placed_count and (sess.cfg.solver.keep_greedy_groups or gs.group in replayed_for)}
    # candidate nodes per shape: as many as a budget of (shape, node) pairs allows, at least per_shape_nodes. Wider
    # is what lets the model re-arrange the greedy's placements
    pools = shape_pools(sess, groups, shapes)
    decisions = len(greedy.placements) + len(greedy.evictions)
    cap = max(per_shape_nodes, pair_budget(sess.cfg, decisions) // max(1, len(pools)))
    move_for, movable = _movable(sess, groups, greedy)
    roomy = np.zeros(st.n_nodes, dtype=bool)
    _candidate_nodes(sess, acts, pools, greedy_nodes, victims, cap, shapes, movable, roomy)
    for pool in pools:
        for k in pool.shapes:
            shapes[k].nodes = pool.nodes
    model_nodes = np.unique(np.concatenate([s.nodes for s in shapes])) if shapes else np.zeros(0, dtype=np.int64)
    in_model = set(model_nodes.tolist())
    victims = [v for v in victims if any(int(sess.node[p]) in in_model for p in v.pods)]
    scope = Scope(groups, shapes, victims, model_nodes, excluded, notes, keep, pools, move_for=move_for,
                  turn={i: turn_of[gs.group] for i, gs in enumerate(groups)}, late_work=late_work)
    _add_movers(sess, acts, scope, movable[roomy[sess.node[movable]]], per_shape_nodes,
                move_budget(sess.cfg, decisions))
    return scope


WINDOW_PODS_PER_SECOND = 1_000  # pending pods one model decides per second of the time budget (the rest keep
# the greedy plan's decisions): scope, model, solve and decode grow with them (see docs/DESIGN-NOTES.md)
WINDOW_GROUPS_PER_SECOND = 300  # and groups: the per-group rows (gang, placed, the reclaim rule's running sums) grow
# with groups whatever their size, so many one-pod groups need their own cap (docs/DESIGN-NOTES.md)
VICTIM_WEIGHT = 3  # a pod the greedy evicted for a group counts this many pending pods in its window: an eviction
# variable and the reclaim rule's rows against every sibling queue a reclaimer may take it from (docs/DESIGN-NOTES.md)


def window_pods(cfg: Config, decisions: int = 0) -> int:
    """Pending pods one model may decide under this configuration (solver.max_model_pods caps it), beside a
    greedy plan of `decisions` placements and evictions."""
    return max(1, min(cfg.solver.max_model_pods, int(WINDOW_PODS_PER_SECOND * model_seconds(cfg, decisions))))


def window_groups(cfg: Config, decisions: int = 0) -> int:
    """Pending groups one model may decide (as window_pods)."""
    return max(1, int(WINDOW_GROUPS_PER_SECOND * model_seconds(cfg, decisions)))


def _window(eligible: list[int], pending: dict[int, np.ndarray], placed: Counter[int], always: set[int],
            max_pods: int, max_groups: int, victim_pods: Counter[int] | None = None) -> list[int]:
    """The groups the model decides, in queue order, within `max_pods` pending pods and `max_groups` groups.
    A group's pods are its pending pods and, VICTIM_WEIGHT times each, the pods the greedy plan evicted for it
    (`victim_pods`). When everything fits, all of them. Otherwise where a better plan can come from: first the
    groups the greedy plan leaves pending (highest-ranked first), then the last groups the greedy placed (they hold
    the room the others could use), then the rest in queue order; the groups in `always` count first."""
    victim_pods = victim_pods or Counter()
    size = {g: len(pending[g]) + VICTIM_WEIGHT * victim_pods[g] for g in eligible}
    if sum(size.values()) <= max_pods and len(eligible) <= max_groups:
        return eligible
    chosen: list[int] = [g for g in eligible if g in always]
    left = max_pods - sum(size[g] for g in chosen)
    unplaced = [g for g in eligible if g not in placed and g not in always]
    placed_late = [g for g in reversed(eligible) if g in placed and g not in always]
    for part, share in ((unplaced, left // 2), (placed_late, left), (eligible, left)):
        room = min(share, left)
        for g in part:
            if len(chosen) >= max_groups:
                break
            if g in chosen or size[g] > room:
                continue
            chosen.append(g)
            room -= size[g]
            left -= size[g]
    rank = {g: i for i, g in enumerate(eligible)}
    return sorted(set(chosen), key=rank.__getitem__)


def _in_and_out(sess: Session, greedy: Plan, ready: list[int], chosen: list[int]) -> tuple[set[int], list[int]]:
    """(the groups the model decides, the pending groups left out in `ready`'s order): the window's `chosen` less
    the groups whose greedy decisions those left out rely on (relied_on)."""
    window = set(chosen)
    excluded = [g for g in ready if g not in window]
    if excluded:
        window -= relied_on(sess, greedy, set(excluded))
        excluded = [g for g in ready if g not in window]
    return window, excluded


def relied_on(sess: Session, greedy: Plan, outside: set[int]) -> set[int]:
    """The groups whose greedy decisions those of `outside` rely on, closed (a group added relies on others in
    turn): a pod pipelined on a node may run on what the greedy's evictions there release, so the groups they were
    made for (one whose placement a later victim search took back included) keep the greedy's decisions too; the
    model could otherwise drop those evictions under the pod. A group's evictions go whole (a gang's core is one
    eviction chunk for one group), so no victim gang is split."""
    st = sess.state
    for_on: dict[int, set[int]] = {}  # node -> the groups the greedy evicted for there
    for e in greedy.evictions:
        if e.beneficiary >= 0 and int(sess.status[e.pod]) == PodStatus.BOUND:
            for_on.setdefault(int(sess.node[e.pod]), set()).add(e.beneficiary)
    if not for_on:
        return set()
    pipelined: dict[int, set[int]] = {}  # group -> the nodes its pods are pipelined on
    for pl in greedy.placements:
        if pl.pipelined and not pl.moved:
            pipelined.setdefault(int(st.pod_pg[pl.pod]), set()).add(pl.node)
    out: set[int] = set()
    todo = list(outside)
    while todo:
        for n in pipelined.get(todo.pop(), ()):
            for b in for_on.get(n, ()):
                if b not in outside and b not in out:
                    out.add(b)
                    todo.append(b)
    return out


@dataclass(frozen=True)
class FixedDecisions:
    """The greedy plan's decisions for pending groups outside the model that a session does not have yet: the
    evictions made for them (of pods still bound) and their placements (of pods still pending; moves are
    apply_consolidation's), each in plan order."""

    evictions: list[Eviction]
    placements: list[Placement]


def fixed_decisions(sess: Session, greedy: Plan, groups: list[int]) -> FixedDecisions:
    """What apply_fixed applies for `groups` on `sess` as it stands (fixed_work dates the same)."""
    st = sess.state
    if not groups:
        return FixedDecisions([], [])
    mine = np.zeros(st.n_groups, dtype=bool)
    mine[groups] = True
    ev = greedy.evictions
    ev_pods = np.fromiter((e.pod for e in ev), dtype=np.int64, count=len(ev))
    ev_for = np.fromiter((e.beneficiary for e in ev), dtype=np.int64, count=len(ev))
    ev_take = (ev_for >= 0) & mine[np.maximum(ev_for, 0)] & (sess.status[ev_pods] == PodStatus.BOUND)
    fresh = [pl for pl in greedy.placements if not pl.moved]
    pods = np.fromiter((pl.pod for pl in fresh), dtype=np.int64, count=len(fresh))
    take = mine[st.pod_pg[pods]] & (sess.status[pods] == PodStatus.PENDING)  # (evictions leave pending pods be)
    return FixedDecisions([e for e, ok in zip(ev, ev_take.tolist(), strict=True) if ok],
                          [pl for pl, ok in zip(fresh, take.tolist(), strict=True) if ok])


def fixed_work(sess: Session, fixed: FixedDecisions, turn_of: dict[int, int]) -> list[tuple[int, int, np.ndarray]]:
    """(turn, leaf queue, queue request) of the `fixed` placements (positive) and evictions (negative), each dated
    by its group's turn (the placed pod's group, the eviction's beneficiary), summed per turn and leaf queue: the
    allocation changes apply_fixed is about to make."""
    st = sess.state
    turn = np.full(st.n_groups, -1, dtype=np.int64)
    turn[list(turn_of)] = list(turn_of.values())
    pl, ev = fixed.placements, fixed.evictions
    pods = np.fromiter((x.pod for x in pl), dtype=np.int64, count=len(pl))
    ev_pods = np.fromiter((e.pod for e in ev), dtype=np.int64, count=len(ev))
    ev_for = np.fromiter((e.beneficiary for e in ev), dtype=np.int64, count=len(ev))
    return _dated_work(sess, np.concatenate([pods, ev_pods]),
                       np.concatenate([np.fromiter((x.node for x in pl), dtype=np.int64, count=len(pl)),
                                       sess.node[ev_pods]]),
                       np.r_[np.ones(len(pods), dtype=np.int64), -np.ones(len(ev_pods), dtype=np.int64)],
                       np.concatenate([turn[st.pod_pg[pods]], turn[ev_for]]))


def _dated_work(sess: Session, pods: np.ndarray, nodes: np.ndarray, sign: np.ndarray,
                turns: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """Pods placed (sign 1) on or evicted (-1) from `nodes`, each at its turn -> (turn, leaf queue, signed queue
    request summed in row order), sorted by turn and queue."""
    if not len(pods):
        return []
    st = sess.state
    amount = sess.queue_request(pods, nodes) * sign[:, None]
    keys, at = np.unique(np.column_stack([turns, st.pg_queue[st.pod_pg[pods]]]), axis=0, return_inverse=True)
    sums = np.zeros((len(keys), amount.shape[1]))
    np.add.at(sums, at.ravel(), amount)  # (in row order: the float sums of adding one row after another)
    return [(t, q, sums[i]) for i, (t, q) in enumerate(keys.tolist())]


def replayed_work(sess: Session, greedy: Plan, replayed: list[Eviction],
                  turn_of: dict[int, int]) -> list[tuple[int, int, np.ndarray]]:
    """(turn, leaf queue, queue request) of the replayed evictions (apply_consolidation: in the session from the
    start, whatever their turn; negative) and of the moves that re-placed their pods (positive), dated by the
    group each eviction was made for; those of no pending group's turn are left out."""
    st = sess.state
    turn = {e.pod: turn_of[e.beneficiary] for e in replayed
            if e.beneficiary in turn_of and st.pod_node[e.pod] >= 0}
    rows = [(p, int(st.pod_node[p]), -1) for p in turn]
    rows += [(pl.pod, pl.node, 1) for pl in greedy.placements if pl.moved and pl.pod in turn]
    if not rows:
        return []
    pods, nodes, sign = (np.array(c, dtype=np.int64) for c in zip(*rows, strict=True))
    return _dated_work(sess, pods, nodes, sign, np.array([turn[p] for p in pods.tolist()], dtype=np.int64))


def apply_fixed(sess: Session, greedy: Plan, groups: list[int],
                fixed: FixedDecisions | None = None) -> None:
    """Apply the greedy plan's decisions for pending `groups` (those outside the model) to a session of the cycle:
    the evictions made for them, then their placements, as the greedy made them (`fixed`: fixed_decisions of
    them on this session, when already known)."""
    fixed = fixed_decisions(sess, greedy, groups) if fixed is None else fixed
    # (a pod replayed already, e.g. by apply_consolidation, is no longer bound: not in `fixed`)
    _replay_evictions(sess, fixed.evictions)
    sess.place_plan(fixed.placements)


def shape_pools(sess: Session, groups: list[GroupScope], shapes: list[Shape]) -> list[Pool]:
    """Shapes of different groups whose pods are interchangeable on every node (same requests, GPU needs and
    scheduling signature) share one count per node: the model then decides per (pool, node) and per shape how
    many of its pods go, so identical gangs cost one set of node variables. A shape of a group with a required
    topology level keeps its own (the domain is the group's)."""
    by_key: dict[tuple[Any, ...], Pool] = {}
    pools: list[Pool] = []
    for gs in groups:
        own = gs.topology >= 0 and gs.required_level >= 0
        for s in gs.shapes:
            p0 = shapes[s].pods[0]
            if own:
                pools.append(Pool([s], pod=p0))
                continue
            key = pool_key(sess, p0)
            if key not in by_key:
                by_key[key] = Pool([], pod=p0)
                pools.append(by_key[key])
            by_key[key].shapes.append(s)
    return pools


def subgroup_domains(st: ClusterState) -> np.ndarray:
    """Per podgroup: some sub-group of it has a required topology level."""
    out = np.zeros(st.n_groups, dtype=bool)
    req = (st.sg_topology >= 0) & (st.sg_required_level >= 0)
    out[st.sg_pg[req]] = True
    return out


def pool_key(sess: Session, p: int) -> tuple[Any, ...]:
    """What decides where pod p fits (its shape key without the sub-group)."""
    return _shape_key(sess, p)[1:]


def _movable(sess: Session, groups: list[GroupScope], greedy: Plan) -> tuple[list[int], np.ndarray]:
    """Consolidation inside the model: (the scope groups a move may serve, the running pods that may move). The
    greedy's consolidation rules: the beneficiary is preemptible and its queue within its fair share; victims are
    preemptible, and each moved pod is re-placed in the same plan. Pods of groups the greedy plan evicts, of
    pending groups, of groups with a required topology level (or a sub-group with one), with pod (anti-)affinity
    or with gpu-memory requests (whose queue request depends on the node) stay."""
    st, cfg = sess.state, sess.cfg
    none = np.zeros(0, dtype=np.int64)
    if not cfg.actions.on("consolidate") or cfg.max_consolidation_preemptees == 0 or st.n_nodes > MOVE_MAX_NODES:
        return [], none
    move_for = [i for i, gs in enumerate(groups)
                if gs.preemptible and can_reclaim(sess.fs, sess.ledger, gs.queue, _min_request(sess, gs),
                                                  preemptible=True)]
    if not move_for:
        return [], none
    stay = np.zeros(st.n_groups, dtype=bool)
    stay[[int(st.pod_pg[e.pod]) for e in greedy.evictions]] = True
    stay[[gs.group for gs in groups]] = True
    stay |= ((st.pg_topology >= 0) & (st.pg_required_level >= 0)) | subgroup_domains(st)
    stay |= ~st.pg_preemptible.astype(bool)
    pods = np.flatnonzero((sess.status == PodStatus.BOUND) & (st.pod_pg >= 0) & (st.pod_gpu_mem == 0))
    pods = pods[~stay[st.pod_pg[pods]]]
    keep = [not (st.pods[p].pod_affinity or st.pods[p].pod_anti_affinity) for p in pods.tolist()]
    return move_for, pods[np.array(keep, dtype=bool)] if len(pods) else pods


MOVE_BUDGET = 3_000  # running pods one model may move, at most (on the nodes with the most free GPUs first)
MOVES_PER_SECOND = 600  # and at most this many per second of the time budget: each mover costs variables on its
# node's devices, and the model must be built, solved and decoded within the budget (see docs/DESIGN-NOTES.md)


def move_budget(cfg: Config, decisions: int = 0) -> int:
    """Running pods one model may move under this configuration's time budget."""
    return min(MOVE_BUDGET, int(MOVES_PER_SECOND * model_seconds(cfg, decisions)))
# moves only in clusters up to this size: above it the larger model with moves finds less than the one without
# (docs/DESIGN-NOTES.md, "Model size constants")
MOVE_MAX_NODES = 2_000


def _add_movers(sess: Session, acts: Actions, scope: Scope, movable: np.ndarray, per_shape_nodes: int,
                most: int) -> None:
    """The movable pods on the model's nodes (those where moving them could let a pending pod fit) become
    movers: per (pool, group, node, devices), in pools with the pending pods they are interchangeable with, or in
    pools of their own (candidate nodes: the best-fitting)."""
    st = sess.state
    if not len(movable) or not len(scope.nodes):
        return
    nodes = scope.nodes[np.argsort(-(sess.alloc[scope.nodes, R_GPU] - sess.held[scope.nodes, R_GPU]),
                                   kind="stable")]
    rank = np.full(st.n_nodes, -1, dtype=np.int64)
    rank[nodes] = np.arange(len(nodes))
    pods = movable[rank[sess.node[movable]] >= 0]
    pods = pods[np.argsort(rank[sess.node[pods]], kind="stable")][:most]
    own = {k for gs in scope.groups if gs.topology >= 0 and gs.required_level >= 0 for k in gs.shapes}
    by_key = {pool_key(sess, pool.pod): i for i, pool in enumerate(scope.pools) if pool.shapes[0] not in own}
    classes: dict[tuple[Any, ...], Mover] = {}
    for p in pods.tolist():
        g = int(st.pod_pg[p])
        key = pool_key(sess, p)
        if key not in by_key:
            by_key[key] = len(scope.pools)
            scope.pools.append(Pool([], pod=p))
        pool = by_key[key]
        devices = sess.pod_devices(p) if not st.pod_gpu_whole[p] else (p,)  # whole-GPU pods one by one
        ckey = (pool, g, int(sess.node[p]), devices)
        if ckey not in classes:
            classes[ckey] = Mover(pool, g, int(sess.node[p]), [])
            scope.pools[pool].movers.append(len(scope.movers))
            scope.movers.append(classes[ckey])
        classes[ckey].pods.append(p)
    fresh = [pool for pool in scope.pools if not pool.shapes]
    if fresh:
        _candidate_nodes(sess, acts, fresh, {}, [], per_shape_nodes)
        scope.nodes = np.unique(np.concatenate([scope.nodes] + [pool.nodes for pool in fresh]))
    if scope.movers:
        scope.notes.append(f"{len(pods)} running pods the model may move (consolidation) for "
                           f"{len(scope.move_for)} eligible groups")


def placed_per_group(st: ClusterState, plan: Plan) -> Counter[int]:
    """Podgroup -> pods the plan places (moves not counted)."""
    pods = np.fromiter((pl.pod for pl in plan.placements if not pl.moved), dtype=np.int64)
    groups, counts = np.unique(st.pod_pg[pods], return_counts=True)
    return Counter(dict(zip(groups.tolist(), counts.tolist(), strict=True)))


def replayed_evictions(st: ClusterState, greedy: Plan) -> list[Eviction]:
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


def _replay_evictions(sess: Session, evictions: list[Eviction]) -> None:
    """Evict in the plan's order, each with its reason and beneficiary (one session step)."""
    sess.evict_each([e.pod for e in evictions], [e.reason for e in evictions], [e.beneficiary for e in evictions])


def apply_consolidation(sess: Session, greedy: Plan) -> None:
    """Replay the greedy plan's moves (consolidation, and victims of reclaim or preempt that were re-placed) and
    their evictions on a fresh session: the model and the decoder start from there, so the room the moves made is
    there for the model too, and the groups they made room for stay placed (Scope.keep)."""
    st = sess.state
    _replay_evictions(sess, replayed_evictions(st, greedy))
    for pl in greedy.placements:
        if pl.moved:
            base = int(st.dev_start[pl.node])
            sess.place(pl.pod, pl.node, tuple(base + d for d in pl.devices), pipelined=True, moved=True)


def _victims(sess: Session, groups: list[GroupScope], candidates: set[int],
             chosen: frozenset[int] | set[int] = frozenset()) -> list[Victim]:
    """Running units some scoped group may evict, with the rule that allows it (KAI's preempt and reclaim), among
    the groups of the `candidates` pods (the greedy plan's victims); groups in `chosen` are kept with no
    beneficiary the rules here allow (build_scope adds the greedy's)."""
    st, fs = sess.state, sess.fs
    if not groups:
        return []
    requests = [_min_request(sess, gs) for gs in groups]
    reclaim_on = sess.cfg.actions.on("reclaim")
    may_reclaim = np.array([reclaim_on and can_reclaim(fs, sess.ledger, gs.queue, req, preemptible=gs.preemptible)
                            for gs, req in zip(groups, requests, strict=True)], dtype=bool)
    out: list[Victim] = []
    g_group = np.array([gs.group for gs in groups], dtype=np.int64)
    g_queue = np.array([gs.queue for gs in groups], dtype=np.int64)
    g_priority = np.array([gs.priority for gs in groups], dtype=np.int64)
    g_request = np.array(requests, dtype=float)
    preempt_on = sess.cfg.actions.on("preempt")
    paths = queue_paths(sess)
    # per victim queue, which scope groups the reclaim rule allows at cycle start: compared where the two queue
    # paths diverge (KAI's leveled queues), the victim side must be above its allocatable share, or above deserved
    # while the reclaimer side stays within its own (MaintainFairShare / GuaranteeDeservedQuota)
    rule: dict[int, np.ndarray] = {}
    bound_now = (sess.status == PodStatus.BOUND) & (st.pod_pg >= 0)
    wanted = {int(st.pod_pg[p]) for p in candidates if bound_now[p]}
    running_groups = sorted(set(st.pod_pg[bound_now].tolist()) & wanted)
    for v in running_groups:
        if not st.pg_preemptible[v]:
            continue
        vq = int(st.pg_queue[v])
        others = g_group != v
        same = others & (g_queue == vq)
        preempt = same & (g_priority > int(st.pg_priority[v])) if preempt_on else np.zeros(len(groups), dtype=bool)
        if preempt.any() and protected_by_min_runtime(sess, v, "preempt"):
            preempt[:] = False
        reclaim = others & (g_queue != vq) & may_reclaim
        if reclaim.any():
            if protected_by_min_runtime(sess, v, "reclaim"):
                reclaim[:] = False
            else:
                allowed = rule.get(vq)
                if allowed is None:
                    rq, wq = leveled_many(paths, g_queue, np.full(len(g_queue), vq))
                    allowed = rule[vq] = fits_strategy_many(fs, sess.ledger, g_request, rq, wq)
                reclaim &= allowed
        bens = {i: "preempt" if preempt[i] else "reclaim" for i in np.flatnonzero(preempt | reclaim).tolist()}
        if not bens and v not in chosen:
            continue
        pods = st.group_pods(v)
        bound = pods[sess.status[pods] == PodStatus.BOUND].tolist()
        m = int(st.pg_min_member[v])
        extras = bound[m:] if len(bound) > m else []
        core = bound[:m] if len(bound) > m else bound
        for p in reversed(extras):
            out.append(Victim(v, [p], False, list(bens), dict(bens)))  # each unit its own (build_scope adds)
        if core:
            out.append(Victim(v, core, True, list(bens), dict(bens)))
    return out


def _min_request(sess: Session, gs: GroupScope) -> np.ndarray:
    st = sess.state
    pods = st.group_pods(gs.group)
    pend = pods[pending_mask(sess, pods)][: max(1, gs.need)]
    return sess.queue_request(pend.tolist()).sum(axis=0) if len(pend) else np.zeros(3)


def _candidate_nodes(sess: Session, acts: Actions, pools: list[Pool], greedy_nodes: dict[int, set[int]],
                     victims: list[Victim], cap: int, shapes: list[Shape] | None = None,
                     movable: np.ndarray | None = None, roomy_out: np.ndarray | None = None) -> None:
    """Candidate nodes per pool: the nodes the greedy used for its pods, the best-fitting others, nodes where
    evictions could make room, and nodes where moving the movable pods away would, up to `cap` (or 4 per pending
    pod) of each kind. `roomy_out` (per node) is set where some pool fits only once movable pods have left."""
    st = sess.state
    placer = acts.placer
    victim_nodes = np.zeros(st.n_nodes, dtype=bool)
    for v in victims:
        for p in v.pods:
            victim_nodes[int(sess.node[p])] = True
    future = sess.alloc - sess.held
    room = future.astype(np.float64)  # free once every movable pod has left (whole GPUs: devices)
    whole_room = sess.whole_future.astype(np.float64)
    if movable is not None and len(movable):
        np.add.at(room, sess.node[movable], st.pod_req[movable])
        np.add.at(whole_room, sess.node[movable], st.pod_gpu_whole[movable])
    for pool in pools:
        p = pool.pod
        static = placer.static_mask(int(st.pod_sig[p]))
        cand = np.nonzero(static)[0]
        cand = cand[placer.gpu_memory_ok(p, cand)]  # also where evictions or moves make room (KAI's gpu-memory rule)
        if len(cand) == 0:
            pool.nodes = cand
            continue
        _, fits = placer.fit(p, cand)
        roomy = np.zeros(len(cand), dtype=bool)
        if movable is not None and len(movable):
            req = st.pod_req[p]
            roomy = ~fits & np.all((room[cand] >= req) | (np.arange(len(req)) == R_GPU), axis=1)
            if st.pod_gpu_whole[p]:
                roomy &= whole_room[cand] >= int(st.pod_gpu_whole[p])
            elif st.pod_gpu_frac[p] or st.pod_gpu_mem[p]:
                roomy &= room[cand, R_GPU] > 0
        ok = fits | victim_nodes[cand] | roomy
        roomy_nodes = cand[roomy]
        if roomy_out is not None:
            roomy_out[roomy_nodes] = True
        cand = cand[ok]
        members = [q for k in pool.shapes for q in shapes[k].pods] if shapes is not None else []
        hinted = sorted({n for q in members for n in greedy_nodes.get(q, ())})
        limit = max(cap, 4 * len(members))
        if len(cand) > limit:
            col = R_GPU if st.pod_req[p, R_GPU] > 0 else 0
            free = future[cand, col]
            fitting = cand[np.argsort(free, kind="stable")]  # best fit first (fewest free that still fit)
            chosen = list(dict.fromkeys(hinted + fitting[:limit].tolist() + cand[victim_nodes[cand]][:limit].tolist()
                                        + roomy_nodes[:limit].tolist()))
            cand = np.array(chosen, dtype=np.int64)
        else:
            cand = np.array(sorted(set(cand.tolist()) | set(hinted)), dtype=np.int64)
        pool.nodes = cand
