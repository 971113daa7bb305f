"""Build the CP-SAT model of one cycle: variables named by meaning, constraints in the order of DESIGN 5.

Variables
  place[k, n]     pods of pool k on node n (integer); a pool is one shape, or the interchangeable shapes of several
                  groups and running pods that may move (scope.Pool)
  placed[s]       pods of shape s placed, for a shape in a pool of several (else the sum of its place[k, n])
  move[c]         running pods of mover c leaving their node (consolidation), re-placed through their pool
  pool_total[k]   pods of pool k placed in all (pools with movers on nodes decided device by device)
  gang[i]         group i placed (its minimum, and any elastic extras)
  on_device[k, d] share pods of size k (milli-GPU per device, devices) on GPU device d (nodes where shares go)
  whole_dev[d]    device d handed to whole-GPU pods (those nodes)
  domain[i, d]    group i inside domain d of its required topology level
  evict_pre[v], evict_rec[v]   victim unit v evicted for a preemptor (same queue) / a reclaimer (other queue)
  reclaims[i]     group i takes resources from other queues
  takes[i, s]     group i takes victims under sibling queue s (then KAI's boundary rule against s holds)
  within[q, r, i] queue q (group i's side) within its fair share on resource r at i's turn
  ranked_work[q, r, i]  queue q's resource r placed by the groups ranked up to i (a running sum)
  evicted_by[q, r, t]   queue q's resource r freed by the evictions the greedy dated up to turn t
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from kai_opt.formulation.exprs import Expr, lsum, wsum
from kai_opt.formulation.objective import Objective
from kai_opt.formulation.reclaim_rows import QueueTerms, ReclaimRows, reclaim_rows
from kai_opt.formulation.scope import Mover, Scope, Victim
from kai_opt.heuristics.cheapest_victims import queue_paths
from kai_opt.heuristics.session import DEV, Session
from kai_opt.state import R_GPU, ClusterState

UNLIMITED = -1.0
QSCALE = (1000.0, 1.0, 1.0)  # queue resources to integers: milli-GPU, millicores, bytes (exact: a queue at exactly
# its fair share or limit must compare as the greedy's float comparison does, see tests/test_cpsat_hint.py)
EPS = 1e-6


def scaled_up(x: np.ndarray) -> np.ndarray:
    """Scaled amounts a placement adds, rounded up (never under-counted)."""
    return np.ceil(np.asarray(x) * np.array(QSCALE) - EPS).astype(np.int64)


def scaled_down(x: np.ndarray) -> np.ndarray:
    """Scaled amounts an eviction frees, and caps, rounded down (never over-counted)."""
    return np.floor(np.asarray(x) * np.array(QSCALE) + EPS).astype(np.int64)


@dataclass
class Built:
    model: cp_model.CpModel
    place: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)  # (pool, node)
    pool_of: dict[int, int] = field(default_factory=dict)  # shape -> its pool
    move: list[cp_model.IntVar] = field(default_factory=list)  # per scope mover: pods moved off its node
    moved_group: dict[int, cp_model.IntVar] = field(default_factory=dict)  # group -> some pod moved
    serving: cp_model.IntVar | None = None  # some placed group consolidation may serve (moves allowed)
    placed: dict[int, cp_model.IntVar] = field(default_factory=dict)  # shape of a pool of several -> pods placed
    gang: list[cp_model.IntVar] = field(default_factory=list)
    on_device: dict[tuple[tuple[int, int], int], cp_model.IntVar] = field(default_factory=dict)  # (size, device)
    whole_dev: dict[int, cp_model.IntVar] = field(default_factory=dict)
    domain: dict[tuple[int, int], cp_model.IntVar] = field(default_factory=dict)
    evict_pre: list[cp_model.IntVar] = field(default_factory=list)
    evict_rec: list[cp_model.IntVar] = field(default_factory=list)
    reclaims: dict[int, cp_model.IntVar] = field(default_factory=dict)  # scope group -> placed by reclaiming
    reclaim_rows: ReclaimRows = field(default_factory=ReclaimRows)  # the reclaimer-side rule's variables
    # (sum var, previous sum var | None, [(shape, coef)])
    derived: list[tuple[cp_model.IntVar, cp_model.IntVar | None, list[tuple[int, int]]]] = field(default_factory=list)
    # (sum var, [(victim unit, coef)]): freed per queue
    evicted_sums: list[tuple[cp_model.IntVar, list[tuple[int, int]]]] = field(default_factory=list)
    value: Expr = 0  # tier 1: priority-weighted work placed
    eviction_cost: Expr = 0  # tier 2
    packing: Expr = 0  # tier 3
    value_terms: dict[int, int] = field(default_factory=dict)  # shape -> weight per pod (for hints / reports)
    totals: dict[int, Expr] = field(default_factory=dict)  # shape -> its pods placed
    place_most: dict[tuple[int, int], int] = field(default_factory=dict)  # (pool, node) -> its place var's bound
    pool_total: dict[int, cp_model.IntVar] = field(default_factory=dict)  # pool -> its places (_moves_leave_their_node)
    evicted: list[Expr] = field(default_factory=list)  # per victim unit: evicted (0/1)


def _qreq(sess: Session, pods: list[int]) -> np.ndarray:
    """Integer queue request per pod (milli-GPU, millicores, MB); gpu-memory pods at their largest fraction."""
    q = sess.queue_request(pods[:1]).reshape(-1)
    return scaled_up(q)


def build_model(sess: Session, scope: Scope) -> Built:
    """The model of one cycle's scope: each family of variables and constraints from its own builder, in the
    order of DESIGN 5, then the objective's three tiers (kai_opt.formulation.objective)."""
    st = sess.state
    b = Built(model=cp_model.CpModel())
    b.gang = [b.model.new_bool_var(f"gang[{st.pg_keys[g.group]}]") for g in scope.groups]
    _move_vars(sess, scope, b)
    _placement_vars(sess, scope, b)
    _gang_rows(scope, b)
    _eviction_vars(sess, scope, b)
    _capacity_rows(sess, scope, b)
    _topology_rows(sess, scope, b)
    _queue_constraints(sess, b, scope, b.totals, b.evicted)
    _objective_terms(sess, scope, b)
    return b


