"""Snapshot -> ClusterState."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import numpy as np

from kai_opt.api import DEFAULT_PRIORITY_CLASSES, Node, Pod, PodGroup, TopologyConstraint
from kai_opt.api.priorityclass import NON_PREEMPTIBLE_PRIORITY
from kai_opt.api.queue import QUEUE_RESOURCES
from kai_opt.dra.prepare import has_dra
from kai_opt.dra.prepare import prepare as prepare_dra
from kai_opt.snapshot import Snapshot
from kai_opt.state.cluster import ClusterState, PodStatus, SchedulingSig, TopologyIndex
from kai_opt.state.gpu import ExplicitDevices, assign_devices
from kai_opt.state.gpu_memory import gpu_memory_warnings
from kai_opt.state.pod_rows import FLAT, LEN, GroupRows, PodRows, take_rows
from kai_opt.state.resources import QR_COLUMN, QR_DIVISOR, R_CPU, R_GPU, R_MEM, R_PODS, resource_axis
from kai_opt.state.segments import add_rows

DEFAULT_QUEUE = "default-queue"
NAN = float("nan")


# what pods and PodGroups alone gave the last build, kept by identity (the in-cluster cache hands the same models every
# cycle while their objects do not change)
_POD_ROWS = PodRows()
_GROUP_ROWS = GroupRows()


def reset_memos() -> None:
    """Forget what earlier builds read (the next build reads every object)."""
    _POD_ROWS.__init__()  # type: ignore[misc]
    _GROUP_ROWS.__init__()  # type: ignore[misc]
    _last_nodes.clear()
    _last_names.clear()
    _last_queues.clear()


def build_state(snapshot: Snapshot, *, now: float | None = None, default_queue: str = DEFAULT_QUEUE) -> ClusterState:
    now = now if now is not None else (snapshot.now if snapshot.now is not None else time.time())
    ours_names = set(snapshot.scheduler_names)
    warnings: list[str] = [str(w) for w in snapshot.warnings]
    dra = None
    # DRA devices become columns, claims requests and pins
    if has_dra(snapshot.pods, snapshot.resource_slices, snapshot.any_pod_claims):
        dra_nodes, dra_pods, dra = prepare_dra(snapshot.nodes, snapshot.pods, snapshot, warnings)
        snapshot = dataclasses.replace(snapshot, nodes=dra_nodes, pods=dra_pods)
    node_names, node_index, node_resources = _node_names(snapshot)
    kept, resources = _kept_pods(snapshot, ours_names, node_index, node_resources, warnings)
    pods = kept.pods
    col = {r: i for i, r in enumerate(resources)}
    nodes = _node_arrays(snapshot, col)
    views = nodes.views
    topologies = [_view(views, ("topology", t.name, t.levels), lambda t=t: _topology_index(t.name, t.levels, snapshot))
                  for t in snapshot.topologies]
    queues = _queues_of(snapshot)
    pc_value = dict(DEFAULT_PRIORITY_CLASSES)
    pc_value.update({pc.name: pc.value for pc in snapshot.priority_classes})
    global_default = next((pc.value for pc in snapshot.priority_classes if pc.global_default), 0)
    group_rows = _GROUP_ROWS.columns(snapshot.podgroups, pc_value, global_default, _POD_ROWS.keys)
    declared_keys: list[str] = group_rows["key"].tolist()
    values = _pod_values(kept, col, declared_keys, group_rows["kid"])
    pod_pg = _group_index(values, declared_keys)
    groups = _podgroups(snapshot.podgroups, group_rows, declared_keys, kept, values, pod_pg, topologies, queues,
                        pc_value, global_default, default_queue)
    arrays = _pod_arrays(kept, values, len(resources))
    pod_sg = _pod_groups(pods, values, groups, pod_pg, warnings)
    pg_pod_start, pg_pods = _membership_csr(pod_pg, arrays.creation, arrays.prio, len(groups.keys))
    usage = _node_usage(pods, nodes, arrays, node_names, values, warnings)
    node_class = _node_classes(snapshot, values.sigs, views)  # nodes that every pod signature treats alike
    return ClusterState(
        now=now, resources=resources,
        node_names=node_names, node_alloc=nodes.alloc, node_used=usage.node_used, node_releasing=usage.node_rel,
        node_pipelined=usage.node_pipe,
        node_ok=nodes.ok, node_capacity_total=nodes.capacity_total,
        node_gpu_mem_mib=nodes.gpu_mem, node_gpu_mem_known=nodes.gpu_mem_known,
        node_labels=list(_view(views, "labels", lambda: [n.labels for n in snapshot.nodes])),
        node_taints=list(_view(views, "taints", lambda: [n.taints for n in snapshot.nodes])), node_class=node_class,
        dev_start=nodes.dev_start, dev_used=usage.dev_used, dev_releasing=usage.dev_rel,
        dev_pipelined=usage.dev_pipe,
        pods=pods, pod_status=arrays.status, pod_ours=arrays.ours, pod_node=arrays.node, pod_req=arrays.req,
        pod_gpu_whole=arrays.whole, pod_gpu_frac=arrays.frac, pod_gpu_mem=arrays.mem, pod_gpu_ndev=arrays.ndev,
        pod_dev_start=usage.pod_dev_start, pod_dev=usage.pod_dev, pod_pg=pod_pg, pod_sg=pod_sg,
        pod_sig=arrays.sig, pod_priority=arrays.prio, pod_creation=arrays.creation, pod_start=arrays.start,
        sigs=values.sigs,
        pg_keys=groups.keys, pg_queue=groups.queue, pg_min_member=groups.min_member, pg_priority=groups.prio,
        pg_preemptible=groups.preempt, pg_creation=groups.creation, pg_last_start=groups.last_start,
        pg_stale_since=groups.stale, pg_implicit=groups.implicit, pg_pod_start=pg_pod_start, pg_pods=pg_pods,
        pg_topology=groups.topo, pg_required_level=groups.req, pg_preferred_level=groups.pref,
        pg_problem=groups.problem,
        pg_problem_message=groups.problem_msg,
        sg_pg=np.array(groups.sg_pg, dtype=np.int32), sg_names=groups.sg_names,
        sg_min_member=np.array(groups.sg_min, dtype=np.int32), sg_parent=np.array(groups.sg_parent, dtype=np.int32),
        sg_topology=np.array(groups.sg_topo, dtype=np.int32),
        sg_required_level=np.array(groups.sg_req, dtype=np.int32),
        sg_preferred_level=np.array(groups.sg_pref, dtype=np.int32),
        q_names=queues.names, q_parent=queues.parent, q_priority=queues.priority, q_creation=queues.creation,
        q_deserved=queues.deserved, q_limit=queues.limit, q_oqw=queues.oqw, q_preempt_min_runtime=queues.pre,
        q_reclaim_min_runtime=queues.rec,
        topologies=topologies, warnings=warnings, dra=dra,
    )


@dataclass
class _Kept:
    """The pods that matter (finished pods, foreign pending pods and deleted pending pods play no part) with their
    status, node (bound: its node; pipelined: the nominated one; else -1) and rows (`PodRows`)."""

    pods: list[Pod]
    status: np.ndarray  # int8[P]
    node: np.ndarray  # int32[P]
    ours: np.ndarray  # bool[P]
    c: dict[str, np.ndarray]


def _kept_pods(snapshot: Snapshot, ours_names: set[str], node_index: dict[str, int], node_resources: set[str],
               warnings: list[str]) -> tuple[_Kept, tuple[str, ...]]:
    """The kept pods and the resource axis (node and pod resources), from the pods' rows."""
    names = set(node_resources)
    every = snapshot.pods
    c = _POD_ROWS.columns(every)
    alive = c["finished"] == 0
    for extra in c["extra"][np.flatnonzero(alive & (c["has_extra"] != 0))].tolist():
        names.update(r for r, _x in extra)
    on_node = alive & (c["has_node"] != 0)
    node = np.full(len(every), -1, dtype=np.int32)
    where = np.flatnonzero(on_node)
    node[where] = _POD_ROWS.node_lookup(node_index)[c["node"][where]]
    for i in where[node[where] < 0].tolist():
        warnings.append(f"Pod {every[i].key}: bound to unknown node {c['node_name'][i]!r}; ignored")
    known = _POD_ROWS.names.ids
    ours = np.isin(c["sched"], [known[n] for n in ours_names if n in known])
    deleted, gated = c["deleted"] != 0, c["gated"] != 0
    waiting = alive & ~on_node & ~deleted & ours
    status = np.full(len(every), PodStatus.PENDING, dtype=np.int8)
    status[on_node] = np.where(deleted[on_node], PodStatus.RELEASING, PodStatus.BOUND)
    status[waiting & gated] = PodStatus.GATED
    nominated = c["nominated"]
    for i in np.flatnonzero(waiting & ~gated & (c["nominated_set"] != 0)).tolist():
        at = node_index.get(nominated[i])
        if at is not None:
            status[i], node[i] = PodStatus.PIPELINED, at
    keep = (on_node & (node >= 0)) | waiting
    if keep.all():  # (every pod is kept: the common case in a running cluster)
        return _Kept(list(every), status, node, ours, c), resource_axis(names)
    kept = np.flatnonzero(keep)
    pods = list(compress(every, keep.tolist()))
    return _Kept(pods, status[kept], node[kept], ours[kept], take_rows(c, kept)), resource_axis(names)


