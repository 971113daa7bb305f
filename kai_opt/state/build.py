"""Snapshot -> ClusterState."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from kai_opt.api import DEFAULT_PRIORITY_CLASSES, Node, Pod, PodGroup, TopologyConstraint
from kai_opt.api.priorityclass import NON_PREEMPTIBLE_PRIORITY
from kai_opt.api.queue import QUEUE_RESOURCES
from kai_opt.dra.prepare import has_dra
from kai_opt.dra.prepare import prepare as prepare_dra
from kai_opt.snapshot import Snapshot
from kai_opt.state.cluster import ClusterState, PodStatus, SchedulingSig, TopologyIndex
from kai_opt.state.gpu import assign_devices
from kai_opt.state.gpu_memory import gpu_memory_warnings
from kai_opt.state.resources import BASE_RESOURCES, QR_COLUMN, QR_DIVISOR, R_CPU, R_GPU, R_MEM, R_PODS, resource_axis
from kai_opt.units import GPU_RESOURCE, gpu_milli_from_fraction

DEFAULT_QUEUE = "default-queue"
NAN = float("nan")


def build_state(snapshot: Snapshot, *, now: float | None = None, default_queue: str = DEFAULT_QUEUE) -> ClusterState:
    now = now if now is not None else (snapshot.now if snapshot.now is not None else time.time())
    ours_names = set(snapshot.scheduler_names)
    warnings: list[str] = [str(w) for w in snapshot.warnings]
    dra = None
    if has_dra(snapshot.pods, snapshot.resource_slices):  # DRA devices become columns, claims requests and pins
        dra_nodes, dra_pods, dra = prepare_dra(snapshot.nodes, snapshot.pods, snapshot, warnings)
        snapshot = dataclasses.replace(snapshot, nodes=dra_nodes, pods=dra_pods)
    node_names = [n.name for n in snapshot.nodes]
    node_index = {n: i for i, n in enumerate(node_names)}
    pods, status, resources, rows = _kept_pods(snapshot, ours_names, node_index, warnings)
    col = {r: i for i, r in enumerate(resources)}
    nodes = _node_arrays(snapshot, col)
    views = nodes.views
    topologies = [_view(views, ("topology", t.name, t.levels), lambda t=t: _topology_index(t.name, t.levels, snapshot))
                  for t in snapshot.topologies]
    queues = _queue_arrays(snapshot)
    pc_value = dict(DEFAULT_PRIORITY_CLASSES)
    pc_value.update({pc.name: pc.value for pc in snapshot.priority_classes})
    global_default = next((pc.value for pc in snapshot.priority_classes if pc.global_default), 0)
    declared_keys = [g.key for g in snapshot.podgroups]
    declared: dict[str, PodGroup] = dict(zip(declared_keys, snapshot.podgroups, strict=True))
    values = _pod_values(pods, rows, status, ours_names, node_index, col, declared)
    groups = _podgroups(declared_keys, pods, values, declared, topologies, queues, pc_value, global_default,
                        default_queue)
    arrays = _pod_arrays(values, status, len(pods), len(resources))
    pod_pg, pod_sg = _pod_groups(pods, values, groups, warnings)
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
        pg_keys=groups.keys, pg_queue=np.array(groups.queue, dtype=np.int32),
        pg_min_member=np.array(groups.min_member, dtype=np.int32),
        pg_priority=np.array(groups.prio, dtype=np.int32), pg_preemptible=np.array(groups.preempt, dtype=bool),
        pg_creation=np.array(groups.creation, dtype=np.float64),
        pg_last_start=np.array(groups.last_start, dtype=np.float64),
        pg_stale_since=np.array(groups.stale, dtype=np.float64), pg_implicit=groups.implicit_arr,
        pg_pod_start=pg_pod_start, pg_pods=pg_pods, pg_topology=np.array(groups.topo, dtype=np.int32),
        pg_required_level=np.array(groups.req, dtype=np.int32),
        pg_preferred_level=np.array(groups.pref, dtype=np.int32), pg_problem=groups.problem,
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


def _kept_pods(snapshot: Snapshot, ours_names: set[str], node_index: dict[str, int],
               warnings: list[str]) -> tuple[list[Pod], list[int], tuple[str, ...], list[tuple[Any, ...]]]:
    """The pods that matter, their status and rows (`_rows`), and the resource axis (node and pod resources), in
    one pass over the snapshot's pods: finished pods, foreign pending pods and deleted pending pods play no part."""
    names: set[str] = set()
    for node in snapshot.nodes:
        names.update(node.allocatable)
    pods: list[Pod] = []
    status: list[int] = []
    kept: list[tuple[Any, ...]] = []
    bound, releasing, pipelined, gated, pending = (PodStatus.BOUND, PodStatus.RELEASING, PodStatus.PIPELINED,
                                                   PodStatus.GATED, PodStatus.PENDING)
    for pod, row in zip(snapshot.pods, _rows(snapshot.pods), strict=True):
        finished, deleted, nominated, gates = row[10]
        if finished:
            continue
        if row[2]:
            names.update(r for r, _x in row[2])
        node_name = row[1]
        if node_name:
            if node_name not in node_index:
                warnings.append(f"Pod {pod.key}: bound to unknown node {node_name!r}; ignored")
                continue
            status.append(releasing if deleted else bound)
        elif deleted or row[5] not in ours_names:
            continue
        elif nominated and nominated in node_index and not gates:
            status.append(pipelined)
        elif gates:
            status.append(gated)
        else:
            status.append(pending)
        pods.append(pod)
        kept.append(row)
    return pods, status, resource_axis(names), kept


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
    """What the one pass over the kept pods reads: per-pod values as Python lists (arrays are made once
    afterwards), group membership of our pods, and the scheduling signatures."""

    ours: list[bool]
    node: list[int]
    cpu: list[int]
    mem: list[int]
    gpu: list[int]
    npods: list[int]
    extra: list[tuple[int, int, int]]  # (pod, column, value) of extended resources
    whole: list[int]
    frac: list[int]
    gmem: list[int]
    ndev: list[int]
    prio: list[int]
    sig: list[int]
    creation: list[float]
    start: list[float]
    with_subgroup: list[int]
    sigs: list[SchedulingSig]
    explicit: dict[int, tuple[int, ...]]  # pod -> annotated device indexes within its node
    gpu_groups: dict[int, str]
    members: dict[str, list[int]]  # podgroup key -> our pods in it
    implicit: set[str]  # keys of the implicit groups of lone pods
    missing: set[str]  # keys pods name that no podgroup declares