def _move_vars(sess: Session, scope: Scope, b: Built) -> None:
    """Consolidation moves: running pods leaving their node, each re-placed through its pool; only while a group
    consolidation may serve is placed, and on at most max_consolidation_preemptees groups per served group."""
    st, m = sess.state, b.model
    b.move = [m.new_int_var(0, len(mv.pods), f"move[{st.pods[mv.pods[0]].name}~{len(mv.pods)},"
                                             f"{st.node_names[mv.node]}]") for mv in scope.movers]
    if scope.movers:
        served = lsum([b.gang[j] for j in scope.move_for])  # groups consolidation may serve that are placed
        # moves only while one is: one literal for it, so each mover's bound has two terms (not the whole sum)
        b.serving = m.new_bool_var("consolidation_serves")
        m.add(b.serving <= served)
        for mv, x in zip(scope.movers, b.move, strict=True):
            m.add(x <= len(mv.pods) * b.serving)
        limit = sess.cfg.max_consolidation_preemptees
        if limit > 0:  # KAI's cap on victim jobs, per consolidating group
            moved_group: dict[int, cp_model.IntVar] = {}
            for mv, x in zip(scope.movers, b.move, strict=True):
                if mv.group not in moved_group:
                    moved_group[mv.group] = m.new_bool_var(f"moved[{st.pg_keys[mv.group]}]")
                m.add(x <= len(mv.pods) * moved_group[mv.group])
            b.moved_group = moved_group
            m.add(lsum(list(moved_group.values())) <= limit * served)