@dataclass
class _Nodes:
    alloc: np.ndarray  # int64[N, R]
    ok: np.ndarray
    gpu_mem: np.ndarray
    gpu_mem_known: np.ndarray
    gpus: np.ndarray  # int64[N] whole devices
    dev_start: np.ndarray  # int64[N+1]
    capacity_total: np.ndarray  # float64[3] queue units: every node's status.capacity (allocatable without one)
    views: dict[Any, Any] = field(default_factory=dict)  # what else is read from these nodes alone (labels,
    # taints, topology indexes, classes), made when first asked for and shared read-only like the arrays


# the last build's node arrays and what they were read from: the in-cluster cache hands the same Node models every
# cycle while the nodes do not change, so the arrays are read once (read-only: every state shares them)
_last_nodes: list[tuple[tuple[Node, ...], tuple[tuple[str, int], ...], _Nodes]] = []


# the last build's node names, their index and the nodes' resource names, with the nodes they were read from
_last_names: list[tuple[list[Node], tuple[list[str], dict[str, int], set[str]]]] = []


def _node_names(snapshot: Snapshot) -> tuple[list[str], dict[str, int], set[str]]:
    """The nodes' names, their index and the resources nodes have (the same as the last build's while the Node
    models are the same; read-only)."""
    last = _last_names[0] if _last_names else None
    nodes = snapshot.nodes
    if last is not None and len(last[0]) == len(nodes) and all(a is b for a, b in zip(last[0], nodes, strict=True)):
        return last[1]
    names = [n.name for n in nodes]
    resources: set[str] = set()
    for n in nodes:
        resources.update(n.allocatable)
    out = (names, {n: i for i, n in enumerate(names)}, resources)
    _last_names[:] = [(list(nodes), out)]
    return out


