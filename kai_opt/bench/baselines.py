"""Peer baselines on a ClusterState: the trace replay's placement policies (kube-scheduler LeastAllocated /
MostAllocated, FGD, BestFit, DotProd, GpuPacking, Random) placing the pending pods of one snapshot.

Semantics, the same for every baseline:
- pending pods only: nothing is evicted, moved or preempted; a pod binds where it fits now and once releasing
  pods are gone and pipelined pods have landed (the smaller of the two free amounts);
- the scheduling queue: podgroups by priority (high first), then creation time, as kube-scheduler's PrioritySort;
  inside a group, pods by pod priority then index. Each pod goes where the policy scores best (trace.py's math);
- gangs all-or-nothing: a group's pods are tried in turn and kept only if the group then has minMember pods
  active (and every leaf sub-group its own minimum), else all of its tentative placements are undone (the
  co-scheduling plugin's first-fit gang handling). Pods above the minimum are kept when they fit;
- node selectors, required node affinity and taints (the pod's scheduling signature), Ready/cordoned nodes, pod
  count and extended resources are honoured through a node mask;
- a required topology level (group or sub-group) is met first-fit: domains of that level in name order, skipping
  domains whose free GPUs, CPU or memory cannot cover the gang, the first where the gang fits wins; a domain
  already used by running pods of the group is the only one tried. Preferred topology is ignored;
- queue limits (each ancestor, GPU/CPU/memory) are honoured; KAI's rule that non-preemptible work stays within its
  queue's deserved quota is not (kube-scheduler has no such rule), so `check` relaxes exactly that one invariant;
- gpu-memory pods reserve the share of the smallest GPU memory in the cluster (exact when all GPUs are alike);
  pod (anti-)affinity is not modelled (the generated families use none).
FGD's target workload is the pending pods' shapes (CPU, per-GPU share, GPU count) covering 95% of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from kai_opt.bench import trace
from kai_opt.checker import check_plan
from kai_opt.config import Config
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.fragmentation import pod_gpu_shape
from kai_opt.plan import Placement, Plan, Reason
from kai_opt.state import R_CPU, R_MEM, R_PODS, ClusterState, PodStatus

MILLI = 1000
BASELINES = ("leastallocated", "mostallocated", "fgd", "bestfit", "dotprod", "gpupacking", "random")
ACTIVE = (PodStatus.BOUND, PodStatus.PIPELINED)

PolicyFactory = Callable[[trace.Cluster, trace.Workload | None, np.random.Generator], trace.Policy]
POLICIES: dict[str, PolicyFactory] = {
    "leastallocated": lambda c, w, r: trace.LeastAllocatedPolicy(c, r),
    "mostallocated": lambda c, w, r: trace.MostAllocatedPolicy(c, r),
    "fgd": lambda c, w, r: trace.FgdPolicy(c, r, w) if w is not None else trace.BestFitPolicy(c, r),
    "bestfit": lambda c, w, r: trace.BestFitPolicy(c, r),
    "dotprod": lambda c, w, r: trace.DotProdPolicy(c, r),
    "gpupacking": lambda c, w, r: trace.GpuPackingPolicy(c, r),
    "random": lambda c, w, r: trace.RandomPolicy(c, r),
}


# -- the state as the policies see it --------------------------------------------------------------------------------


def free_now_and_final(state: ClusterState) -> tuple[np.ndarray, np.ndarray]:
    """(node free [N, R], device free [D]) where a bind fits both now and after releases and pipelines land."""
    used_final = state.node_used - state.node_releasing + state.node_pipelined
    node_free = state.node_alloc - np.maximum(state.node_used, used_final)
    dev_final = state.dev_used - state.dev_releasing + state.dev_pipelined
    dev_free = MILLI - np.maximum(state.dev_used, dev_final)
    return np.maximum(node_free, 0), np.clip(dev_free, 0, MILLI)


def device_matrix(state: ClusterState, dev_values: np.ndarray) -> np.ndarray:
    """[N, G] per-device values padded with 0 (G = most devices on a node, at least 1)."""
    counts = state.node_gpus
    out = np.zeros((state.n_nodes, max(int(counts.max(initial=0)), 1)), dtype=np.int64)
    rows = state.dev_node
    cols = np.arange(len(dev_values)) - state.dev_start[rows]
    out[rows, cols] = dev_values
    return out


def cluster_view(state: ClusterState, node_free: np.ndarray, dev_free: np.ndarray) -> trace.Cluster:
    """A trace.Cluster of the state (memory in bytes; every GPU node of one 'model': the sigs do the rest)."""
    gpus = state.node_gpus
    return trace.Cluster(("gpu",), np.where(gpus > 0, 0, -1), gpus, state.node_alloc[:, R_CPU].copy(),
                         state.node_alloc[:, R_MEM].copy(), node_free[:, R_CPU].copy(), node_free[:, R_MEM].copy(),
                         device_matrix(state, dev_free))


def gpu_shape(state: ClusterState, pods: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(devices, milli per device) of each pod; gpu-memory pods at the smallest GPU memory of the cluster."""
    return pod_gpu_shape(state, pods)