def _moves_leave_their_node(scope: Scope, b: Built, nodes: set[int]) -> None:
    """A pod moved off one of `nodes` (decided device by device) is re-placed on another node: its pool's moves
    off n never exceed the pool's places on the other nodes. Without it a place on its own node could stand for
    the pod re-placed on other devices of n, a shuffle decode cannot carry out (no move lands on its own node).
    Elsewhere such a place is the pod staying where it is (decode keeps it), which the search may use freely."""
    off: dict[int, dict[int, list[cp_model.IntVar]]] = defaultdict(lambda: defaultdict(list))  # pool -> node ->
    for c, mv in enumerate(scope.movers):
        if mv.node in nodes and (mv.pool, mv.node) in b.place:  # (no place on n: the pool's total bounds them)
            off[mv.pool][mv.node].append(b.move[c])
    if not off:
        return
    m = b.model
    places: dict[int, list[tuple[cp_model.IntVar, int]]] = defaultdict(list)
    for (pi, n), v in b.place.items():
        if pi in off:
            places[pi].append((v, b.place_most[(pi, n)]))
    for pi, by_node in off.items():
        total = m.new_int_var(0, sum(most for _v, most in places[pi]), f"pool_total[{pi}]")
        b.pool_total[pi] = total
        m.add(total == lsum([v for v, _most in places[pi]]))  # (named once: each node's row has a few terms)
        for n, xs in by_node.items():
            m.add(lsum(xs) + b.place[(pi, n)] <= total)


def _placement_vars(sess: Session, scope: Scope, b: Built) -> None:
    """Placements per (pool, candidate node), capped by what the node could ever hold; per shape of a pool of
    several the pods placed; a shape places only when its group does."""
    st, m = sess.state, b.model
    shapes = scope.shapes
    group_of_shape = {s: i for i, g in enumerate(scope.groups) for s in g.shapes}
    totals = b.totals
    most_here = b.place_most
    node_room = _NodeRoom(sess, scope.victims, scope.movers)
    for pi, pool in enumerate(scope.pools):
        p0 = pool.pod
        label = st.pods[p0].name + ("~" if len(pool.shapes) + len(pool.movers) == 1
                                    else f"~+{len(pool.shapes) + len(pool.movers) - 1}")
        most = sum(len(shapes[k].pods) for k in pool.shapes) + sum(len(scope.movers[c].pods) for c in pool.movers)
        terms = []
        caps = node_room.caps(p0, pool.nodes)
        for n, cap in zip(pool.nodes[caps > 0].tolist(), np.minimum(caps[caps > 0], most).tolist(), strict=True):
            v = m.new_int_var(0, cap, f"place[{label},{st.node_names[n]}]")
            b.place[(pi, n)] = v
            most_here[(pi, n)] = cap
            terms.append(v)
        for k in pool.shapes:
            b.pool_of[k] = pi
        if len(pool.shapes) == 1 and not pool.movers:
            totals[pool.shapes[0]] = lsum(terms)
        else:
            for k in pool.shapes:
                b.placed[k] = m.new_int_var(0, len(shapes[k].pods), f"placed[{st.pods[shapes[k].pods[0]].name}~]")
                totals[k] = b.placed[k]
            m.add(lsum(terms) == lsum([b.placed[k] for k in pool.shapes] + [b.move[c] for c in pool.movers]))
        for k in pool.shapes:
            m.add(totals[k] <= len(shapes[k].pods) * b.gang[group_of_shape[k]])


def _gang_rows(scope: Scope, b: Built) -> None:
    """A placed group reaches its minimum (and each sub-group its own); an elastic one at least one more pod; a
    group the greedy plan placed stays placed with at least as many pods."""
    m, shapes, totals = b.model, scope.shapes, b.totals
    for i, g in enumerate(scope.groups):
        group_total = lsum([totals[s] for s in g.shapes])
        m.add(group_total >= g.need * b.gang[i])
        if g.need == 0:
            m.add(group_total >= b.gang[i])  # an elastic group "placed" means at least one more pod
        for sg, need in g.sub_need.items():
            sub_total = lsum([totals[s] for s in g.shapes if shapes[s].subgroup == sg])
            if need > 0:
                m.add(sub_total >= need * b.gang[i])
        if g.fixed_domain == -2:
            m.add(b.gang[i] == 0)  # its running pods already span several domains: no room to grow
        if i in scope.keep:  # the greedy plan placed it: keep at least as many of its pods
            m.add(b.gang[i] == 1)
            m.add(group_total >= scope.keep[i])