_NO_SIG: tuple[Any, ...] = ((), (), ())
_BASE_KEYS = frozenset(BASE_RESOURCES)

# the last build's per-pod rows by id(pod), with the pods they were read from (held, so no id is reused while an
# entry exists): the in-cluster cache hands the same Pod models every cycle while a pod does not change
_last_rows: list[tuple[list[Pod], dict[int, tuple[Any, ...]]]] = []


def _pod_row(pod: Pod) -> tuple[Any, ...]:
    """What a pod alone gives the state: (numbers, node name, extended requests, GPU devices, GPU group,
    scheduler name, group key or None, implicit group key, signature key, in a subgroup, (finished, deleted,
    nominated node, gated)))."""
    req = pod.requests
    get = req.get
    gpu = whole = frac = gmem = 0
    ndev = 1
    v = get(GPU_RESOURCE)
    if v is not None:
        gpu, whole = v, v // 1000
    if pod.gpu_fraction is not None:
        frac = gpu_milli_from_fraction(pod.gpu_fraction)
        ndev = pod.gpu_fraction_num_devices
        gpu = frac * ndev
    elif pod.gpu_memory_mib is not None:
        gmem = pod.gpu_memory_mib
        ndev = pod.gpu_fraction_num_devices
    meta = pod.meta
    numbers = (get("cpu", 0), get("memory", 0), get("pods", 0), gpu, whole, frac, gmem, ndev,
               pod.priority if pod.priority is not None else 0,
               meta.creation_timestamp if meta.creation_timestamp is not None else NAN,
               pod.start_time if pod.start_time is not None else NAN)
    extra = () if _BASE_KEYS.issuperset(req) else tuple((r, x) for r, x in req.items() if r not in _BASE_KEYS)
    ns = meta.namespace or "default"
    selector, affinity, tolerations = pod.node_selector, pod.node_affinity, pod.tolerations
    skey = _NO_SIG if not (selector or affinity or tolerations or pod.dra_nodes is not None) else (
        tuple(sorted(selector.items())) if selector else (), affinity, tolerations,
        frozenset(pod.dra_nodes) if pod.dra_nodes is not None else None)
    return (numbers, pod.node_name, extra, pod.gpu_devices, pod.gpu_group, pod.scheduler_name,
            f"{ns}/{pod.podgroup}" if pod.podgroup else None, f"{ns}/pg-{meta.name}", skey, bool(pod.subgroup),
            (pod.finished, meta.deletion_timestamp is not None, pod.nominated_node, bool(pod.scheduling_gates)))