# the last build's queue arrays, with the queues they were read from
_last_queues: list[tuple[list[Any], _Queues]] = []


def _queues_of(snapshot: Snapshot) -> _Queues:
    """`_queue_arrays`, the same as the last build's while the Queue models are the same (read-only)."""
    last = _last_queues[0] if _last_queues else None
    queues = snapshot.queues
    if last is not None and len(last[0]) == len(queues) and all(
            a is b for a, b in zip(last[0], queues, strict=True)):
        return last[1]
    out = _queue_arrays(snapshot)
    for f in dataclasses.fields(out):
        v = getattr(out, f.name)
        if isinstance(v, np.ndarray):
            v.setflags(write=False)  # every state shares them
    _last_queues[:] = [(list(queues), out)]
    return out


def _node_arrays(snapshot: Snapshot, col: dict[str, int]) -> _Nodes:
    """Per-node arrays read from the nodes; a node's devices are its allocatable GPUs. The same Node models (by
    identity) and resource columns as the last build give its arrays."""
    nodes, key = tuple(snapshot.nodes), tuple(col.items())
    last = _last_nodes[0] if _last_nodes else None
    if last is not None and last[1] == key and len(last[0]) == len(nodes) and all(
            a is b for a, b in zip(last[0], nodes, strict=True)):
        return last[2]
    out = _read_node_arrays(snapshot, col)
    for f in dataclasses.fields(out):
        if f.name != "views":
            getattr(out, f.name).setflags(write=False)
    _last_nodes[:] = [(nodes, key, out)]
    return out


def _read_node_arrays(snapshot: Snapshot, col: dict[str, int]) -> _Nodes:
    N = len(snapshot.nodes)
    alloc = np.zeros((N, len(col)), dtype=np.int64)
    cap = np.zeros(len(col), dtype=np.float64)
    for i, node in enumerate(snapshot.nodes):
        for r, v in node.allocatable.items():
            alloc[i, col[r]] = v
        for r, v in (node.capacity or node.allocatable).items():
            if r in col:
                cap[col[r]] += v
    ok = np.array([n.ready and not n.unschedulable for n in snapshot.nodes], dtype=bool)
    gpu_mem = np.array([n.gpu_memory_mib if n.gpus else 0 for n in snapshot.nodes], dtype=np.int64)
    gpu_mem_known = np.array([bool(n.gpus) and n.gpu_memory_known for n in snapshot.nodes], dtype=bool)
    gpus = alloc[:, R_GPU] // 1000 if N else np.zeros(0, dtype=np.int64)
    dev_start = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(gpus, out=dev_start[1:])
    capacity_total = np.array([cap[c] / d for c, d in zip(QR_COLUMN, QR_DIVISOR, strict=True)], dtype=np.float64)
    return _Nodes(alloc, ok, gpu_mem, gpu_mem_known, gpus, dev_start, capacity_total)


@dataclass
class _Queues:
    names: list[str]
    index: dict[str, int]
    parent: np.ndarray
    priority: np.ndarray
    creation: np.ndarray
    deserved: np.ndarray
    limit: np.ndarray
    oqw: np.ndarray
    pre: np.ndarray
    rec: np.ndarray
    leaf: list[bool]  # queues without child queues (only they hold work)


def _queue_arrays(snapshot: Snapshot) -> _Queues:
    """Per-queue arrays; the min-runtimes a queue leaves unset are its nearest ancestor's."""
    queues = snapshot.queues
    Q = len(queues)
    names = [q.name for q in queues]
    index = {n: i for i, n in enumerate(names)}
    parent = np.array([index[q.parent] if q.parent else -1 for q in queues], dtype=np.int32)
    leaf = np.ones(Q, dtype=bool)
    leaf[parent[parent >= 0]] = False
    return _Queues(
        names=names, index=index, parent=parent,
        priority=np.array([q.priority for q in queues], dtype=np.int32),
        creation=np.array([_t(q.meta.creation_timestamp) for q in queues], dtype=np.float64),
        deserved=np.array([[q.resource(r).quota for r in QUEUE_RESOURCES] for q in queues],
                          dtype=np.float64).reshape(Q, 3),
        limit=np.array([[q.resource(r).limit for r in QUEUE_RESOURCES] for q in queues],
                       dtype=np.float64).reshape(Q, 3),
        oqw=np.array([[q.resource(r).over_quota_weight for r in QUEUE_RESOURCES] for q in queues],
                     dtype=np.float64).reshape(Q, 3),
        pre=_inherit([q.preempt_min_runtime_s for q in queues], parent),
        rec=_inherit([q.reclaim_min_runtime_s for q in queues], parent),
        leaf=leaf.tolist())