def _eviction_vars(sess: Session, scope: Scope, b: Built) -> None:
    """Victim units evicted for an allowed, placed preemptor or reclaimer; a victim gang keeps its minimum or
    goes whole, core last; a group whose core goes is not placed."""
    st, m = sess.state, b.model
    groups, victims = scope.groups, scope.victims
    for v in victims:
        pre = [j for j in v.beneficiaries if v.reason_for[j] == "preempt"]
        rec = [j for j in v.beneficiaries if v.reason_for[j] == "reclaim"]
        label = f"{st.pods[v.pods[0]].name}{'~core' if v.core else ''}"
        ep = m.new_bool_var(f"evict_pre[{label}]")
        er = m.new_bool_var(f"evict_rec[{label}]")
        m.add(ep + er <= 1)
        m.add(ep <= lsum([b.gang[j] for j in pre]) if pre else ep == 0)  # only for an allowed, placed preemptor
        m.add(er <= lsum([b.gang[j] for j in rec]) if rec else er == 0)  # only for an allowed, placed reclaimer
        b.evict_pre.append(ep)
        b.evict_rec.append(er)
    evicted: list[Expr] = [b.evict_pre[i] + b.evict_rec[i] for i in range(len(victims))]
    b.evicted = evicted
    by_group: dict[int, list[int]] = defaultdict(list)
    for vi, v in enumerate(victims):
        by_group[v.group].append(vi)
    scope_of = {g.group: i for i, g in enumerate(groups)}
    for vi, v in enumerate(victims):  # a group whose core goes is not also placed (it would end below minMember)
        if v.core and v.group in scope_of:
            m.add(evicted[vi] + b.gang[scope_of[v.group]] <= 1)
    for units in by_group.values():  # the core goes only after every elastic pod above the minimum
        cores = [u for u in units if victims[u].core]
        extras = [u for u in units if not victims[u].core]
        for c in cores:
            for e in extras:
                m.add(evicted[c] <= evicted[e])


def _capacity_rows(sess: Session, scope: Scope, b: Built) -> None:
    """Node capacity once releases and evictions finish: per resource, and whole GPUs per node, or per device on
    nodes where shares go or leave."""
    st, m = sess.state, b.model
    victims, evicted, most_here = scope.victims, b.evicted, b.place_most
    future = sess.alloc - sess.held
    cols = [c for c in range(len(st.resources)) if c != R_GPU]
    on_node: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    for (pi, n), v in b.place.items():
        on_node[n].append((scope.pools[pi].pod, v))  # (a pod of the pool, its count here)
    # node -> (how many leave, one of them, at most): victim pods evicted, moved pods
    released: dict[int, list[tuple[Expr, int, int]]] = defaultdict(list)
    for vi, victim in enumerate(victims):
        for p in victim.pods:
            released[int(sess.node[p])].append((evicted[vi], p, 1))
    for mv, x in zip(scope.movers, b.move, strict=True):
        released[mv.node].append((x, mv.pods[0], len(mv.pods)))
    share_nodes = {n for n, items in on_node.items() if any(is_share(st, p) for p, _v in items)}
    # a victim holding a GPU share frees part of a device: only the device-level constraints count that right
    share_nodes |= {n for n, items in released.items() if any(is_share(st, p) for _, p, _k in items)}
    # a device a leaving pod shares with a pod that stays (a kept greedy placement pipelined onto it) is not freed
    # whole by the eviction: counting released whole GPUs per node would free it twice
    share_nodes |= {n for n, items in released.items() if _shared_devices(sess, [p for _x, p, _k in items])}
    _moves_leave_their_node(scope, b, share_nodes)
    # per node, in bulk: what its place variables could take at their upper bounds (resources, whole GPUs), and
    # whether a whole-GPU pod may go there at all; a row that holds even then, with nothing leaving, is implied
    k = len(b.place)
    item_node = np.fromiter((n for _pi, n in b.place), dtype=np.int64, count=k)
    item_pod = np.fromiter((scope.pools[pi].pod for pi, _n in b.place), dtype=np.int64, count=k)
    item_most = np.fromiter((most_here[key] for key in b.place), dtype=np.int64, count=k)
    item_whole = st.pod_gpu_whole[item_pod].astype(np.int64)
    peak = np.zeros((st.n_nodes, st.pod_req.shape[1]), dtype=np.int64)
    np.add.at(peak, item_node, item_most[:, None] * st.pod_req[item_pod].astype(np.int64))
    whole_peak = np.zeros(st.n_nodes, dtype=np.int64)
    np.add.at(whole_peak, item_node, item_most * item_whole)
    has_whole = np.zeros(st.n_nodes, dtype=bool)
    has_whole[item_node[item_whole > 0]] = True
    over = peak[:, cols] > future[:, cols]
    whole_over = has_whole & (whole_peak > sess.whole_future)
    for n, items in on_node.items():
        rel = released[n]
        rows = [c for c, o in zip(cols, over[n].tolist(), strict=True) if o]
        if rows:  # per resource: placed - released <= free now, one weighted sum per row (the coefficients in bulk)
            exprs = [v for _p, v in items] + [x for x, _p, _k in rel]
            pods = np.array([p for p, _v in items] + [p for _x, p, _k in rel], dtype=np.int64)
            sign = np.concatenate((np.ones(len(items), dtype=np.int64), -np.ones(len(rel), dtype=np.int64)))
            reqs = st.pod_req[pods].astype(np.int64) * sign[:, None]
            for c in rows:
                m.add(wsum(exprs, reqs[:, c].tolist()) <= int(future[n, c]))
        share = n in share_nodes
        if not (share or whole_over[n]):
            continue
        wpods = [(p, v) for p, v in items if st.pod_gpu_whole[p]]
        whole_use = wsum([v for _p, v in wpods], [int(st.pod_gpu_whole[p]) for p, _v in wpods])
        if share:
            _device_constraints(sess, b, n, items, rel, whole_use)
        else:
            wrel = [(x, p) for x, p, _k in rel if st.pod_gpu_whole[p]]
            m.add(whole_use - wsum([x for x, _p in wrel], [int(st.pod_gpu_whole[p]) for _x, p in wrel])
                  <= int(sess.whole_future[n]))