# the last build's rows of declared podgroups whose values come from the PodGroup alone (by id, the PodGroups held),
# valid while the priority classes are the same
_last_groups: list[tuple[list[PodGroup], dict[int, tuple[Any, ...]], tuple[dict[str, int], int]]] = []


def _rows(pods: list[Pod]) -> list[tuple[Any, ...]]:
    """Each pod's row: from the last build where the pod is the same object, else read now."""
    memo = _last_rows[0][1] if _last_rows else {}
    get = memo.get
    rows = [get(id(p)) or _pod_row(p) for p in pods]
    _last_rows[:] = [(pods, dict(zip(map(id, pods), rows, strict=True)))]
    return rows


def _pod_values(pods: list[Pod], rows: list[tuple[Any, ...]], status: list[int], ours_names: set[str],
                node_index: dict[str, int], col: dict[str, int], declared: dict[str, PodGroup]) -> _PodValues:
    """Per-pod values and group membership, column-wise from the pods' rows (`_rows`)."""
    P = len(pods)
    members: dict[str, list[int]] = {}
    implicit: set[str] = set()
    missing: set[str] = set()
    cols: list[tuple[Any, ...]] = list(zip(*(r[0] for r in rows), strict=True)) if P else [()] * 11
    cpu_l, mem_l, npods_l, gpu_l, whole_l, frac_l, gmem_l, ndev_l, prio_l, creation_l, start_l = (
        list(c) for c in cols)
    ni = node_index.get
    node_l = [ni(r[1], -1) if r[1] else -1 for r in rows]
    pipelined_status = PodStatus.PIPELINED
    for i in [i for i, st in enumerate(status) if st == pipelined_status]:
        node_l[i] = node_index[pods[i].nominated_node]  # type: ignore[index]
    extra = [(i, col[r], x) for i, row in enumerate(rows) if row[2] for r, x in row[2]]
    explicit = {i: r[3] for i, r in enumerate(rows) if r[3] is not None}
    gpu_groups = {i: r[4] for i, r in enumerate(rows) if r[4]}
    ours_l = [r[5] in ours_names for r in rows]
    sig_l = [0] * P
    with_subgroup: list[int] = []
    sig_ids: dict[tuple[Any, ...], int] = {}
    sigs: list[SchedulingSig] = []
    for i in [i for i, o in enumerate(ours_l) if o]:
        r = rows[i]
        key = r[6]
        if key is not None:
            if key not in declared:
                missing.add(key)
        else:
            key = r[7]
            while key in declared:
                key += "-implicit"
            implicit.add(key)
        m = members.get(key)
        if m is None:
            members[key] = [i]
        else:
            m.append(i)
        skey = r[8]
        s = sig_ids.get(skey)
        if s is None:
            s = sig_ids[skey] = len(sigs)
            sigs.append(SchedulingSig(*skey))
        sig_l[i] = s
        if r[9]:
            with_subgroup.append(i)
    if not sigs:
        sigs.append(SchedulingSig((), (), ()))
    return _PodValues(ours_l, node_l, cpu_l, mem_l, gpu_l, npods_l, extra, whole_l, frac_l, gmem_l, ndev_l, prio_l,
                      sig_l, creation_l, start_l, with_subgroup, sigs, explicit, gpu_groups, members, implicit,
                      missing)


