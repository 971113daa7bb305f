"""Snapshot -> ClusterState."""

from __future__ import annotations

import time

import numpy as np

from kai_opt.api import DEFAULT_PRIORITY_CLASSES, Pod, PodGroup
from kai_opt.api.priorityclass import NON_PREEMPTIBLE_PRIORITY
from kai_opt.api.queue import QUEUE_RESOURCES
from kai_opt.snapshot import Snapshot
from kai_opt.state.cluster import ClusterState, PodStatus, SchedulingSig, TopologyIndex
from kai_opt.state.gpu import assign_devices
from kai_opt.state.resources import R_CPU, R_GPU, R_MEM, R_PODS, resource_axis
from kai_opt.units import GPU_RESOURCE, gpu_milli_from_fraction

DEFAULT_QUEUE = "default-queue"
NAN = float("nan")


def build_state(snapshot: Snapshot, *, now: float | None = None, default_queue: str = DEFAULT_QUEUE) -> ClusterState:
    now = now if now is not None else (snapshot.now if snapshot.now is not None else time.time())
    ours_names = set(snapshot.scheduler_names)
    warnings: list[str] = [str(w) for w in snapshot.warnings]

    # -- resources -------------------------------------------------------------------------------------------------
    names: set[str] = set()
    for node in snapshot.nodes:
        names.update(node.allocatable)
    live_pods = [p for p in snapshot.pods if not p.finished]
    for pod in live_pods:
        names.update(pod.requests)
    resources = resource_axis(names)
    col = {r: i for i, r in enumerate(resources)}
    R = len(resources)

    # -- nodes -----------------------------------------------------------------------------------------------------
    N = len(snapshot.nodes)
    node_names = [n.name for n in snapshot.nodes]
    node_index = {n: i for i, n in enumerate(node_names)}
    node_alloc = np.zeros((N, R), dtype=np.int64)
    for i, node in enumerate(snapshot.nodes):
        for r, v in node.allocatable.items():
            node_alloc[i, col[r]] = v
    node_ok = np.array([n.ready and not n.unschedulable for n in snapshot.nodes], dtype=bool)
    node_gpu_mem = np.array([n.gpu_memory_mib if n.gpus else 0 for n in snapshot.nodes], dtype=np.int64)
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

    # -- pods: keep those that matter, decide status ---------------------------------------------------------------
    pods: list[Pod] = []
    status: list[int] = []
    for pod in live_pods:
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

    # -- podgroups: declared ones, placeholders for missing ones, implicit ones for lone pods ----------------------
    declared: dict[str, PodGroup] = {g.key: g for g in snapshot.podgroups}
    members: dict[str, list[int]] = {}
    implicit: set[str] = set()
    missing: set[str] = set()
    pod_ours = np.zeros(P, dtype=bool)
    for i, pod in enumerate(pods):
        if pod.scheduler_name not in ours_names:
            continue
        pod_ours[i] = True
        if pod.podgroup:
            key = f"{pod.namespace}/{pod.podgroup}"
            if key not in declared:
                missing.add(key)
        else:
            key = f"{pod.namespace}/pg-{pod.name}"
            while key in declared:
                key += "-implicit"
            implicit.add(key)
        members.setdefault(key, []).append(i)
    pg_keys = [g.key for g in snapshot.podgroups] + sorted(k for k in members if k not in declared)
    G = len(pg_keys)
    pg_index = {k: i for i, k in enumerate(pg_keys)}
    pg_queue = np.full(G, -1, dtype=np.int32)
    pg_min = np.ones(G, dtype=np.int32)
    pg_prio = np.zeros(G, dtype=np.int32)
    pg_preempt = np.zeros(G, dtype=bool)
    pg_creation = np.full(G, NAN)
    pg_last_start = np.full(G, NAN)
    pg_stale = np.full(G, NAN)
    pg_implicit = np.zeros(G, dtype=bool)
    pg_topo = np.full(G, -1, dtype=np.int32)
    pg_req_lvl = np.full(G, -1, dtype=np.int32)
    pg_pref_lvl = np.full(G, -1, dtype=np.int32)
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

    for g, key in enumerate(pg_keys):
        mem = [pods[i] for i in members.get(key, [])]
        spec = declared.get(key)
        queue_name: str | None = None
        if spec is not None:
            pg_min[g] = spec.min_member
            queue_name = spec.queue
            pg_prio[g] = priority_of(spec.priority_class_name, mem)
            pg_preempt[g] = (spec.preemptibility == "preemptible") if spec.preemptibility else \
                pg_prio[g] < NON_PREEMPTIBLE_PRIORITY
            pg_creation[g] = _t(spec.meta.creation_timestamp)
            pg_last_start[g] = _t(spec.last_start)
            pg_stale[g] = _t(spec.stale_since)
            pg_topo[g], pg_req_lvl[g], pg_pref_lvl[g] = topo_of(spec.topology_constraint, g, "topologyConstraint")
            for sg in spec.sub_groups:
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
            pg_min[g] = 1 if key in implicit else max(1, len(mem))
            pg_prio[g] = priority_of(None, mem)
            pg_preempt[g] = pg_prio[g] < NON_PREEMPTIBLE_PRIORITY
            pg_creation[g] = min((_t(p.meta.creation_timestamp) for p in mem), default=NAN)
            pg_implicit[g] = key in implicit
            if key in missing:
                set_problem(g, "PodGroupDoesNotExist", f"podgroup {key} does not exist")
        if queue_name is None:
            queue_name = next((p.queue for p in mem if p.queue), None) or default_queue
        q = q_index.get(queue_name, -1)
        pg_queue[g] = q
        if q < 0:
            set_problem(g, "QueueDoesNotExist", f"queue {queue_name!r} does not exist")
        elif not q_leaf[q]:
            set_problem(g, "QueueIsNotLeaf", f"queue {queue_name!r} has child queues; only leaf queues hold work")

    # -- per-pod arrays --------------------------------------------------------------------------------------------
    pod_status = np.array(status, dtype=np.int8)
    pod_node = np.full(P, -1, dtype=np.int32)
    pod_req = np.zeros((P, R), dtype=np.int64)
    pod_whole = np.zeros(P, dtype=np.int32)
    pod_frac = np.zeros(P, dtype=np.int32)
    pod_mem = np.zeros(P, dtype=np.int64)
    pod_ndev = np.ones(P, dtype=np.int32)
    pod_pg = np.full(P, -1, dtype=np.int32)
    pod_sg = np.full(P, -1, dtype=np.int32)
    pod_sig = np.zeros(P, dtype=np.int32)
    pod_prio = np.zeros(P, dtype=np.int32)
    pod_creation = np.full(P, NAN)
    pod_start = np.full(P, NAN)
    sig_ids: dict[tuple, int] = {}
    sigs: list[SchedulingSig] = []
    explicit: dict[int, tuple[int, ...]] = {}
    gpu_groups: dict[int, str] = {}
    ci_cpu, ci_mem, ci_gpu, ci_pods = R_CPU, R_MEM, R_GPU, R_PODS
    for key, idx in members.items():
        g = pg_index[key]
        for i in idx:
            pod_pg[i] = g
    for i, pod in enumerate(pods):
        if pod.node_name:
            pod_node[i] = node_index[pod.node_name]
        elif status[i] == PodStatus.PIPELINED:
            pod_node[i] = node_index[pod.nominated_node]  # type: ignore[index]
        row = pod_req[i]
        for r, v in pod.requests.items():
            if r == "cpu":
                row[ci_cpu] = v
            elif r == "memory":
                row[ci_mem] = v
            elif r == GPU_RESOURCE:
                row[ci_gpu] = v
                pod_whole[i] = v // 1000
            elif r == "pods":
                row[ci_pods] = v
            else:
                row[col[r]] = v
        if pod.gpu_fraction is not None:
            pod_frac[i] = gpu_milli_from_fraction(pod.gpu_fraction)
            pod_ndev[i] = pod.gpu_fraction_num_devices
            row[ci_gpu] = int(pod_frac[i]) * pod.gpu_fraction_num_devices
        elif pod.gpu_memory_mib is not None:
            pod_mem[i] = pod.gpu_memory_mib
            pod_ndev[i] = pod.gpu_fraction_num_devices
        if pod.gpu_devices is not None:
            explicit[i] = pod.gpu_devices
        if pod.gpu_group:
            gpu_groups[i] = pod.gpu_group
        if pod.priority is not None:
            pod_prio[i] = pod.priority
        if pod.meta.creation_timestamp is not None:
            pod_creation[i] = pod.meta.creation_timestamp
        if pod.start_time is not None:
            pod_start[i] = pod.start_time
        if pod_ours[i]:
            skey = (tuple(sorted(pod.node_selector.items())) if pod.node_selector else (),
                    pod.node_affinity, pod.tolerations)
            s = sig_ids.get(skey)
            if s is None:
                s = sig_ids[skey] = len(sigs)
                sigs.append(SchedulingSig(*skey))
            pod_sig[i] = s
            if pod.subgroup:
                sgi = sg_lookup.get((int(pod_pg[i]), pod.subgroup), -1)
                if sgi < 0 and pod_pg[i] >= 0 and not pg_implicit[pod_pg[i]]:
                    warnings.append(f"Pod {pod.key}: subgroup {pod.subgroup!r} is not declared by its podgroup")
                pod_sg[i] = sgi
    if not sigs:
        sigs.append(SchedulingSig((), (), ()))

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

    # -- node classes: nodes that every pod signature treats alike ------------------------------------------------
    node_class = _node_classes(snapshot, sigs, topologies)

    return ClusterState(
        now=now, resources=resources,
        node_names=node_names, node_alloc=node_alloc, node_used=node_used, node_releasing=node_rel,
        node_pipelined=node_pipe,
        node_ok=node_ok, node_gpu_mem_mib=node_gpu_mem, node_labels=[n.labels for n in snapshot.nodes],
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
    for depth in range(len(levels)):
        keys = levels[: depth + 1]
        ids: dict[tuple[str, ...], int] = {}
        arr = np.full(len(snapshot.nodes), -1, dtype=np.int32)
        for i, node in enumerate(snapshot.nodes):
            vals = tuple(node.labels.get(k) for k in keys)
            if any(v is None for v in vals):
                continue
            arr[i] = ids.setdefault(vals, len(ids))  # type: ignore[arg-type]
        domain.append(arr)
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