def _shared_devices(sess: Session, leaving: list[int]) -> bool:
    """Whether a device the `leaving` pods hold is held by more than they hold of it."""
    st = sess.state
    held: dict[int, int] = defaultdict(int)
    for p in leaving:
        per = st.pod_gpu_per_device(p, int(sess.node[p]))
        for d in sess.pod_devices(p):
            held[int(d)] += per
    return any(int(sess.dev_held[d]) > h for d, h in held.items())


def _topology_rows(sess: Session, scope: Scope, b: Built) -> None:
    """A group with a required topology level places inside one domain of it (the one its running pods are in)."""
    st, m, shapes = sess.state, b.model, scope.shapes
    for i, g in enumerate(scope.groups):
        if g.topology < 0 or g.required_level < 0:
            continue
        dom = st.topologies[g.topology].domain[g.required_level]
        nodes_by_dom: dict[int, list[tuple[int, int]]] = defaultdict(list)  # domain -> (shape, node)
        for s in g.shapes:  # each in a pool of its own (scope.shape_pools)
            for n in shapes[s].nodes.tolist():
                if (b.pool_of[s], n) in b.place:
                    nodes_by_dom[int(dom[n])].append((s, n))
        choices = []
        for d, keys in nodes_by_dom.items():
            if d < 0 or (g.fixed_domain >= 0 and d != g.fixed_domain):
                for s, n in keys:
                    m.add(b.place[(b.pool_of[s], n)] == 0)
                continue
            d_name = st.topologies[g.topology].domain_names[g.required_level][d]
            x = m.new_bool_var(f"domain[{st.pg_keys[g.group]},{d_name}]")
            b.domain[(i, d)] = x
            choices.append(x)
            for s, n in keys:
                m.add(b.place[(b.pool_of[s], n)] <= len(shapes[s].pods) * x)
        if choices:
            m.add(lsum(choices) == b.gang[i])
        else:
            m.add(b.gang[i] == 0)