def sig_nodes(state: ClusterState, sig: int) -> np.ndarray:
    """bool[N]: nodes scheduling signature `sig` allows (selector, required node affinity, taints), judged once
    per node class (nodes alike for every signature)."""
    reps = np.unique(state.node_class, return_index=True)[1]
    allow = np.zeros(int(state.node_class.max(initial=-1)) + 1, dtype=bool)
    s = state.sigs[sig]
    for n in reps.tolist():
        allow[state.node_class[n]] = s.allows(state.node_labels[n], state.node_taints[n], state.node_names[n])
    return allow[state.node_class]


def pending_pods(state: ClusterState) -> np.ndarray:
    """Our pending pods of groups that can be scheduled at all (a queue, no podgroup problem)."""
    pods = np.nonzero((state.pod_status == PodStatus.PENDING) & state.pod_ours & (state.pod_pg >= 0))[0]
    ok = np.array([state.pg_problem[g] is None and state.pg_queue[g] >= 0 for g in state.pod_pg[pods].tolist()],
                  dtype=bool)
    return pods[ok] if len(pods) else pods


def target_workload(state: ClusterState, pods: np.ndarray, *, gpu_only: bool = False,
                    coverage: float = trace.TYPICAL_COVERAGE) -> trace.Workload | None:
    """FGD's target workload from these pods' shapes (None when there is none)."""
    num, milli = gpu_shape(state, pods)
    keep = num > 0 if gpu_only else np.ones(len(pods), dtype=bool)
    if not keep.any():
        return None
    cpu = state.pod_req[pods, R_CPU][keep]
    return trace.typical_shapes(cpu, milli[keep], num[keep], [""] * int(keep.sum()), ("gpu",), coverage)


# -- placing ---------------------------------------------------------------------------------------------------------