@dataclass
class _Groups:
    """Per-podgroup and per-subgroup values as Python lists, filled group by group."""

    keys: list[str]
    index: dict[str, int]
    topologies: list[TopologyIndex]
    topo_by_name: dict[str, int]
    queue: list[int] = field(init=False)  # [G]
    min_member: list[int] = field(init=False)  # [G]
    prio: list[int] = field(init=False)  # [G]
    preempt: list[bool] = field(init=False)  # [G]
    creation: list[float] = field(init=False)  # [G]
    last_start: list[float] = field(init=False)  # [G]
    stale: list[float] = field(init=False)  # [G]
    implicit: list[bool] = field(init=False)  # [G]
    topo: list[int] = field(init=False)  # [G]
    req: list[int] = field(init=False)  # [G]
    pref: list[int] = field(init=False)  # [G]
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
    implicit_arr: np.ndarray = field(init=False)  # bool[G], once every group is filled

    def __post_init__(self) -> None:
        G = len(self.keys)
        self.queue, self.min_member, self.prio, self.preempt = [-1] * G, [1] * G, [0] * G, [False] * G
        self.creation, self.last_start, self.stale = [NAN] * G, [NAN] * G, [NAN] * G
        self.implicit = [False] * G
        self.topo, self.req, self.pref = [-1] * G, [-1] * G, [-1] * G
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


def _podgroups(declared_keys: list[str], pods: list[Pod], values: _PodValues, declared: dict[str, PodGroup],
               topologies: list[TopologyIndex], queues: _Queues, pc_value: dict[str, int], global_default: int,
               default_queue: str) -> _Groups:
    """Podgroups: the declared ones, then (sorted) placeholders for missing ones and implicit ones for lone
    pods; each group's queue, priority, preemptibility, times, topology and first problem."""
    members, implicit, missing = values.members, values.implicit, values.missing
    keys = declared_keys + sorted(k for k in members if k not in declared)
    out = _Groups(keys, {k: i for i, k in enumerate(keys)}, topologies,
                  {t.name: i for i, t in enumerate(topologies)})
    no_members: list[int] = []
    last = _last_groups[0] if _last_groups and _last_groups[0][2] == (pc_value, global_default) else None
    memo = last[1] if last is not None else {}
    rows: dict[int, tuple[Any, ...]] = {}
    mm, pr, pe, cr, ls, st = out.min_member, out.prio, out.preempt, out.creation, out.last_start, out.stale
    for g, key in enumerate(keys):
        idx = members.get(key, no_members)
        spec = declared.get(key)
        queue_name: str | None = None
        if spec is not None and (row := memo.get(id(spec))) is not None:
            mm[g], pr[g], pe[g], cr[g], ls[g], st[g] = row
            rows[id(spec)] = row
            queue_name = spec.queue
        elif spec is not None:
            out.min_member[g] = spec.min_member
            queue_name = spec.queue
            pc = spec.priority_class_name
            prio = pc_value[pc] if pc and pc in pc_value else _priority_of([pods[i] for i in idx], pc_value,
                                                                           global_default)
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
            elif spec.topology_constraint is None and pc and pc in pc_value:  # a row of the spec alone
                rows[id(spec)] = (mm[g], pr[g], pe[g], cr[g], ls[g], st[g])
        else:
            mem = [pods[i] for i in idx]
            out.min_member[g] = 1 if key in implicit else max(1, len(mem))
            prio = out.prio[g] = _priority_of(mem, pc_value, global_default)
            out.preempt[g] = prio < NON_PREEMPTIBLE_PRIORITY
            out.creation[g] = min((_t(p.meta.creation_timestamp) for p in mem), default=NAN)
            out.implicit[g] = key in implicit
            if key in missing:
                out.set_problem(g, "PodGroupDoesNotExist", f"podgroup {key} does not exist")
        if queue_name is None:
            queue_name = next((q for q in (pods[i].queue for i in idx) if q), None) or default_queue
        q = queues.index.get(queue_name, -1)
        out.queue[g] = q
        if q < 0:
            out.set_problem(g, "QueueDoesNotExist", f"queue {queue_name!r} does not exist")
        elif not queues.leaf[q]:
            out.set_problem(g, "QueueIsNotLeaf", f"queue {queue_name!r} has child queues; only leaf queues hold work")
    out.implicit_arr = np.array(out.implicit, dtype=bool)
    _last_groups[:] = [(list(declared.values()), rows, (dict(pc_value), global_default))]
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