def _member_priorities(groups: np.ndarray, by_group: np.ndarray, bounds: np.ndarray, c: dict[str, np.ndarray],
                       pc_value: dict[str, int], global_default: int) -> np.ndarray:
    """_priority_of for many groups at once, from the kept pods' rows `c`: `by_group` holds the kept pods by group
    (pod order within each), group g's at bounds[g]:bounds[g + 1]."""
    names = _POD_ROWS.classes.values
    value = np.array([pc_value.get(n, 0) for n in names] + [0], dtype=np.int64)  # (-1: the last, no class)
    known = np.array([n in pc_value for n in names] + [False], dtype=bool)
    cls = c["pclass"][by_group]
    start, end = bounds[groups], bounds[groups + 1]
    out = np.full(len(groups), global_default, dtype=np.int64)
    # the first member with a priority, then (it takes precedence) the first with a known class
    for flagged, of in ((c["has_prio"][by_group] != 0, c["prio"][by_group]), (known[cls], value[cls])):
        at = np.flatnonzero(flagged)
        j = np.minimum(np.searchsorted(at, start), max(len(at) - 1, 0))
        hit = (at[j] < end) & (at[j] >= start) if len(at) else np.zeros(len(groups), dtype=bool)
        out[hit] = of[at[j[hit]]]
    return out


def _priority_of(pods: list[Pod], pc_value: dict[str, int], global_default: int) -> int:
    """The priority of a group without a class of its own: its first pod's known class, else its first pod's
    priority, else the global default."""
    for p in pods:
        if p.priority_class_name and p.priority_class_name in pc_value:
            return pc_value[p.priority_class_name]
    for p in pods:
        if p.priority is not None:
            return p.priority
    return global_default


@dataclass
class _PodValues:
    """What the kept pods' rows give besides arrays: extended requests, annotated devices, GPU groups, the
    scheduling signatures, each pod's group and the keys of groups that no PodGroup declares."""

    extra: list[tuple[int, int, int]]  # (pod, column, value) of extended resources
    explicit: ExplicitDevices  # pod -> annotated device indexes within its node
    gpu_groups: dict[int, str]
    sig: np.ndarray  # int32[P]
    sigs: list[SchedulingSig]
    with_subgroup: list[int]
    kid: np.ndarray  # int64[P] each pod's group key id (PodRows.keys), -1 for pods not ours
    decl_ids: np.ndarray  # int64[D] the declared groups' key ids
    undeclared: list[str]  # sorted keys of our pods' groups that no PodGroup declares
    implicit: set[str]  # keys of the implicit groups of lone pods
    missing: set[str]  # keys pods name that no podgroup declares


def _pod_values(kept: _Kept, col: dict[str, int], declared_keys: list[str], decl_ids: np.ndarray) -> _PodValues:
    """Per-pod values and group keys from the kept pods' rows (`decl_ids`: the declared keys' ids in
    PodRows.keys)."""
    c, ours = kept.c, kept.ours
    extra = [(i, col[r], x) for i in np.flatnonzero(c["has_extra"]).tolist() for r, x in c["extra"][i]]
    lens = c["devices" + LEN]
    start = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=start[1:])
    explicit = ExplicitDevices(c["has_devices"] != 0, start, c["devices" + FLAT])
    grp_at = np.flatnonzero(c["has_gpu_group"])
    gpu_groups = dict(zip(grp_at.tolist(), c["gpu_group"][grp_at].tolist(), strict=True))
    # signatures in the order our pods first use them
    P = len(kept.pods)
    sig = np.zeros(P, dtype=np.int32)
    ours_at = np.flatnonzero(ours)
    sigs: list[SchedulingSig] = []
    if len(ours_at):
        skey = c["skey"][ours_at]
        used, first = np.unique(skey, return_index=True)
        used = used[np.argsort(first)]
        objects, values = _POD_ROWS.sig_objects, _POD_ROWS.sigs.values
        sigs = [objects.get(k) or objects.setdefault(k, SchedulingSig(*values[k])) for k in used.tolist()]
        remap = np.zeros(int(used.max()) + 1, dtype=np.int32)
        remap[used] = np.arange(len(used), dtype=np.int32)
        sig[ours_at] = remap[skey]
    if not sigs:
        sigs.append(SchedulingSig((), (), ()))
    with_subgroup = np.flatnonzero(ours & (c["subgroup"] != 0)).tolist()
    # group keys: the named PodGroup, else the pod's implicit group ("-implicit" added while a PodGroup holds it)
    keys = _POD_ROWS.keys
    gkey, ikey = c["gkey"], c["ikey"]
    named = ours & (gkey >= 0)
    lone = ours & (gkey < 0)
    kid = np.where(named, gkey, np.where(lone, ikey, -1))
    is_decl = np.zeros(len(keys), dtype=bool)
    is_decl[decl_ids] = True
    clashes = np.flatnonzero(lone & is_decl[ikey]).tolist()
    declared = set(declared_keys) if clashes else set()
    for i in clashes:
        key = keys.values[int(ikey[i])]
        while key in declared:
            key += "-implicit"
        kid[i] = keys.id(key)
    if len(is_decl) < len(keys):
        is_decl = np.concatenate([is_decl, np.zeros(len(keys) - len(is_decl), dtype=bool)])
    values_of = keys.values
    implicit = {values_of[k] for k in _distinct(kid[lone], len(keys)).tolist()}
    named_ids = _distinct(kid[named], len(keys))
    missing = {values_of[k] for k in named_ids[~is_decl[named_ids]].tolist()}
    used_ids = _distinct(kid[kid >= 0], len(keys))
    undeclared = sorted(values_of[k] for k in used_ids[~is_decl[used_ids]].tolist())
    return _PodValues(extra, explicit, gpu_groups, sig, sigs, with_subgroup, kid, decl_ids, undeclared, implicit,
                      missing)