class Placer:
    """One baseline run: the policy over the cluster view plus the node masks and limits the policies lack."""

    def __init__(self, state: ClusterState, fs: FairShare, name: str, seed: int) -> None:
        self.state = st = state
        node_free, dev_free = free_now_and_final(st)
        self.cluster = cluster_view(st, node_free, dev_free)
        self.pods = pending_pods(st)
        num, milli = gpu_shape(st, self.pods)
        self.view = trace.Pods(st.pod_req[self.pods, R_CPU], st.pod_req[self.pods, R_MEM], num, milli,
                               np.full(len(self.pods), -1, dtype=np.int64))
        self.row = {int(p): i for i, p in enumerate(self.pods.tolist())}
        self.other_cols = [R_PODS, *range(R_PODS + 1, len(st.resources))]
        self.other_free = node_free[:, self.other_cols].copy()
        self.other_req = st.pod_req[self.pods][:, self.other_cols]
        self.policy = POLICIES[name](self.cluster, target_workload(st, self.pods) if len(self.pods) else None,
                                     np.random.default_rng([seed, 7919]))
        self._sig_masks: dict[int, np.ndarray] = {}
        self.q_limit = fs.limit
        self.q_alloc = fs.allocated.copy()  # grows with this run's placements

    def sig_mask(self, sig: int) -> np.ndarray:
        """Nodes a scheduling signature allows that are Ready and schedulable."""
        m = self._sig_masks.get(sig)
        if m is None:
            m = self._sig_masks[sig] = sig_nodes(self.state, sig) & self.state.node_ok
        return m

    def headroom(self, q: int) -> np.ndarray:
        """float64[3]: what queue q may still take before it or an ancestor reaches a limit (inf: none)."""
        room = np.full(3, np.inf)
        for a in self.state.q_ancestors[q]:
            lim = self.q_limit[a]
            capped = lim != -1
            room[capped] = np.minimum(room[capped], lim[capped] - self.q_alloc[a, capped])
        return room

    def try_pod(self, p: int, mask: np.ndarray) -> trace.Placement | None:
        i = self.row[p]
        m = mask & self.sig_mask(int(self.state.pod_sig[p]))
        if self.other_req[i].any():
            m = m & (self.other_free >= self.other_req[i]).all(axis=1)
        k, d = int(self.view.num_gpu[i]), int(self.view.gpu_milli[i])
        multi_share = k > 1 and d < MILLI
        if multi_share:  # a share on each of k devices
            m = m & ((self.cluster.gpu_free >= d).sum(axis=1) >= k)
        pl = self.policy.place(self.cluster, self.view, i, m)
        if pl is None:
            return None
        node, gpus = pl
        if multi_share:
            row = self.cluster.gpu_free[node]
            gpus = tuple(int(g) for g in np.argsort(np.where(row >= d, row, MILLI + 1), kind="stable")[:k])
        pl = (node, gpus)
        self.apply(i, pl, +1)
        return pl

    def apply(self, i: int, pl: trace.Placement, sign: int) -> None:
        if sign > 0:
            self.cluster.apply(self.view, i, pl)
        else:
            self.cluster.release(self.view, i, pl)
        self.other_free[pl[0]] -= sign * self.other_req[i]
        self.policy.applied(self.cluster, pl[0])


def _group_order(state: ClusterState, groups: list[int]) -> list[int]:
    created = np.nan_to_num(state.pg_creation, nan=np.inf)
    return sorted(groups, key=lambda g: (-int(state.pg_priority[g]), float(created[g]), state.pg_keys[g]))


def _domain_options(state: ClusterState, g: int, pods: np.ndarray, cl: trace.Cluster,
                    demand: np.ndarray) -> list[np.ndarray | None]:
    """Node masks to try for group g: [None] without a required topology, else one per feasible domain."""
    cons = []
    if state.pg_topology[g] >= 0 and state.pg_required_level[g] >= 0:
        cons.append((int(state.pg_topology[g]), int(state.pg_required_level[g])))
    for s in {int(x) for x in state.pod_sg[pods] if x >= 0}:
        if state.sg_topology[s] >= 0 and state.sg_required_level[s] >= 0:  # stricter: the whole gang in one
            cons.append((int(state.sg_topology[s]), int(state.sg_required_level[s])))
    if not cons:
        return [None]
    # the finest required level (every constraint then holds); ties: the first
    t, lvl = max(cons, key=lambda c: c[1])
    topo = state.topologies[t]
    dom = topo.domain[lvl]
    active = pods[np.isin(state.pod_status[pods], ACTIVE)]
    used = {int(dom[state.pod_node[p]]) for p in active.tolist() if state.pod_node[p] >= 0}
    names = topo.domain_names[lvl]
    if used:
        choices = sorted(used) if len(used) == 1 and -1 not in used else []
    else:
        n_dom = len(names)
        ok = dom >= 0
        free = np.zeros((n_dom, 3))
        for j, col in enumerate((cl.gpu_free.sum(axis=1), cl.cpu_free, cl.mem_free)):
            np.add.at(free[:, j], dom[ok], col[ok])
        fits = (free >= demand[None, :]).all(axis=1)
        choices = sorted(np.nonzero(fits)[0].tolist(), key=lambda d: names[d])
    return [dom == d for d in choices]