def _pod_arrays(v: _PodValues, status: list[int], P: int, R: int) -> _PodArrays:
    """The per-pod lists as arrays, each made once."""
    req = np.zeros((P, R), dtype=np.int64)
    if P:
        req[:, R_CPU] = v.cpu
        req[:, R_MEM] = v.mem
        req[:, R_GPU] = v.gpu
        req[:, R_PODS] = v.npods
    for i, c, x in v.extra:
        req[i, c] = x
    return _PodArrays(
        status=np.array(status, dtype=np.int8), ours=np.array(v.ours, dtype=bool),
        node=np.array(v.node, dtype=np.int32), req=req,
        whole=np.array(v.whole, dtype=np.int32), frac=np.array(v.frac, dtype=np.int32),
        mem=np.array(v.gmem, dtype=np.int64), ndev=np.array(v.ndev, dtype=np.int32),
        sig=np.array(v.sig, dtype=np.int32), prio=np.array(v.prio, dtype=np.int32),
        creation=np.array(v.creation, dtype=np.float64), start=np.array(v.start, dtype=np.float64))


def _pod_groups(pods: list[Pod], v: _PodValues, groups: _Groups,
                warnings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Each pod's podgroup and subgroup (-1: none), in bulk from the membership lists; a subgroup the pod's
    declared group does not declare is warned about."""
    P = len(pods)
    members, pg_index = v.members, groups.index
    pod_pg = np.full(P, -1, dtype=np.int32)
    if members:
        lens = np.fromiter((len(idx) for idx in members.values()), dtype=np.int64, count=len(members))
        flat = np.fromiter(chain.from_iterable(members.values()), dtype=np.int64, count=int(lens.sum()))
        pod_pg[flat] = np.repeat(np.fromiter((pg_index[k] for k in members), dtype=np.int64, count=len(members)),
                                 lens)
    pod_sg = np.full(P, -1, dtype=np.int32)
    pg_implicit = groups.implicit_arr
    for i in v.with_subgroup:
        pod = pods[i]
        sgi = groups.sg_lookup.get((int(pod_pg[i]), pod.subgroup), -1)  # type: ignore[arg-type]
        if sgi < 0 and pod_pg[i] >= 0 and not pg_implicit[pod_pg[i]]:
            warnings.append(f"Pod {pod.key}: subgroup {pod.subgroup!r} is not declared by its podgroup")
        pod_sg[i] = sgi
    return pod_pg, pod_sg


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
        np.add.at(node_used, pod_node[occupying], pod_req[occupying])
        rel = holders[releasing[holders]]
        if len(rel):
            np.add.at(node_rel, pod_node[rel], pod_req[rel])
        piped = holders[pipelined[holders]]
        if len(piped):
            np.add.at(node_pipe, pod_node[piped], pod_req[piped])

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

