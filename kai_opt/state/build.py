"""Snapshot -> ClusterState."""

from __future__ import annotations

import time
from itertools import chain

import numpy as np

from kai_opt.api import DEFAULT_PRIORITY_CLASSES, Pod, PodGroup
from kai_opt.api.priorityclass import NON_PREEMPTIBLE_PRIORITY
from kai_opt.api.queue import QUEUE_RESOURCES
from kai_opt.snapshot import Snapshot
from kai_opt.state.cluster import ClusterState, PodStatus, SchedulingSig, TopologyIndex
from kai_opt.state.gpu import assign_devices
from kai_opt.state.gpu_memory import gpu_memory_warnings
from kai_opt.state.resources import BASE_RESOURCES, R_CPU, R_GPU, R_MEM, R_PODS, resource_axis
from kai_opt.units import GPU_RESOURCE, gpu_milli_from_fraction

DEFAULT_QUEUE = "default-queue"
NAN = float("nan")


def build_state(snapshot: Snapshot, *, now: float | None = None, default_queue: str = DEFAULT_QUEUE) -> ClusterState:
    now = now if now is not None else (snapshot.now if snapshot.now is not None else time.time())
    ours_names = set(snapshot.scheduler_names)
    warnings: list[str] = [str(w) for w in snapshot.warnings]

    N = len(snapshot.nodes)
    node_names = [n.name for n in snapshot.nodes]
    node_index = {n: i for i, n in enumerate(node_names)}

    # -- resources, and pods: keep those that matter, decide status (one pass) -------------------------------------
    names: set[str] = set()
    for node in snapshot.nodes:
        names.update(node.allocatable)
    pods: list[Pod] = []
    status: list[int] = []
    for pod in snapshot.pods:
        if pod.finished:
            continue
        names.update(pod.requests)
        ours = pod.scheduler_name in ours_names
        if pod.node_name:
            if pod.node_name not in node_index:
                warnings.append(f"Pod {pod.key}: bound to unknown node {pod.node_name!r}; ignored")
                continue
            status.append(PodStatus.RELEASING if pod.meta.deletion_timestamp is not None else PodStatus.BOUND)
        elif not ours or pod.meta.deletion_timestamp is not None:
            continue
        elif pod.nominated_node and pod.nominated_node in node_index and not pod.scheduling_gates:
            status.append(PodStatus.PIPELINED)
        elif pod.scheduling_gates:
            status.append(PodStatus.GATED)
        else:
            status.append(PodStatus.PENDING)
        pods.append(pod)
    P = len(pods)
    resources = resource_axis(names)
    col = {r: i for i, r in enumerate(resources)}
    R = len(resources)

    # -- nodes -----------------------------------------------------------------------------------------------------
    node_alloc = np.zeros((N, R), dtype=np.int64)
    for i, node in enumerate(snapshot.nodes):
        for r, v in node.allocatable.items():
            node_alloc[i, col[r]] = v
    node_ok = np.array([n.ready and not n.unschedulable for n in snapshot.nodes], dtype=bool)
    node_gpu_mem = np.array([n.gpu_memory_mib if n.gpus else 0 for n in snapshot.nodes], dtype=np.int64)
    node_gpu_mem_known = np.array([bool(n.gpus) and n.gpu_memory_known for n in snapshot.nodes], dtype=bool)
    gpus = node_alloc[:, R_GPU] // 1000 if N else np.zeros(0, dtype=np.int64)
    dev_start = np.zeros(N + 1, dtype=np.int64)
    np.cumsum(gpus, out=dev_start[1:])

    # -- topologies ------------------------------------------------------------------------------------------------
    topologies = [_topology_index(t.name, t.levels, snapshot) for t in snapshot.topologies]
    topo_by_name = {t.name: i for i, t in enumerate(topologies)}

    # -- queues ----------------------------------------------------------------------------------------------------
    Q = len(snapshot.queues)
    q_names = [q.name for q in snapshot.queues]
    q_index = {n: i for i, n in enumerate(q_names)}
    q_parent = np.array([q_index[q.parent] if q.parent else -1 for q in snapshot.queues], dtype=np.int32)
    q_priority = np.array([q.priority for q in snapshot.queues], dtype=np.int32)
    q_creation = np.array([_t(q.meta.creation_timestamp) for q in snapshot.queues], dtype=np.float64)
    q_deserved = np.array([[q.resource(r).quota for r in QUEUE_RESOURCES] for q in snapshot.queues],
                          dtype=np.float64).reshape(Q, 3)
    q_limit = np.array([[q.resource(r).limit for r in QUEUE_RESOURCES] for q in snapshot.queues],
                       dtype=np.float64).reshape(Q, 3)
    q_oqw = np.array([[q.resource(r).over_quota_weight for r in QUEUE_RESOURCES] for q in snapshot.queues],
                     dtype=np.float64).reshape(Q, 3)
    q_pre = _inherit([q.preempt_min_runtime_s for q in snapshot.queues], q_parent)
    q_rec = _inherit([q.reclaim_min_runtime_s for q in snapshot.queues], q_parent)
    q_leaf = np.ones(Q, dtype=bool)
    q_leaf[q_parent[q_parent >= 0]] = False

    # -- priority classes ------------------------------------------------------------------------------------------
    pc_value = dict(DEFAULT_PRIORITY_CLASSES)
    pc_value.update({pc.name: pc.value for pc in snapshot.priority_classes})
    global_default = next((pc.value for pc in snapshot.priority_classes if pc.global_default), 0)

    def priority_of(class_name: str | None, pods: list[Pod]) -> int:
        if class_name and class_name in pc_value:
            return pc_value[class_name]
        for p in pods:
            if p.priority_class_name and p.priority_class_name in pc_value:
                return pc_value[p.priority_class_name]
        for p in pods:
            if p.priority is not None:
                return p.priority
        return global_default

    # -- per-pod values and group membership, in one pass (Python lists; arrays are made once afterwards) ---------
    declared_keys = [g.key for g in snapshot.podgroups]
    declared: dict[str, PodGroup] = dict(zip(declared_keys, snapshot.podgroups, strict=True))
    members: dict[str, list[int]] = {}
    implicit: set[str] = set()
    missing: set[str] = set()
    ours_l = [False] * P
    node_l = [-1] * P
    cpu_l, mem_l, gpu_l, npods_l = [0] * P, [0] * P, [0] * P, [0] * P
    extra: list[tuple[int, int, int]] = []  # (pod, column, value) of extended resources
    whole_l, frac_l, gmem_l, ndev_l = [0] * P, [0] * P, [0] * P, [1] * P
    prio_l, sig_l = [0] * P, [0] * P
    creation_l, start_l = [NAN] * P, [NAN] * P
    with_subgroup: list[int] = []
    sig_ids: dict[tuple, int] = {}
    sigs: list[SchedulingSig] = []
    explicit: dict[int, tuple[int, ...]] = {}
    gpu_groups: dict[int, str] = {}
    pipelined_status = PodStatus.PIPELINED
    base_keys = frozenset(BASE_RESOURCES)
    no_sig = ((), (), ())
    for i, pod in enumerate(pods):
        if pod.node_name:
            node_l[i] = node_index[pod.node_name]
        elif status[i] == pipelined_status:
            node_l[i] = node_index[pod.nominated_node]  # type: ignore[index]
        req = pod.requests
        get = req.get
        cpu_l[i] = get("cpu", 0)
        mem_l[i] = get("memory", 0)
        npods_l[i] = get("pods", 0)
        v = get(GPU_RESOURCE)
        if v is not None:
            gpu_l[i] = v
            whole_l[i] = v // 1000
        if not base_keys.issuperset(req):
            extra.extend((i, col[r], x) for r, x in req.items() if r not in base_keys)
        if pod.gpu_fraction is not None:
            frac_l[i] = f = gpu_milli_from_fraction(pod.gpu_fraction)
            ndev_l[i] = pod.gpu_fraction_num_devices
            gpu_l[i] = f * pod.gpu_fraction_num_devices
        elif pod.gpu_memory_mib is not None:
            gmem_l[i] = pod.gpu_memory_mib
            ndev_l[i] = pod.gpu_fraction_num_devices
        if pod.gpu_devices is not None:
            explicit[i] = pod.gpu_devices
        if pod.gpu_group:
            gpu_groups[i] = pod.gpu_group
        if pod.priority is not None:
            prio_l[i] = pod.priority
        meta = pod.meta
        if meta.creation_timestamp is not None:
            creation_l[i] = meta.creation_timestamp
        if pod.start_time is not None:
            start_l[i] = pod.start_time
        if pod.scheduler_name not in ours_names:
            continue
        ours_l[i] = True
        ns = meta.namespace or "default"
        if pod.podgroup:
            key = f"{ns}/{pod.podgroup}"
            if key not in declared:
                missing.add(key)
        else:
            key = f"{ns}/pg-{meta.name}"
            while key in declared:
                key += "-implicit"
            implicit.add(key)
        members.setdefault(key, []).append(i)
        selector, affinity, tolerations = pod.node_selector, pod.node_affinity, pod.tolerations
        skey = no_sig if not (selector or affinity or tolerations) else (
            tuple(sorted(selector.items())) if selector else (), affinity, tolerations)
        s = sig_ids.get(skey)
        if s is None:
            s = sig_ids[skey] = len(sigs)
            sigs.append(SchedulingSig(*skey))
        sig_l[i] = s
        if pod.subgroup:
            with_subgroup.append(i)
    if not sigs:
        sigs.append(SchedulingSig((), (), ()))
    pod_ours = np.array(ours_l, dtype=bool)

    # -- podgroups: declared ones, placeholders for missing ones, implicit ones for lone pods ----------------------
    pg_keys = declared_keys + sorted(k for k in members if k not in declared)
    G = len(pg_keys)
    pg_index = {k: i for i, k in enumerate(pg_keys)}
    pg_queue_l = [-1] * G
    pg_min_l = [1] * G
    pg_prio_l = [0] * G
    pg_preempt_l = [False] * G
    pg_creation_l = [NAN] * G
    pg_last_l = [NAN] * G
    pg_stale_l = [NAN] * G
    pg_implicit_l = [False] * G
    pg_topo_l, pg_req_l, pg_pref_l = [-1] * G, [-1] * G, [-1] * G
    pg_problem: list[str | None] = [None] * G
    pg_problem_msg: list[str | None] = [None] * G
    sg_pg: list[int] = []
    sg_names: list[str] = []
    sg_min: list[int] = []
    sg_parent: list[int] = []
    sg_topo: list[int] = []
    sg_req: list[int] = []
    sg_pref: list[int] = []
    sg_lookup: dict[tuple[int, str], int] = {}
    q_leaf_l = q_leaf.tolist()

    def set_problem(g: int, reason: str, message: str) -> None:
        if pg_problem[g] is None:
            pg_problem[g], pg_problem_msg[g] = reason, message

    def topo_of(tc, g: int, where: str) -> tuple[int, int, int]:
        if tc is None:
            return -1, -1, -1
        t = -1
        if tc.topology:
            t = topo_by_name.get(tc.topology, -1)
        elif len(topologies) == 1:
            t = 0
        else:
            for i, ti in enumerate(topologies):
                if (tc.required_level or tc.preferred_level) in ti.levels:
                    t = i
                    break
        if t < 0:
            if tc.required_level:
                set_problem(g, "TopologyDoesNotExist", f"{where}: topology {tc.topology!r} does not exist")
            return -1, -1, -1
        levels = topologies[t].levels
        req = levels.index(tc.required_level) if tc.required_level in levels else -1
        pref = levels.index(tc.preferred_level) if tc.preferred_level in levels else -1
        if tc.required_level and req < 0:
            set_problem(g, "TopologyLevelDoesNotExist",
                        f"{where}: level {tc.required_level!r} is not in topology {topologies[t].name!r}")
        return t, req, pref

    no_members: list[int] = []
    for g, key in enumerate(pg_keys):
        idx = members.get(key, no_members)
        spec = declared.get(key)
        queue_name: str | None = None
        if spec is not None:
            pg_min_l[g] = spec.min_member
            queue_name = spec.queue
            pc = spec.priority_class_name
            prio = pc_value[pc] if pc and pc in pc_value else priority_of(None, [pods[i] for i in idx])
            pg_prio_l[g] = prio
            pg_preempt_l[g] = (spec.preemptibility == "preemptible") if spec.preemptibility else \
                prio < NON_PREEMPTIBLE_PRIORITY
            pg_creation_l[g] = _t(spec.meta.creation_timestamp)
            pg_last_l[g] = _t(spec.last_start)
            pg_stale_l[g] = _t(spec.stale_since)
            if spec.topology_constraint is not None:
                pg_topo_l[g], pg_req_l[g], pg_pref_l[g] = topo_of(spec.topology_constraint, g, "topologyConstraint")
            for sg in spec.sub_groups:  # (usually none)
                sg_lookup[(g, sg.name)] = len(sg_pg)
                sg_pg.append(g)
                sg_names.append(sg.name)
                sg_min.append(sg.min_member)
                t, rq, pf = topo_of(sg.topology_constraint, g, f"subgroup {sg.name}")
                sg_topo.append(t)
                sg_req.append(rq)
                sg_pref.append(pf)
                sg_parent.append(-1)
            for sg in spec.sub_groups:
                if sg.parent is not None:
                    sg_parent[sg_lookup[(g, sg.name)]] = sg_lookup[(g, sg.parent)]
        else:
            mem = [pods[i] for i in idx]
            pg_min_l[g] = 1 if key in implicit else max(1, len(mem))
            prio = pg_prio_l[g] = priority_of(None, mem)
            pg_preempt_l[g] = prio < NON_PREEMPTIBLE_PRIORITY
            pg_creation_l[g] = min((_t(p.meta.creation_timestamp) for p in mem), default=NAN)
            pg_implicit_l[g] = key in implicit
            if key in missing:
                set_problem(g, "PodGroupDoesNotExist", f"podgroup {key} does not exist")
        if queue_name is None:
            queue_name = next((q for q in (pods[i].queue for i in idx) if q), None) or default_queue
        q = q_index.get(queue_name, -1)
        pg_queue_l[g] = q
        if q < 0:
            set_problem(g, "QueueDoesNotExist", f"queue {queue_name!r} does not exist")
        elif not q_leaf_l[q]:
            set_problem(g, "QueueIsNotLeaf", f"queue {queue_name!r} has child queues; only leaf queues hold work")
    pg_queue = np.array(pg_queue_l, dtype=np.int32)
    pg_min = np.array(pg_min_l, dtype=np.int32)
    pg_prio = np.array(pg_prio_l, dtype=np.int32)
    pg_preempt = np.array(pg_preempt_l, dtype=bool)
    pg_creation = np.array(pg_creation_l, dtype=np.float64)
    pg_last_start = np.array(pg_last_l, dtype=np.float64)
    pg_stale = np.array(pg_stale_l, dtype=np.float64)
    pg_implicit = np.array(pg_implicit_l, dtype=bool)
    pg_topo = np.array(pg_topo_l, dtype=np.int32)
    pg_req_lvl = np.array(pg_req_l, dtype=np.int32)
    pg_pref_lvl = np.array(pg_pref_l, dtype=np.int32)

    # -- per-pod arrays --------------------------------------------------------------------------------------------
    pod_status = np.array(status, dtype=np.int8)
    pod_node = np.array(node_l, dtype=np.int32)
    pod_req = np.zeros((P, R), dtype=np.int64)
    if P:
        pod_req[:, R_CPU] = cpu_l
        pod_req[:, R_MEM] = mem_l
        pod_req[:, R_GPU] = gpu_l
        pod_req[:, R_PODS] = npods_l
    for i, c, v in extra:
        pod_req[i, c] = v
    pod_whole = np.array(whole_l, dtype=np.int32)
    pod_frac = np.array(frac_l, dtype=np.int32)
    pod_mem = np.array(gmem_l, dtype=np.int64)
    pod_ndev = np.array(ndev_l, dtype=np.int32)
    pod_sig = np.array(sig_l, dtype=np.int32)
    pod_prio = np.array(prio_l, dtype=np.int32)
    pod_creation = np.array(creation_l, dtype=np.float64)
    pod_start = np.array(start_l, dtype=np.float64)
    pod_pg = np.full(P, -1, dtype=np.int32)
    if members:
        lens = np.fromiter((len(idx) for idx in members.values()), dtype=np.int64, count=len(members))
        flat = np.fromiter(chain.from_iterable(members.values()), dtype=np.int64, count=int(lens.sum()))
        pod_pg[flat] = np.repeat(np.fromiter((pg_index[k] for k in members), dtype=np.int64, count=len(members)),
                                 lens)
    pod_sg = np.full(P, -1, dtype=np.int32)
    for i in with_subgroup:
        pod = pods[i]
        sgi = sg_lookup.get((int(pod_pg[i]), pod.subgroup), -1)  # type: ignore[arg-type]
        if sgi < 0 and pod_pg[i] >= 0 and not pg_implicit[pod_pg[i]]:
            warnings.append(f"Pod {pod.key}: subgroup {pod.subgroup!r} is not declared by its podgroup")
        pod_sg[i] = sgi

    # group membership CSR (pods of each group in task order: priority desc, then creation, then name)
    pg_pod_start = np.zeros(G + 1, dtype=np.int64)
    counts = np.bincount(pod_pg[pod_pg >= 0], minlength=G) if G else np.zeros(0, dtype=np.int64)
    np.cumsum(counts, out=pg_pod_start[1:])
    ours_idx = np.nonzero(pod_pg >= 0)[0]
    order = np.lexsort((ours_idx, np.nan_to_num(pod_creation[ours_idx], nan=np.inf), -pod_prio[ours_idx],
                        pod_pg[ours_idx]))
    pg_pods = ours_idx[order].astype(np.int64)

    # -- node usage and GPU devices --------------------------------------------------------------------------------
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
        dev_start=dev_start, node_gpu_mem_mib=node_gpu_mem, holders=holders, pod_node=pod_node,
        releasing=releasing, whole=pod_whole, frac=pod_frac, mem=pod_mem, ndev=pod_ndev, explicit=explicit,
        groups=gpu_groups, n_pods=P, pod_name=lambda i: pods[i].key, node_name=lambda n: node_names[n],
        pipelined=pipelined)
    warnings.extend(dev_warn)
    if N:
        # GPU usage per node from the devices (gpu-memory pods are converted there)
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

    by_mem = np.flatnonzero((pod_mem > 0) & pod_ours & (pod_status == PodStatus.PENDING))
    if len(by_mem):
        warnings.extend(gpu_memory_warnings([pods[i].key for i in by_mem.tolist()], pod_mem[by_mem],
                                            node_gpu_mem_known, node_gpu_mem))

    # -- node classes: nodes that every pod signature treats alike ------------------------------------------------
    node_class = _node_classes(snapshot, sigs, topologies)

    return ClusterState(
        now=now, resources=resources,
        node_names=node_names, node_alloc=node_alloc, node_used=node_used, node_releasing=node_rel,
        node_pipelined=node_pipe,
        node_ok=node_ok, node_gpu_mem_mib=node_gpu_mem, node_gpu_mem_known=node_gpu_mem_known,
        node_labels=[n.labels for n in snapshot.nodes],
        node_taints=[n.taints for n in snapshot.nodes], node_class=node_class,
        dev_start=dev_start, dev_used=dev_used, dev_releasing=dev_rel, dev_pipelined=dev_pipe,
        pods=pods, pod_status=pod_status, pod_ours=pod_ours, pod_node=pod_node, pod_req=pod_req,
        pod_gpu_whole=pod_whole, pod_gpu_frac=pod_frac, pod_gpu_mem=pod_mem, pod_gpu_ndev=pod_ndev,
        pod_dev_start=pod_dev_start, pod_dev=pod_dev, pod_pg=pod_pg, pod_sg=pod_sg, pod_sig=pod_sig,
        pod_priority=pod_prio, pod_creation=pod_creation, pod_start=pod_start, sigs=sigs,
        pg_keys=pg_keys, pg_queue=pg_queue, pg_min_member=pg_min, pg_priority=pg_prio, pg_preemptible=pg_preempt,
        pg_creation=pg_creation, pg_last_start=pg_last_start, pg_stale_since=pg_stale, pg_implicit=pg_implicit,
        pg_pod_start=pg_pod_start, pg_pods=pg_pods, pg_topology=pg_topo, pg_required_level=pg_req_lvl,
        pg_preferred_level=pg_pref_lvl, pg_problem=pg_problem, pg_problem_message=pg_problem_msg,
        sg_pg=np.array(sg_pg, dtype=np.int32), sg_names=sg_names, sg_min_member=np.array(sg_min, dtype=np.int32),
        sg_parent=np.array(sg_parent, dtype=np.int32), sg_topology=np.array(sg_topo, dtype=np.int32),
        sg_required_level=np.array(sg_req, dtype=np.int32), sg_preferred_level=np.array(sg_pref, dtype=np.int32),
        q_names=q_names, q_parent=q_parent, q_priority=q_priority, q_creation=q_creation, q_deserved=q_deserved,
        q_limit=q_limit, q_oqw=q_oqw, q_preempt_min_runtime=q_pre, q_reclaim_min_runtime=q_rec,
        topologies=topologies, warnings=warnings,
    )


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
        domain_names.append(["/".join(k) for k in ids])  # type: ignore[arg-type]
    return TopologyIndex(name=name, levels=levels, domain=domain, domain_names=domain_names)


def _node_classes(snapshot: Snapshot, sigs: list[SchedulingSig], topologies: list[TopologyIndex]) -> np.ndarray:
    keys: set[str] = set()
    by_name = False
    for s in sigs:
        keys.update(k for k, _ in s.node_selector)
        for term in s.node_affinity:
            keys.update(r.key for r in term.match_expressions)
            by_name = by_name or bool(term.match_fields)
    key_list = sorted(keys)
    ids: dict[tuple, int] = {}
    out = np.zeros(len(snapshot.nodes), dtype=np.int32)
    for i, node in enumerate(snapshot.nodes):
        labels = node.labels
        k = (tuple(labels.get(x) for x in key_list), node.taints, node.name if by_name else None)
        out[i] = ids.setdefault(k, len(ids))
    return out

