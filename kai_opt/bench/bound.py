"""An upper bound on what one scheduling cycle can allocate: the LP relaxation of the placement problem (HiGHS).

The quantity bounded is the cluster's GPU allocation once the cycle's plan has landed: GPUs held by every pod
(the `gpus_allocated` of `kai-opt bench run`), and, weighted, the sum over our pods of GPUs x priority / 100. It is
a bound for every engine, kai-opt's (which may evict and move pods) and the baselines' (which only place).

The LP, per instance:
- pending pods (ours, of podgroups with a queue and no problem) may be placed; our running pods that some action
  may evict (preemptible, or of a group below minMember: stale-gang) may stay, move anywhere, or go (`movable`,
  the default): every other pod (other schedulers', non-preemptible, pipelined, on unschedulable nodes) is fixed
  where it is, and releasing pods are gone;
- nodes are aggregated into classes of identical nodes (Ready, same signature class, GPU memory, free vector
  after the fixed pods, and sorted per-device free shares): one capacity row per class and resource (CPU,
  memory, pods, extended resources, GPU share) times the number of nodes in the class;
- variables z[s, c] >= 0: pods of shape s (requests, GPU kind, scheduling signature, priority) on class c, only
  where one such pod fits one node of the class (resources, devices, signature);
- device rows per class: whole-GPU pods need wholly free devices; whole-GPU pods plus shares above 1/2 need
  devices with more than 1/2 free (no device holds two of them);
- gangs: an all-or-nothing podgroup places x_g in [0, 1] of each of its pods (the pods of each shape in
  proportion); pods above minMember (elastic) are each optional; running pods of movable groups each in [0, 1];
- queue limits: for every queue and ancestor with a limit, placed pending work <= what the limit leaves
  (max(limit, allocated) - allocated) plus the movable pods of the subtree (that could be evicted);
- objective: maximise GPUs (or priority-weighted GPUs) of the pods placed or kept, plus the fixed pods' GPUs.

What it relaxes, exactly: integrality (fractional pods and gangs); the per-node packing inside a class (a class is
one bin of the summed capacity) and the per-device packing (only the two device rows above); required and
preferred topology; sub-group minimums; elastic minimums (min-member lower bounds of partly running groups); KAI's
rule that non-preemptible work stays within the deserved quota; reclaim/preempt/consolidation rules (fair-share
conditions, priorities, min-runtime, whole-gang victims); gpu-memory pods' queue share is counted at the largest GPU
memory (the smallest share); pod (anti-)affinity. Every constraint it keeps holds for every plan the checker
accepts, so the optimum bounds every engine's result (up to the LP tolerance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from kai_opt.bench.baselines import sig_nodes
from kai_opt.fairshare import FairShare
from kai_opt.state import R_CPU, R_GPU, R_MEM, R_PODS, ClusterState, PodStatus

MILLI = 1000
EPS = 1e-6
MAX_CLASSES = 400  # above this many classes of identical nodes, coarser (merged) classes keep the LP small
# coarser class keys, in turn: free CPU (millicores), memory (bytes) and device shares (milli) rounded down to
COARSE_STEPS = ((8_000, 2**36, 100), (32_000, 2**38, 250))


@dataclass
class Bound:
    gpus: float  # upper bound on GPUs allocated after the cycle
    weighted: float  # upper bound on priority-weighted GPUs of our pods after the cycle
    fixed_gpus: float  # GPUs held by pods no cycle can change
    status: str  # HiGHS status message of the two solves ("optimal")
    node_classes: int
    class_level: int  # 0: classes of identical nodes; 1-2: coarser merged classes (a looser bound)
    shapes: int
    variables: int
    constraints: int
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return {"gpus": round(self.gpus, 4), "weighted": round(self.weighted, 4),
                "fixed_gpus": round(self.fixed_gpus, 4), "status": self.status, "node_classes": self.node_classes,
                "class_level": self.class_level,
                "shapes": self.shapes, "variables": self.variables, "constraints": self.constraints,
                "seconds": round(self.seconds, 3)}


def pod_weight(state: ClusterState, pods: np.ndarray) -> np.ndarray:
    """Priority weight of our pods: the podgroup's priority / 100 (0 for pods without a group)."""
    g = state.pod_pg[pods]
    return np.where(g >= 0, state.pg_priority[np.maximum(g, 0)] / 100.0, 0.0)