def _objective_terms(sess: Session, scope: Scope, b: Built) -> None:
    """Tier 1 (work placed), tier 2 (eviction cost) and tier 3 (packing) as expressions, weights from
    kai_opt.formulation.objective."""
    st, shapes, groups, victims, evicted = sess.state, scope.shapes, scope.groups, scope.victims, b.evicted
    obj = Objective(st, sess.fs)
    first = [shapes[s].pods[0] for g in groups for s in g.shapes]
    work = obj.work(np.array(first, dtype=np.int64)).tolist() if first else []
    for s, w in zip([s for g in groups for s in g.shapes], work, strict=True):
        b.value_terms[s] = int(w)
    b.value = wsum([b.totals[s] for s in b.value_terms], list(b.value_terms.values()))
    units = [int(obj.eviction_cost(np.array(v.pods, dtype=np.int64)).sum()) for v in victims]
    moving = obj.eviction_cost(np.array([mv.pods[0] for mv in scope.movers], dtype=np.int64)).tolist() \
        if scope.movers else []  # a move costs as its eviction would, per pod
    b.eviction_cost = wsum(list(evicted) + list(b.move), units + moving)
    keys = [k for k in b.place if st.pod_req[scope.pools[k[0]].pod, R_GPU] > 0]
    full = obj.fullness(np.array([n for _pi, n in keys], dtype=np.int64)).tolist() if keys else []
    b.packing = wsum([b.place[k] for k in keys], full)