def baseline_plan(state: ClusterState, fs: FairShare, name: str, seed: int = 0) -> Plan:
    """The plan of baseline `name` (see the module docstring); pending groups get one reason."""
    if name not in POLICIES:
        raise ValueError(f"unknown baseline {name!r}")
    pl = Placer(state, fs, name, seed)
    st = state
    by_group: dict[int, list[int]] = {}
    for p in pl.pods.tolist():
        by_group.setdefault(int(st.pod_pg[p]), []).append(p)
    placements: list[Placement] = []
    pending: dict[int, list[Reason]] = {}
    for g in _group_order(st, list(by_group)):
        pods = st.group_pods(g)
        todo = sorted(by_group[g], key=lambda p: (-int(st.pod_priority[p]), p))
        done = _place_group(pl, g, pods, np.asarray(todo, dtype=np.int64))
        if done is None:
            pending[g] = [Reason("Unschedulable", f"{name}: the gang does not fit whole")]
            continue
        placements += [Placement(pod=p, node=n, devices=devs) for p, (n, devs) in done]
        if len(done) < len(todo):
            pending[g] = [Reason("Unschedulable", f"{name}: {len(todo) - len(done)} pods above minMember do not fit")]
    plan = Plan(engine=name, placements=sorted(placements, key=lambda x: x.pod), pending=pending)
    return plan


def _needs(state: ClusterState, g: int, pods: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """(pods, how many more of them must become active) for the group and each leaf sub-group."""
    active = np.isin(state.pod_status[pods], ACTIVE)
    out = [(pods, max(0, int(state.pg_min_member[g]) - int(active.sum())))]
    subs = state.pod_sg[pods]
    parents = {int(x) for x in state.sg_parent[state.sg_pg == g] if x >= 0}
    for s in sorted({int(x) for x in subs if x >= 0} - parents):
        members = subs == s
        out.append((pods[members], max(0, int(state.sg_min_member[s]) - int(active[members].sum()))))
    return out


def _place_group(pl: Placer, g: int, pods: np.ndarray, todo: np.ndarray) -> list[tuple[int, trace.Placement]] | None:
    st = pl.state
    needs = _needs(st, g, pods)
    q = int(st.pg_queue[g])
    charge = st.pod_queue_request(todo)  # unplaced: gpu-memory at the smallest GPU memory (the largest share)
    rows = [pl.row[p] for p in todo.tolist()]
    need = needs[0][1]
    demand = np.array([float(np.sort(x)[:need].sum()) for x in  # what the `need` smallest pods hold at least
                       (pl.view.num_gpu[rows] * pl.view.gpu_milli[rows], pl.view.cpu[rows], pl.view.mem[rows])])
    for mask in _domain_options(st, g, pods, pl.cluster, demand):
        room = pl.headroom(q)
        done: list[tuple[int, trace.Placement]] = []
        took = np.zeros(3)
        for j, p in enumerate(todo.tolist()):
            if (took + charge[j] > room + 1e-9).any():
                continue
            where = pl.try_pod(p, st.node_ok if mask is None else mask)
            if where is not None:
                done.append((p, where))
                took += charge[j]
        placed = {p for p, _ in done}
        if all(int(np.isin(members, list(placed)).sum()) >= need for members, need in needs) and done:
            for a in st.q_ancestors[q]:
                pl.q_alloc[a] += took
            return done
        for p, where in reversed(done):
            pl.apply(pl.row[p], where, -1)
    return None


def relaxed_fair_share(fs: FairShare) -> FairShare:
    """fs without deserved quotas: the checker then skips only the non-preemptible-within-quota rule."""
    return dataclasses.replace(fs, deserved=np.full_like(fs.deserved, -1.0))


def check(state: ClusterState, plan: Plan, fs: FairShare, config: Config) -> None:
    """The independent checker on a baseline plan (capacity, devices, gangs, topology, queue limits);
    raises PlanViolation."""
    check_plan(state, plan, relaxed_fair_share(fs), config)


def placed_gpus(state: ClusterState, plan: Plan) -> float:
    """GPUs of the pods a plan places (devices x share at their node)."""
    return sum(state.pod_gpu_per_device(p.pod, p.node) * len(p.devices) for p in plan.placements
               if not p.moved) / MILLI