def pod_gpu_at(state: ClusterState, pods: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Milli-GPUs each pod holds on the given node (gpu-memory converted with that node's GPU memory)."""
    out = state.pod_req[pods, R_GPU].astype(np.float64)
    mem = state.pod_gpu_mem[pods]
    for j in np.nonzero(mem)[0].tolist():
        out[j] = state.pod_gpu_per_device(int(pods[j]), int(nodes[j])) * int(state.pod_gpu_ndev[pods[j]])
    return out


def pod_dra_gpus(state: ClusterState, pods: np.ndarray) -> np.ndarray:
    """Milli-GPUs each pod's DRA claims hold or ask for (KAI counts a GPU class's devices as GPUs); they are in
    the DRA device columns, not in the GPU column."""
    if state.dra is None or not len(pods):
        return np.zeros(len(pods), dtype=np.float64)
    return np.array([state.pods[p].dra_gpus for p in pods.tolist()], dtype=np.float64) * MILLI


def movable_pods(state: ClusterState) -> np.ndarray:
    """Our running pods on schedulable nodes that an engine may evict or move: those of preemptible podgroups, and
    those of groups below their minMember (a stale gang may be evicted whatever its priority)."""
    pg = state.pod_pg
    ok = (state.pod_status == PodStatus.BOUND) & state.pod_ours & (pg >= 0)
    active = np.isin(state.pod_status, (PodStatus.BOUND, PodStatus.PIPELINED)) & (pg >= 0)
    below = np.bincount(pg[active], minlength=state.n_groups) < state.pg_min_member
    ok[ok] = (state.pg_preemptible[pg[ok]] | below[pg[ok]]) & state.node_ok[state.pod_node[ok]]
    return np.nonzero(ok)[0]


def placeable_pods(state: ClusterState) -> np.ndarray:
    pods = np.nonzero((state.pod_status == PodStatus.PENDING) & state.pod_ours & (state.pod_pg >= 0))[0]
    ok = np.array([state.pg_problem[g] is None and state.pg_queue[g] >= 0 for g in state.pod_pg[pods].tolist()],
                  dtype=bool)
    return pods[ok] if len(pods) else pods


def _fixed_usage(state: ClusterState, movable: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(node used [N, R], device used [D]) by the pods that stay where they are, once releases are done."""
    node = (state.node_used - state.node_releasing + state.node_pipelined).astype(np.int64)
    dev = (state.dev_used - state.dev_releasing + state.dev_pipelined).astype(np.int64)
    if len(movable):
        nodes = state.pod_node[movable]
        req = state.pod_req[movable].copy()
        req[:, R_GPU] = pod_gpu_at(state, movable, nodes)
        np.subtract.at(node, nodes, req)
        for p, n in zip(movable.tolist(), nodes.tolist(), strict=True):
            per = state.pod_gpu_per_device(p, n)
            if per:
                dev[state.pod_devices(p)] -= per
    return node, dev


@dataclass
class NodeClasses:
    """Schedulable nodes in classes: capacity rows use the sums, the fit test the members' best (envelope)."""

    rep: np.ndarray  # [C] a node of the class (its signature class and GPU memory are the class's)
    count: np.ndarray  # [C] nodes
    cap_sum: np.ndarray  # [C, R] free capacity, summed
    cap_max: np.ndarray  # [C, R] free capacity of the roomiest member, per resource
    dev_max: np.ndarray  # [C, G] per-device free share, sorted descending, best member per rank (-1: none)
    whole_sum: np.ndarray  # [C] wholly free devices, summed
    big_sum: np.ndarray  # [C] devices with more than half free, summed
    level: int  # 0: identical nodes; higher: coarser keys (see node_classes)

    def __len__(self) -> int:
        return len(self.rep)


def node_classes(state: ClusterState, cap: np.ndarray, dev_free: np.ndarray,
                 max_classes: int = MAX_CLASSES) -> NodeClasses:
    """Classes of identical schedulable nodes (level 0); when there are more than `max_classes`, coarser keys
    (levels 1-2: CPU, memory and device shares rounded down by COARSE_STEPS; level 3: only signature, GPU memory
    and device counts), which merge unlike nodes: their capacities add up, a pod fits the class if it fits its
    roomiest member (a looser, still valid, bound)."""
    ok = np.nonzero(state.node_ok)[0]
    g = max(int(state.node_gpus.max(initial=0)), 1)
    devs = np.full((state.n_nodes, g), -1, dtype=np.int64)
    rows = state.dev_node
    devs[rows, np.arange(len(dev_free)) - state.dev_start[rows]] = dev_free
    devs = -np.sort(-devs, axis=1)[ok]
    caps = cap[ok]
    base = np.column_stack([state.node_class[ok], state.node_gpu_mem_mib[ok]])
    whole = (devs == MILLI).sum(axis=1)
    big = (devs > MILLI // 2).sum(axis=1)
    keys = [np.column_stack([base, caps, devs])]
    for cpu_step, mem_step, dev_step in COARSE_STEPS:
        keys.append(np.column_stack([base, caps[:, R_CPU] // cpu_step, caps[:, R_MEM] // mem_step,
                                     caps[:, R_PODS + 1:], np.where(devs >= 0, devs // dev_step, -1)]))
    keys.append(np.column_stack([base, whole, big, (devs > 0).sum(axis=1)]))
    level, inv, n = 0, np.zeros(0, dtype=np.int64), 0
    for level, key in enumerate(keys):  # noqa: B007 (the level is kept)
        if not len(ok):
            break
        _, inv = np.unique(key, axis=0, return_inverse=True)
        inv = inv.ravel()
        n = int(inv.max()) + 1
        if n <= max_classes:
            break
    rep = np.zeros(n, dtype=np.int64)
    rep[inv[::-1]] = ok[::-1]
    count = np.bincount(inv, minlength=n)
    cap_sum = np.zeros((n, cap.shape[1]), dtype=np.int64)
    np.add.at(cap_sum, inv, caps)
    cap_max = np.zeros_like(cap_sum)
    np.maximum.at(cap_max, inv, caps)
    dev_max = np.full((n, g), -1, dtype=np.int64)
    np.maximum.at(dev_max, inv, devs)
    return NodeClasses(rep, count, cap_sum, cap_max, dev_max, np.bincount(inv, whole, n).astype(np.int64),
                       np.bincount(inv, big, n).astype(np.int64), level)


def lp_bound(state: ClusterState, fs: FairShare, *, movable: bool = True) -> Bound:
    """Solve the LP twice (GPUs, priority-weighted GPUs); see the module docstring."""
    t0 = time.perf_counter()
    mov = movable_pods(state) if movable else np.zeros(0, dtype=np.int64)
    fixed_node, fixed_dev = _fixed_usage(state, mov)
    cap = np.maximum(state.node_alloc - fixed_node, 0)
    dev_free = np.clip(MILLI - fixed_dev, 0, MILLI)
    staying = np.setdiff1d(np.nonzero(np.isin(state.pod_status, (PodStatus.BOUND, PodStatus.PIPELINED)))[0], mov)
    fixed_gpus = float(fixed_node[:, R_GPU].sum() + pod_dra_gpus(state, staying).sum()) / MILLI
    active = np.nonzero(state.pod_ours & np.isin(state.pod_status, (PodStatus.BOUND, PodStatus.PIPELINED)))[0]
    active = np.setdiff1d(active, mov)
    fixed_weighted = float((pod_weight(state, active) * (pod_gpu_at(state, active, state.pod_node[active])
                                                         + pod_dra_gpus(state, active))).sum()) / MILLI

    cl = node_classes(state, cap, dev_free)
    pend = placeable_pods(state)
    pods = np.concatenate([pend, mov]).astype(np.int64)
    if not len(pods) or not len(cl.rep):
        return Bound(fixed_gpus, fixed_weighted, fixed_gpus, "nothing to place", len(cl.rep), cl.level, 0, 0, 0,
                     time.perf_counter() - t0)
    shape_rows, shape_of, first = _shapes(state, pods)
    zs, zc, zg = _placement_vars(state, cl, shape_rows, first)
    demand = _demand_vars(state, pend, shape_of)
    n_z = len(zs)
    ub = _Rows()
    _capacity_rows(ub, state, cl, shape_rows, zs, zc, zg)
    _queue_limit_rows(ub, state, fs, pods, mov, len(pend), demand, n_z)
    dra_s = pod_dra_gpus(state, first)  # per shape: DRA GPUs count as GPUs in the objective (not in the GPU rows)
    results, status = _solve(ub, shape_rows, demand, zs, zg + dra_s[zs])
    n_var = n_z + len(demand.cols)
    return Bound(fixed_gpus + results[0], fixed_weighted + results[1], fixed_gpus, status, len(cl.rep), cl.level,
                 len(shape_rows), n_var, len(ub.rhs) + len(shape_rows), time.perf_counter() - t0)


def _shapes(state: ClusterState, pods: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pods of the same shape (what a pod needs, where it may go and its weight) are alike to the LP: (shape
    rows, each pod's shape, a pod of each shape)."""
    prio = np.where(state.pod_pg[pods] >= 0, state.pg_priority[np.maximum(state.pod_pg[pods], 0)], 0)
    skey = np.column_stack([state.pod_req[pods], state.pod_gpu_whole[pods], state.pod_gpu_frac[pods],
                            state.pod_gpu_mem[pods], state.pod_gpu_ndev[pods], state.pod_sig[pods],
                            pod_dra_gpus(state, pods), prio])
    shape_rows, shape_of = np.unique(skey, axis=0, return_inverse=True)
    shape_of = shape_of.ravel()
    first = np.zeros(len(shape_rows), dtype=np.int64)
    first[shape_of[::-1]] = pods[::-1]
    return shape_rows, shape_of, first


def _placement_vars(state: ClusterState, cl: NodeClasses, shape_rows: np.ndarray,
                    first: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Variables z[s, c] only where one pod of shape s fits one node of class c (resources, devices,
    signature): (shape, class, the shape's milli-GPUs there) of each."""
    reps, devs = cl.rep, cl.dev_max
    cls_cap = cl.cap_max  # [C, R]
    gpu_mem = state.node_gpu_mem_mib[reps]
    z_s, z_c, z_gpu = [], [], []
    sig_cache: dict[int, np.ndarray] = {}
    for s in range(len(shape_rows)):
        p = int(first[s])
        req = state.pod_req[p]
        ok = np.ones(len(reps), dtype=bool)
        for r in range(len(state.resources)):
            if r != R_GPU and req[r]:
                ok &= cls_cap[:, r] >= req[r]
        whole, frac, mem = int(state.pod_gpu_whole[p]), int(state.pod_gpu_frac[p]), int(state.pod_gpu_mem[p])
        ndev = int(state.pod_gpu_ndev[p])
        if whole:
            per = np.full(len(reps), MILLI)
            ok &= (devs == MILLI).sum(axis=1) >= whole
            gpu = per * whole
        elif frac or mem:
            per = np.full(len(reps), frac) if frac else np.where(
                gpu_mem > 0, np.minimum(MILLI, -(-mem * MILLI // np.maximum(gpu_mem, 1))), MILLI + 1)
            ok &= (devs >= per[:, None]).sum(axis=1) >= ndev
            gpu = per * ndev
        else:
            gpu = np.zeros(len(reps), dtype=np.int64)
        sig = int(state.pod_sig[p])
        if sig not in sig_cache:
            sig_cache[sig] = sig_nodes(state, sig)
        ok &= sig_cache[sig][reps]
        cs = np.nonzero(ok)[0]
        z_s.append(np.full(len(cs), s))
        z_c.append(cs)
        z_gpu.append(gpu[cs])
    zs, zc, zg = (np.concatenate(x).astype(np.int64) for x in (z_s, z_c, z_gpu))
    return zs, zc, zg


@dataclass
class _Demand:
    """Demand variables, after the z variables: x_g (all-or-nothing groups), u (elastic pods by shape), then v
    (movable pods by shape)."""

    cols: list[tuple[np.ndarray, np.ndarray, float]]  # (shape ids, pods per unit, upper bound)
    pods: list[np.ndarray]  # rows of `pods` each variable stands for
    per_unit: list[bool]  # True: one unit = one pod (u, v); False: one unit = the whole gang (x_g)
    n_pending: int  # the first n_pending are x_g and u


def _demand_vars(state: ClusterState, pend: np.ndarray, shape_of: np.ndarray) -> _Demand:
    """A group that needs all its pending pods to reach minMember is one x_g; other groups' pending pods are
    optional, per shape (u); the movable pods (after the pending ones in `pods`) per shape (v)."""
    pend_groups: dict[int, list[int]] = {}
    for i, p in enumerate(pend.tolist()):
        pend_groups.setdefault(int(state.pod_pg[p]), []).append(i)
    out = _Demand([], [], [], 0)
    act = np.isin(state.pod_status, (PodStatus.BOUND, PodStatus.PIPELINED))
    for g, rows in pend_groups.items():
        need = int(state.pg_min_member[g]) - int(act[state.group_pods(g)].sum())
        idx = np.asarray(rows)
        if need >= len(rows):
            sh, cnt = np.unique(shape_of[idx], return_counts=True)
            out.cols.append((sh, cnt.astype(np.float64), 1.0))
            out.pods.append(idx)
            out.per_unit.append(False)
        else:
            for s in np.unique(shape_of[idx]).tolist():
                mine = idx[shape_of[idx] == s]
                out.cols.append((np.array([s]), np.array([1.0]), float(len(mine))))
                out.pods.append(mine)
                out.per_unit.append(True)
    out.n_pending = len(out.cols)
    off = len(pend)
    for s in np.unique(shape_of[off:]).tolist():
        mine = off + np.nonzero(shape_of[off:] == s)[0]
        out.cols.append((np.array([s]), np.array([1.0]), float(len(mine))))
        out.pods.append(mine)
        out.per_unit.append(True)
    return out


@dataclass
class _Rows:
    """The inequality rows (<=), as COO pieces."""

    rows: list[np.ndarray] = field(default_factory=list)
    cols: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    rhs: list[float] = field(default_factory=list)

    def add(self, row_of: np.ndarray, cols: np.ndarray, vals: np.ndarray, rhs: np.ndarray) -> None:
        """Rows `rhs` (one per distinct row id), scaled by their right-hand side."""
        base = len(self.rhs)
        keep = vals != 0
        scale = np.maximum(np.abs(rhs), 1.0)
        self.rows.append(base + row_of[keep])
        self.cols.append(cols[keep])
        self.vals.append(vals[keep] / scale[row_of[keep]])
        self.rhs.extend((rhs / scale).tolist())


def _capacity_rows(ub: _Rows, state: ClusterState, cl: NodeClasses, shape_rows: np.ndarray, zs: np.ndarray,
                   zc: np.ndarray, zg: np.ndarray) -> None:
    """Per class: one row per resource some shape requests (GPU always), and the two device rows (wholly free
    devices; devices with more than half free)."""
    zcol = np.arange(len(zs))
    for r in range(len(state.resources)):
        coef = zg.astype(np.float64) if r == R_GPU else shape_rows[zs, r].astype(np.float64)
        if r != R_GPU and not coef.any():
            continue
        ub.add(zc, zcol, coef, cl.cap_sum[:, r].astype(np.float64))
    whole_s = shape_rows[:, len(state.resources)].astype(np.float64)
    ndev_s = shape_rows[:, len(state.resources) + 3].astype(np.float64)
    share_sc = np.where(whole_s[zs] > 0, 0, zg / np.maximum(ndev_s[zs], 1))
    ub.add(zc, zcol, whole_s[zs], cl.whole_sum.astype(np.float64))
    ub.add(zc, zcol, whole_s[zs] + (share_sc > MILLI / 2) * ndev_s[zs], cl.big_sum.astype(np.float64))


def _queue_limit_rows(ub: _Rows, state: ClusterState, fs: FairShare, pods: np.ndarray, mov: np.ndarray, off: int,
                      demand: _Demand, n_z: int) -> None:
    """Queue limits on placed pending work (movable pods' share may all be evicted: it adds room); `off`: where
    the movable pods start in `pods`."""
    charge = state.pod_queue_request(pods)
    mem = state.pod_gpu_mem[pods]
    if mem.any():  # gpu-memory pods at the largest GPU memory: the smallest share they can count
        biggest = float(state.node_gpu_mem_mib.max(initial=0)) or 1.0
        charge[mem > 0, 0] = np.minimum(1.0, mem[mem > 0] / biggest) * state.pod_gpu_ndev[pods[mem > 0]]
    leaf_of = state.pg_queue[state.pod_pg[pods]]
    anc = np.zeros((state.n_queues, state.n_queues), dtype=bool)  # anc[q, a]: a is q or above it
    for q, chain in enumerate(state.q_ancestors):
        anc[q, chain] = True
    pend_vars = demand.pods[:demand.n_pending]
    var_leaf = np.asarray([int(leaf_of[d[0]]) for d in pend_vars], dtype=np.int64)
    var_charge = np.asarray([charge[d].min(axis=0) if unit else charge[d].sum(axis=0)
                             for d, unit in zip(pend_vars, demand.per_unit, strict=False)]
                            ).reshape(-1, 3)
    movable_charge = state.pod_queue_request(mov, state.pod_node[mov]) if len(mov) else np.zeros((0, 3))
    lim_rows, lim_cols, lim_vals, lim_rhs = [], [], [], []
    for a, r in zip(*np.nonzero(fs.limit != -1), strict=True):
        alloc = float(fs.allocated[a, r])
        room = max(float(fs.limit[a, r]), alloc) - alloc + EPS
        room += float(movable_charge[anc[leaf_of[off:], a], r].sum())
        sel = np.nonzero(anc[var_leaf, a] & (var_charge[:, r] > 0))[0]
        lim_rows.append(np.full(len(sel), len(lim_rhs)))
        lim_cols.append(n_z + sel)
        lim_vals.append(var_charge[sel, r])
        lim_rhs.append(room)
    if lim_rhs:
        ub.add(np.concatenate(lim_rows).astype(np.int64), np.concatenate(lim_cols).astype(np.int64),
               np.concatenate(lim_vals).astype(np.float64), np.asarray(lim_rhs))


def _solve(ub: _Rows, shape_rows: np.ndarray, demand: _Demand, zs: np.ndarray,
           zg: np.ndarray) -> tuple[list[float], str]:
    """Link the pods of each shape placed on classes to what the demand variables ask for, and solve for GPUs,
    then priority-weighted GPUs: (the two optima, nan where a solve failed; the status)."""
    n_z, n_shapes = len(zs), len(shape_rows)
    n_var = n_z + len(demand.cols)
    eq_r = [zs]
    eq_c = [np.arange(n_z)]
    eq_v = [np.ones(n_z)]
    for j, (sh, cnt, _) in enumerate(demand.cols):
        eq_r.append(sh.astype(np.int64))
        eq_c.append(np.full(len(sh), n_z + j))
        eq_v.append(-cnt)
    a_eq = coo_array((np.concatenate(eq_v), (np.concatenate(eq_r), np.concatenate(eq_c))),
                     shape=(n_shapes, n_var)).tocsr()
    a_ub = coo_array((np.concatenate(ub.vals) if ub.vals else np.zeros(0),
                      (np.concatenate(ub.rows) if ub.rows else np.zeros(0, dtype=np.int64),
                       np.concatenate(ub.cols) if ub.cols else np.zeros(0, dtype=np.int64))),
                     shape=(len(ub.rhs), n_var)).tocsr()
    bounds = [(0.0, None)] * n_z + [(0.0, hi) for _, _, hi in demand.cols]
    weight = shape_rows[:, -1].astype(np.float64) / 100.0
    results = []
    statuses = []
    for w in (np.ones(n_shapes), weight):
        c = np.zeros(n_var)
        c[:n_z] = -(zg / MILLI) * w[zs]
        res = linprog(c, A_ub=a_ub, b_ub=np.asarray(ub.rhs), A_eq=a_eq, b_eq=np.zeros(n_shapes), bounds=bounds,
                      method="highs-ipm")
        statuses.append(res.message if not res.success else "optimal")
        results.append(-float(res.fun) if res.success else float("nan"))
    status = statuses[0] if statuses[0] == statuses[1] else "; ".join(statuses)
    return results, status