class _NodeRoom:
    """Per node, what could ever be free in this cycle (every candidate victim evicted and every mover gone),
    as arrays over all nodes and devices, so a pool's caps over its candidate nodes are one vector operation."""

    def __init__(self, sess: Session, victims: list[Victim], movers: list[Mover]) -> None:
        self.sess = sess
        st = sess.state
        self.room = (sess.alloc - sess.held).astype(np.int64)
        self.dev_free = (DEV - sess.dev_held).astype(np.int64)
        leaving = [q for v in victims for q in v.pods] + [q for mv in movers for q in mv.pods]
        if leaving:
            pods = np.array(leaving, dtype=np.int64)
            np.add.at(self.room, sess.node[pods], st.pod_req[pods].astype(np.int64))
            for q in leaving:
                per = st.pod_gpu_per_device(q, int(sess.node[q]))
                for d in sess.pod_devices(q):
                    self.dev_free[int(d)] += per
        self.starts = np.asarray(sess.dev_start, dtype=np.int64)
        self._whole = self._per_node(self.dev_free >= DEV)

    def _per_node(self, per_device: np.ndarray) -> np.ndarray:
        """Sum of a per-device quantity over each node's devices."""
        cs = np.concatenate(([0], np.cumsum(per_device, dtype=np.int64)))
        return cs[self.starts[1:]] - cs[self.starts[:-1]]

    def caps(self, p: int, nodes: np.ndarray) -> np.ndarray:
        """How many pods like p each of `nodes` could ever hold in this cycle."""
        st = self.sess.state
        req = st.pod_req[p].astype(np.int64)
        cols = [c for c in range(len(req)) if c != R_GPU and req[c] > 0]
        cap = np.full(len(nodes), 10_000, dtype=np.int64)
        for c in cols:
            cap = np.minimum(cap, self.room[nodes, c] // req[c])
        if st.pod_gpu_whole[p]:
            cap = np.minimum(cap, self._whole[nodes] // int(st.pod_gpu_whole[p]))
        elif st.pod_gpu_frac[p]:
            per = int(st.pod_gpu_frac[p])
            cap = np.minimum(cap, self._per_node(self.dev_free // per)[nodes] // max(1, int(st.pod_gpu_ndev[p])))
        elif st.pod_gpu_mem[p]:  # milli-GPU per device depends on the node's GPU memory
            ndev = max(1, int(st.pod_gpu_ndev[p]))
            for i, n in enumerate(nodes.tolist()):
                per = max(st.pod_gpu_per_device(p, n), 1)
                free = self.dev_free[self.starts[n]:self.starts[n + 1]]
                cap[i] = min(int(cap[i]), int((free // per).sum()) // ndev)
        return np.maximum(cap, 0)


def is_share(st: ClusterState, p: int) -> bool:
    return bool(st.pod_gpu_frac[p] or st.pod_gpu_mem[p])


def _device_constraints(sess: Session, b: Built, n: int, items: list[tuple[int, cp_model.IntVar]],
                        released: list[tuple[Expr, int, int]], whole_use: Expr) -> None:
    """Shares and whole GPUs on node n at device level: each device holds shares up to its free room, or is
    handed whole to a whole-GPU pod when nothing stays on it. `items`: (a pod of a pool, its count on n);
    `released`: (how many leave, one of them, at most) for victims and moved pods."""
    st, m = sess.state, b.model
    a, z = int(sess.dev_start[n]), int(sess.dev_start[n + 1])
    per_victim_dev: dict[int, list[tuple[Expr, int, int]]] = defaultdict(list)  # device ->
    for x, p, most in released:  # (how many leave, milli-GPU each, at most)
        per = st.pod_gpu_per_device(p, n)
        for d in sess.pod_devices(p):
            per_victim_dev[int(d)].append((x, per, most))
    whole_devs = []
    # shares of one size are interchangeable on a device: one count per (milli-GPU per device, devices per pod)
    # and device, whatever shape they come from
    pools: dict[tuple[int, int], list[cp_model.IntVar]] = defaultdict(list)  # size -> shape totals on this node
    for p, v in items:
        if is_share(st, p):
            pools[share_size(st, p, n)].append(v)
    per_pool_dev: dict[tuple[int, int], list[cp_model.IntVar]] = defaultdict(list)
    for d in range(a, z):
        held = int(sess.dev_held[d])
        leaving = per_victim_dev.get(d)
        gain = wsum([x for x, _per, _k in leaving], [per for _x, per, _k in leaving]) if leaving else 0
        most_free = DEV - held + (sum(per * k for _x, per, k in leaving) if leaving else 0)  # every victim gone
        if most_free <= 0:
            continue  # full whatever the model decides: no variables for it
        here: list[cp_model.IntVar] = []  # what the device holds: whole (DEV) or shares of each size
        milli: list[int] = []
        if most_free >= DEV:  # it can go whole only when nothing stays on it
            w = m.new_bool_var(f"whole_dev[{st.node_names[n]}#{d - a}]")
            b.whole_dev[d] = w
            whole_devs.append(w)
            if held:  # (held now, minus what victims release)
                m.add(held - gain <= DEV * (1 - w))
            here.append(w)
            milli.append(DEV)
        for size in pools:
            per = size[0]
            if per <= 0 or per > most_free:
                continue
            u = m.new_int_var(0, most_free // per, f"on_device[{per}m/{size[1]},{st.node_names[n]}#{d - a}]")
            b.on_device[(size, d)] = u
            per_pool_dev[size].append(u)
            here.append(u)
            milli.append(per)
        # (one variable alone, with nothing leaving the device, is within its room by its upper bound)
        if len(here) > 1 or (here and leaving):
            m.add(wsum(here, milli) - gain <= DEV - held)
    for size, vs in pools.items():  # a pod of n devices counts on n distinct devices: no device holds more of
        m.add(lsum(per_pool_dev[size]) == size[1] * lsum(vs))  # them than there are pods (then a round-robin
        if size[1] > 1:  # hands each pod distinct devices, see decode)
            for u in per_pool_dev[size]:
                m.add(u <= lsum(vs))
    m.add(whole_use <= lsum(whole_devs))


def share_size(st: ClusterState, p: int, n: int) -> tuple[int, int]:
    """A share pod's size on node n: (milli-GPU per device, devices per pod)."""
    return int(st.pod_gpu_per_device(p, n)), int(st.pod_gpu_ndev[p])


def _queue_constraints(sess: Session, b: Built, scope: Scope, totals: dict[int, Expr], evicted: list[Expr]) -> None:
    st, fs, m = sess.state, sess.fs, b.model
    groups, shapes, victims = scope.groups, scope.shapes, scope.victims
    anc = st.q_ancestors
    scale = np.array(QSCALE)
    qreqs = {s: _qreq(sess, shape.pods) for s, shape in enumerate(shapes)}
    placed_q: dict[int, list[tuple[Expr, np.ndarray, int]]] = defaultdict(list)  # queue -> [(expr, qreq, most pods)]
    placed_np_q: dict[int, list[tuple[Expr, np.ndarray, int]]] = defaultdict(list)
    for g in groups:
        for s in g.shapes:
            qr = qreqs[s]
            for q in anc[g.queue]:
                placed_q[q].append((totals[s], qr, len(shapes[s].pods)))
                if not g.preemptible:
                    placed_np_q[q].append((totals[s], qr, len(shapes[s].pods)))
    evicted_q: dict[int, list[tuple[int, np.ndarray]]] = defaultdict(list)  # queue -> [(victim unit, amount it frees)]
    unit_amounts: list[np.ndarray] = []
    for vi, v in enumerate(victims):
        qv = int(st.pg_queue[v.group])
        amt = scaled_down(sess.queue_request(v.pods, sess.node[np.array(v.pods)]).sum(axis=0))
        unit_amounts.append(amt)
        for q in anc[qv]:
            evicted_q[q].append((vi, amt))
    evicted_sum: dict[tuple[int, int], Expr] = {}

    def evicted_amount(q: int, r: int) -> Expr:
        """Queue q's resource r freed by the evictions: one variable per (queue, resource), since the reclaim rule
        repeats it for every reclaiming group (written out once, not per group)."""
        if (q, r) not in evicted_sum:
            units = [(vi, int(v[r])) for vi, v in evicted_q[q] if int(v[r])]
            if len(units) <= 1:
                evicted_sum[(q, r)] = wsum([evicted[vi] for vi, _c in units], [c for _vi, c in units])
            else:
                x = m.new_int_var(0, sum(c for _, c in units), f"evicted[{st.q_names[q]},{r}]")
                m.add(x == wsum([evicted[vi] for vi, _c in units], [c for _vi, c in units]))
                b.evicted_sums.append((x, units))
                evicted_sum[(q, r)] = x
        return evicted_sum[(q, r)]

    alloc = np.round(sess.ledger.allocated * scale).astype(np.int64)
    alloc_np = np.round(sess.ledger.allocated_np * scale).astype(np.int64)
    for q in sorted(placed_q):
        for r in range(3):
            lim = fs.limit[q, r]
            if lim != UNLIMITED:
                bound = max(int(np.floor(lim * scale[r] + EPS)), int(alloc[q, r]))
                net = (wsum([e for e, _v, _ in placed_q[q]], [int(v[r]) for _e, v, _ in placed_q[q]])
                       - evicted_amount(q, r))
                m.add(int(alloc[q, r]) + net <= bound)
    for q in sorted(placed_np_q):
        for r in range(3):
            des = fs.deserved[q, r]
            if des != UNLIMITED:
                bound = max(int(np.floor(des * scale[r] + EPS)), int(alloc_np[q, r]))
                m.add(wsum([e for e, _v, _ in placed_np_q[q]], [int(v[r]) for _e, v, _ in placed_np_q[q]])
                      <= bound - int(alloc_np[q, r]))
    # reclaim, victim side (KAI checks each chunk against the victim queue's allocation at that point): the model
    # evicts only units the greedy evicted for the same rule (build_scope), so any subset of them leaves every
    # victim queue at least as high as the greedy's checks saw it; no aggregate constraint is needed here.
    # Reclaimer side: KAI's boundary rule against each sibling queue victims are taken from (reclaim_rows)
    most: dict[tuple[int, int], int] = {}

    def evicted_most(q: int, r: int) -> int:
        """The most evictions free under queue q on resource r (every unit evicted)."""
        if (q, r) not in most:
            most[(q, r)] = sum(int(v[r]) for _vi, v in evicted_q[q])
        return most[(q, r)]

    terms = QueueTerms(scale, alloc, qreqs, totals, evicted, unit_amounts, evicted_amount, evicted_most)
    rows = reclaim_rows(m, st, fs, queue_paths(sess), scope, terms, b.gang, b.evict_rec,
                        sess.cfg.reclaim_saturation_multiplier)
    b.reclaim_rows = rows
    b.reclaims = rows.uses
    b.derived.extend(rows.derived)