def _distinct(ids: np.ndarray, n: int) -> np.ndarray:
    """The distinct values of `ids` (in 0..n-1), ascending: np.unique by a presence mask (ids are interned
    integers, so no sort)."""
    seen = np.zeros(n, dtype=bool)
    seen[ids] = True
    return np.flatnonzero(seen)


@dataclass
class _Groups:
    """Per-podgroup values as arrays and per-subgroup values as lists; groups the rows do not give are filled one
    by one."""

    keys: list[str]
    topologies: list[TopologyIndex]
    topo_by_name: dict[str, int]
    queue: np.ndarray = field(init=False)  # int32[G]
    min_member: np.ndarray = field(init=False)  # int32[G]
    prio: np.ndarray = field(init=False)  # int32[G]
    preempt: np.ndarray = field(init=False)  # bool[G]
    creation: np.ndarray = field(init=False)  # float64[G]
    last_start: np.ndarray = field(init=False)  # float64[G]
    stale: np.ndarray = field(init=False)  # float64[G]
    implicit: np.ndarray = field(init=False)  # bool[G]
    topo: np.ndarray = field(init=False)  # int32[G]
    req: np.ndarray = field(init=False)  # int32[G]
    pref: np.ndarray = field(init=False)  # int32[G]
    problem: list[str | None] = field(init=False)  # [G]
    problem_msg: list[str | None] = field(init=False)  # [G]
    sg_pg: list[int] = field(default_factory=list)
    sg_names: list[str] = field(default_factory=list)
    sg_min: list[int] = field(default_factory=list)
    sg_parent: list[int] = field(default_factory=list)
    sg_topo: list[int] = field(default_factory=list)
    sg_req: list[int] = field(default_factory=list)
    sg_pref: list[int] = field(default_factory=list)
    sg_lookup: dict[tuple[int, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        G = len(self.keys)
        self.queue = np.full(G, -1, dtype=np.int32)
        self.min_member = np.ones(G, dtype=np.int32)
        self.prio = np.zeros(G, dtype=np.int32)
        self.preempt, self.implicit = np.zeros(G, dtype=bool), np.zeros(G, dtype=bool)
        self.creation, self.last_start, self.stale = (np.full(G, NAN) for _ in range(3))
        self.topo, self.req, self.pref = (np.full(G, -1, dtype=np.int32) for _ in range(3))
        self.problem, self.problem_msg = [None] * G, [None] * G

    def set_problem(self, g: int, reason: str, message: str) -> None:
        """A group's first problem is the one reported."""
        if self.problem[g] is None:
            self.problem[g], self.problem_msg[g] = reason, message

    def topology_of(self, tc: TopologyConstraint | None, g: int, where: str) -> tuple[int, int, int]:
        """(topology, required level, preferred level) of a constraint (-1: none); a required topology or level
        that does not exist is the group's problem. Without a named topology: the only one, else the first
        holding the level."""
        if tc is None:
            return -1, -1, -1
        topologies = self.topologies
        t = -1
        if tc.topology:
            t = self.topo_by_name.get(tc.topology, -1)
        elif len(topologies) == 1:
            t = 0
        else:
            for i, ti in enumerate(topologies):
                if (tc.required_level or tc.preferred_level) in ti.levels:
                    t = i
                    break
        if t < 0:
            if tc.required_level:
                self.set_problem(g, "TopologyDoesNotExist", f"{where}: topology {tc.topology!r} does not exist")
            return -1, -1, -1
        levels = topologies[t].levels
        req = levels.index(tc.required_level) if tc.required_level in levels else -1
        pref = levels.index(tc.preferred_level) if tc.preferred_level in levels else -1
        if tc.required_level and req < 0:
            self.set_problem(g, "TopologyLevelDoesNotExist",
                             f"{where}: level {tc.required_level!r} is not in topology {topologies[t].name!r}")
        return t, req, pref

    def add_subgroups(self, g: int, spec: PodGroup) -> None:
        """The declared subgroups of group g, then their parents (a parent may be declared after its child)."""
        for sg in spec.sub_groups:
            self.sg_lookup[(g, sg.name)] = len(self.sg_pg)
            self.sg_pg.append(g)
            self.sg_names.append(sg.name)
            self.sg_min.append(sg.min_member)
            t, rq, pf = self.topology_of(sg.topology_constraint, g, f"subgroup {sg.name}")
            self.sg_topo.append(t)
            self.sg_req.append(rq)
            self.sg_pref.append(pf)
            self.sg_parent.append(-1)
        for sg in spec.sub_groups:
            if sg.parent is not None:
                self.sg_parent[self.sg_lookup[(g, sg.name)]] = self.sg_lookup[(g, sg.parent)]


def _podgroups(specs: list[PodGroup], rows: dict[str, np.ndarray], declared_keys: list[str], kept: _Kept,
               values: _PodValues, pod_pg: np.ndarray, topologies: list[TopologyIndex], queues: _Queues,
               pc_value: dict[str, int], global_default: int, default_queue: str) -> _Groups:
    """Podgroups: the declared ones, then (sorted) placeholders for missing ones and implicit ones for lone
    pods; each group's queue, priority, preemptibility, times, topology and first problem."""
    implicit, missing, pods = values.implicit, values.missing, kept.pods
    keys = declared_keys + values.undeclared
    G, D = len(keys), len(declared_keys)
    out = _Groups(keys, topologies, {t.name: i for i, t in enumerate(topologies)})
    alone = np.flatnonzero(rows["alone"])
    for name, col in (("min_member", "min_member"), ("prio", "prio"), ("preempt", "preempt"),
                      ("creation", "creation"), ("last_start", "last_start"), ("stale", "stale")):
        getattr(out, name)[alone] = rows[col][alone]
    named = _GROUP_ROWS.queues.values
    q_of_name = np.array([queues.index.get(n, -1) for n in named], dtype=np.int32)
    spec_queue = rows["queue"]
    out.queue[:D] = np.where(spec_queue >= 0, q_of_name[np.maximum(spec_queue, 0)] if len(named) else -1, -1)
    # our pods of each group, in pod order
    ours_at = np.flatnonzero(pod_pg >= 0)
    by_group = ours_at[np.argsort(pod_pg[ours_at], kind="stable")]
    bounds = np.searchsorted(pod_pg[by_group], np.arange(G + 1))

    def members(g: int) -> list[Pod]:
        return [pods[i] for i in by_group[bounds[g]:bounds[g + 1]].tolist()]

    by_pods = np.flatnonzero(rows["alone"] == 2)  # declared groups whose priority their pods give
    if len(by_pods):
        pod_prio = _member_priorities(by_pods, by_group, bounds, kept.c, pc_value, global_default)
        out.prio[by_pods] = pod_prio
        spec_preempt = rows["preempt"][by_pods]
        out.preempt[by_pods] = np.where(spec_preempt < 0, pod_prio < NON_PREEMPTIBLE_PRIORITY, spec_preempt != 0)

    queue_names: dict[int, str] = {}  # groups without a queue in their spec: the queue their pods name
    spec_rows = rows["alone"]
    for g in [*np.flatnonzero(spec_rows == 0).tolist(), *range(D, G)]:
        spec = specs[g] if g < D else None
        key = keys[g]
        if spec is not None:
            out.min_member[g] = spec.min_member
            pc = spec.priority_class_name
            prio = pc_value[pc] if pc and pc in pc_value else _priority_of(members(g), pc_value, global_default)
            out.prio[g] = prio
            out.preempt[g] = (spec.preemptibility == "preemptible") if spec.preemptibility else \
                prio < NON_PREEMPTIBLE_PRIORITY
            out.creation[g] = _t(spec.meta.creation_timestamp)
            out.last_start[g] = _t(spec.last_start)
            out.stale[g] = _t(spec.stale_since)
            if spec.topology_constraint is not None:
                out.topo[g], out.req[g], out.pref[g] = out.topology_of(spec.topology_constraint, g,
                                                                       "topologyConstraint")
            if spec.sub_groups:  # (usually none)
                out.add_subgroups(g, spec)
        else:
            mem = members(g)
            out.min_member[g] = 1 if key in implicit else max(1, len(mem))
            prio = out.prio[g] = _priority_of(mem, pc_value, global_default)
            out.preempt[g] = prio < NON_PREEMPTIBLE_PRIORITY
            out.creation[g] = min((_t(p.meta.creation_timestamp) for p in mem), default=NAN)
            out.implicit[g] = key in implicit
            if key in missing:
                out.set_problem(g, "PodGroupDoesNotExist", f"podgroup {key} does not exist")
    for g in [*np.flatnonzero(spec_queue < 0).tolist(), *range(D, G)]:
        name = next((q for q in (p.queue for p in members(g)) if q), None) or default_queue
        queue_names[g] = name
        out.queue[g] = queues.index.get(name, -1)
    leaf = np.array(queues.leaf, dtype=bool)
    for g in np.flatnonzero((out.queue < 0) | ~leaf[np.maximum(out.queue, 0)] if len(leaf) else out.queue < 0
                            ).tolist():
        name = queue_names.get(g) or specs[g].queue or ""
        if out.queue[g] < 0:
            out.set_problem(g, "QueueDoesNotExist", f"queue {name!r} does not exist")
        else:
            out.set_problem(g, "QueueIsNotLeaf", f"queue {name!r} has child queues; only leaf queues hold work")
    return out


@dataclass
class _PodArrays:
    status: np.ndarray
    ours: np.ndarray
    node: np.ndarray
    req: np.ndarray
    whole: np.ndarray
    frac: np.ndarray
    mem: np.ndarray
    ndev: np.ndarray
    sig: np.ndarray
    prio: np.ndarray
    creation: np.ndarray
    start: np.ndarray


def _pod_arrays(kept: _Kept, v: _PodValues, R: int) -> _PodArrays:
    """The kept pods' rows as the state's arrays."""
    c = kept.c
    P = len(kept.pods)
    req = np.zeros((P, R), dtype=np.int64)
    req[:, R_CPU], req[:, R_MEM], req[:, R_GPU], req[:, R_PODS] = c["cpu"], c["mem"], c["gpu"], c["npods"]
    for i, col, x in v.extra:
        req[i, col] = x
    return _PodArrays(
        status=kept.status, ours=kept.ours, node=kept.node, req=req,
        whole=c["whole"].astype(np.int32), frac=c["frac"].astype(np.int32), mem=c["gmem"].copy(),
        ndev=c["ndev"].astype(np.int32), sig=v.sig, prio=c["prio"].astype(np.int32),
        creation=c["creation"].copy(), start=c["start"].copy())


def _pod_groups(pods: list[Pod], v: _PodValues, groups: _Groups, pod_pg: np.ndarray,
                warnings: list[str]) -> np.ndarray:
    """Each pod's subgroup (-1: none); a subgroup the pod's declared group does not declare is warned about."""
    pod_sg = np.full(len(pods), -1, dtype=np.int32)
    for i in v.with_subgroup:
        pod = pods[i]
        sgi = groups.sg_lookup.get((int(pod_pg[i]), pod.subgroup), -1)  # type: ignore[arg-type]
        if sgi < 0 and pod_pg[i] >= 0 and not groups.implicit[pod_pg[i]]:
            warnings.append(f"Pod {pod.key}: subgroup {pod.subgroup!r} is not declared by its podgroup")
        pod_sg[i] = sgi
    return pod_sg


def _group_index(v: _PodValues, declared_keys: list[str]) -> np.ndarray:
    """Each pod's podgroup index (-1: none): declared groups first, then the undeclared ones in sorted order."""
    keys = _POD_ROWS.keys
    to_g = np.full(len(keys), -1, dtype=np.int32)
    to_g[v.decl_ids] = np.arange(len(declared_keys), dtype=np.int32)
    to_g[keys.ids_of(v.undeclared)] = len(declared_keys) + np.arange(len(v.undeclared), dtype=np.int32)
    return np.where(v.kid >= 0, to_g[np.maximum(v.kid, 0)], -1).astype(np.int32)


def _membership_csr(pod_pg: np.ndarray, pod_creation: np.ndarray, pod_prio: np.ndarray,
                    G: int) -> tuple[np.ndarray, np.ndarray]:
    """Group membership CSR (pg_pod_start, pg_pods): the pods of each group in task order (priority desc, then
    creation, then index)."""
    pg_pod_start = np.zeros(G + 1, dtype=np.int64)
    counts = np.bincount(pod_pg[pod_pg >= 0], minlength=G) if G else np.zeros(0, dtype=np.int64)
    np.cumsum(counts, out=pg_pod_start[1:])
    ours_idx = np.nonzero(pod_pg >= 0)[0]
    order = np.lexsort((ours_idx, np.nan_to_num(pod_creation[ours_idx], nan=np.inf), -pod_prio[ours_idx],
                        pod_pg[ours_idx]))
    return pg_pod_start, ours_idx[order].astype(np.int64)


@dataclass
class _Usage:
    node_used: np.ndarray
    node_rel: np.ndarray
    node_pipe: np.ndarray
    dev_used: np.ndarray
    dev_rel: np.ndarray
    dev_pipe: np.ndarray
    pod_dev_start: np.ndarray
    pod_dev: np.ndarray


def _node_usage(pods: list[Pod], nodes: _Nodes, a: _PodArrays, node_names: list[str], v: _PodValues,
                warnings: list[str]) -> _Usage:
    """What pods hold on each node and device (bound and releasing pods, and pipelined pods' claims); warns of
    over-full nodes and of pending gpu-memory pods that no node's GPU memory is known to fit."""
    N, P = len(node_names), len(pods)
    pod_status, pod_node, pod_req, node_alloc = a.status, a.node, a.req, nodes.alloc
    R = node_alloc.shape[1]
    holders = np.nonzero((pod_status == PodStatus.BOUND) | (pod_status == PodStatus.RELEASING)
                         | (pod_status == PodStatus.PIPELINED))[0]
    releasing = pod_status == PodStatus.RELEASING
    pipelined = pod_status == PodStatus.PIPELINED
    node_used = np.zeros((N, R), dtype=np.int64)
    node_rel = np.zeros((N, R), dtype=np.int64)
    node_pipe = np.zeros((N, R), dtype=np.int64)
    if len(holders):
        occupying = holders[~pipelined[holders]]
        add_rows(node_used, pod_node[occupying], pod_req[occupying])
        rel = holders[releasing[holders]]
        if len(rel):
            add_rows(node_rel, pod_node[rel], pod_req[rel])
        piped = holders[pipelined[holders]]
        if len(piped):
            add_rows(node_pipe, pod_node[piped], pod_req[piped])

    dev_used, dev_rel, dev_pipe, pod_dev_start, pod_dev, dev_warn = assign_devices(
        dev_start=nodes.dev_start, node_gpu_mem_mib=nodes.gpu_mem, holders=holders, pod_node=pod_node,
        releasing=releasing, whole=a.whole, frac=a.frac, mem=a.mem, ndev=a.ndev, explicit=v.explicit,
        groups=v.gpu_groups, n_pods=P, pod_name=lambda i: pods[i].key, node_name=lambda n: node_names[n],
        pipelined=pipelined)
    warnings.extend(dev_warn)
    if N:
        # GPU usage per node from the devices (gpu-memory pods are converted there)
        gpus = nodes.gpus
        has_dev = gpus > 0
        dev_node = np.repeat(np.arange(N), gpus)
        for dev_arr, node_arr in ((dev_used, node_used), (dev_rel, node_rel), (dev_pipe, node_pipe)):
            per_node = np.zeros(N, dtype=np.int64)
            if len(dev_arr):
                np.add.at(per_node, dev_node, dev_arr)
            node_arr[has_dev, R_GPU] = np.maximum(node_arr[has_dev, R_GPU], per_node[has_dev])
        over = np.nonzero((node_used > node_alloc).any(axis=1))[0]
        for n in over[:20].tolist():
            warnings.append(f"Node {node_names[n]}: pods on it hold more than its allocatable")

    pod_mem = a.mem
    by_mem = np.flatnonzero((pod_mem > 0) & a.ours & (pod_status == PodStatus.PENDING))
    if len(by_mem):
        warnings.extend(gpu_memory_warnings([pods[i].key for i in by_mem.tolist()], pod_mem[by_mem],
                                            nodes.gpu_mem_known, nodes.gpu_mem))
    return _Usage(node_used, node_rel, node_pipe, dev_used, dev_rel, dev_pipe, pod_dev_start, pod_dev)


def _t(x: float | None) -> float:
    return NAN if x is None else float(x)


def _inherit(values: list[float | None], parent: np.ndarray) -> np.ndarray:
    out = np.full(len(values), NAN)
    for q in range(len(values)):
        cur = q
        while cur >= 0:
            if values[cur] is not None:
                out[q] = values[cur]
                break
            cur = int(parent[cur])
    return out


def _topology_index(name: str, levels: tuple[str, ...], snapshot: Snapshot) -> TopologyIndex:
    domain, domain_names = [], []
    labels = [node.labels for node in snapshot.nodes]
    for depth in range(len(levels)):
        keys = levels[: depth + 1]
        ids: dict[tuple[str, ...], int] = {}
        out = [-1] * len(labels)
        for i, lab in enumerate(labels):
            vals = tuple([lab.get(k) for k in keys])
            if None in vals:  # label values are strings: `in` finds exactly the missing ones
                continue
            out[i] = ids.setdefault(vals, len(ids))  # type: ignore[arg-type]
        domain.append(np.array(out, dtype=np.int32))
        domain_names.append(["/".join(k) for k in ids])
    return TopologyIndex(name=name, levels=levels, domain=domain, domain_names=domain_names)


def _view(views: dict[Any, Any], key: Any, make: Any) -> Any:
    """`views[key]`, made by `make()` the first time (numpy arrays in it read-only: every state shares it)."""
    v = views.get(key)
    if v is None:
        v = views[key] = make()
        for a in (v.domain if isinstance(v, TopologyIndex) else [v] if isinstance(v, np.ndarray) else []):
            a.setflags(write=False)
    return v


def _node_classes(snapshot: Snapshot, sigs: list[SchedulingSig], views: dict[Any, Any]) -> np.ndarray:
    """Nodes alike in every label the signatures read, their taints and (when a signature names nodes) name."""
    keys: set[str] = set()
    by_name = False
    for s in sigs:
        by_name = by_name or s.dra_nodes is not None
        keys.update(k for k, _ in s.node_selector)
        for term in s.node_affinity:
            keys.update(r.key for r in term.match_expressions)
            by_name = by_name or bool(term.match_fields)
    key_list = sorted(keys)
    return _view(views, ("classes", tuple(key_list), by_name), lambda: _classes_of(snapshot, key_list, by_name))


def _classes_of(snapshot: Snapshot, key_list: list[str], by_name: bool) -> np.ndarray:
    ids: dict[tuple[Any, ...], int] = {}
    out = np.zeros(len(snapshot.nodes), dtype=np.int32)
    for i, node in enumerate(snapshot.nodes):
        labels = node.labels
        k = (tuple(labels.get(x) for x in key_list), node.taints, node.name if by_name else None)
        out[i] = ids.setdefault(k, len(ids))
    return out

