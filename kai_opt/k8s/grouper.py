"""Pod grouper: the PodGroup (scheduling.run.ai/v2alpha2) each of our pods belongs to, derived from its top owner
the way KAI-Scheduler's podgrouper does it, and the calls that make the cluster match.

Pure part (`group_pods`, `desired_podgroups`): for every pod of our scheduler without a user-chosen
`pod-group-name` annotation, walk `metadata.ownerReferences` (the controller reference, else the first one) up
through the kinds in `OWNER_KINDS` (and Pods: an LWS worker's StatefulSet is owned by its leader pod) to the top
owner, then by its kind:

| top owner                      | PodGroup name                     | minMember                                   |
|--------------------------------|-----------------------------------|---------------------------------------------|
| none (bare pod)                | pg-<pod>-<pod uid>                | 1                                           |
| batch Job                      | pg-<pod>-<job uid>                | 1 (one group per pod)                       |
| Deployment/StatefulSet/RS      | pg-<pod>-<pod uid>                | 1 (one group per pod, owned by the pod)     |
| PyTorchJob / TFJob / MPIJob    | pg-<job>-<uid>                    | runPolicy.schedulingPolicy.minAvailable,    |
|                                |                                   | else (PyTorch) elasticPolicy.minReplicas,   |
|                                |                                   | else the sum of replica counts              |
| JobSet (startupPolicyOrder     | pg-<jobset>-<uid>                 | sum over replicatedJobs of                  |
|  AnyOrder, the default)        |                                   | replicas x min(parallelism, completions)    |
| JobSet (InOrder)               | pg-<jobset>-<uid>-<replicatedJob> | that replicatedJob's count                  |
| LeaderWorkerSet                | pg-<lws>-<uid>-group-<index>      | group size (LeaderReady: 1 until workers)   |
| RayCluster                     | pg-<cluster>-<uid>                | 1 head + per worker group (minReplicas, or  |
|                                |                                   | replicas when 0) x numOfHosts               |

An MPIJob with `launcherCreationPolicy: WaitForWorkersReady` leaves the launcher out of minMember until its pod
exists (as KAI does). A walk stops at an owner of a kind not in `OWNER_KINDS` (that kind is not watched: the last
known object is the top owner). A pod whose owner is of a watched kind but not (yet) known to `get_owner` is
deferred, never grouped alone: a gang member grouped as a single pod would be scheduled without its gang.

Queue: label `kai.scheduler/queue` (or the legacy `runai/queue`) on the top owner, else on the pod, else the
default queue. Priority class: the pod's `spec.priorityClassName`, else label `priorityClassName` on the top owner,
else on the pod (RayClusters: label `ray.io/priority-class-name` on the owner wins), else per kind: `inference`
for Deployments, StatefulSets and ReplicaSets, `train` otherwise. Topology: annotations `kai.scheduler/topology`,
`kai.scheduler/topology-required-placement`, `kai.scheduler/topology-preferred-placement` of the top owner (else
the pod). The group inherits the top owner's labels. KAI differences: KAI groups StatefulSets and bare
ReplicaSets per owner (minMember 1) with default class `train`; KAI builds sub-groups for PyTorch/Ray/JobSet.

Pod annotation: KAI's podgrouper writes `pod-group-name` on every pod it groups, and kai-opt does the same
(`annotate_pods`): the snapshot takes a pod's group from that annotation, and the group name (it embeds an owner
uid) cannot be derived by other tools. A pod whose annotation names another group was grouped by its user and is
left alone; one whose annotation names the group computed here is re-grouped every time (so a changed owner,
e.g. scaled replicas, updates minMember). PodGroups are created before their pods are annotated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.api.pod import LEGACY_QUEUE_LABEL, PODGROUP_ANNOTATION, QUEUE_LABEL
from kai_opt.k8s.client import PODGROUP, cluster_error, status_message
from kai_opt.k8s.kinds import OWNER_KINDS  # the owners the cache must watch (kinds.py: no client there)

log = logging.getLogger(__name__)

GetOwner = Callable[[str, str, str, str], "dict[str, Any] | None"]


PRIORITY_LABEL = "priorityClassName"
RAY_PRIORITY_LABEL = "ray.io/priority-class-name"
TOPOLOGY_ANNOTATION = "kai.scheduler/topology"
TOPOLOGY_REQUIRED_ANNOTATION = "kai.scheduler/topology-required-placement"
TOPOLOGY_PREFERRED_ANNOTATION = "kai.scheduler/topology-preferred-placement"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
STATEFULSET_POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
MPI_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
MPI_JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
TRAIN, INFERENCE = "train", "inference"
MAX_NAME = 253  # a PodGroup name is a DNS subdomain
_MAX_DEPTH = 16

_WATCHED = {(api_version.split("/")[0] if "/" in api_version else "", kind)
            for api_version, kind, _ in OWNER_KINDS} | {("", "Pod")}
_PER_POD_INFERENCE = {("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "ReplicaSet")}
_KUBEFLOW_SPECS = {"PyTorchJob": "pytorchReplicaSpecs", "TFJob": "tfReplicaSpecs", "MPIJob": "mpiReplicaSpecs"}


class GroupingError(ValueError):
    """An owner whose spec does not give a valid group (its pods are not grouped; one line)."""


@dataclass
class Grouping:
    """What `group_pods` found: the PodGroups our pods need, each pod's group, and the pods it could not group."""

    podgroups: list[dict[str, Any]] = field(default_factory=list)
    assignments: dict[str, str] = field(default_factory=dict)  # "namespace/pod" -> PodGroup name
    annotated: dict[str, str | None] = field(default_factory=dict)  # "namespace/pod" -> its pod-group-name
    # annotation, for the pods in `assignments`
    deferred: list[str] = field(default_factory=list)  # "namespace/pod": an owner not known yet
    errors: list[str] = field(default_factory=list)  # one line each: an owner spec without a valid group
    unbound: list[tuple[str, str | None]] = field(default_factory=list)  # ("namespace/pod", its pod-group-name
    # annotation) of every unbound pod that is not finished


# -- small accessors ---------------------------------------------------------------------------------------------------
def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return _meta(obj).get("labels") or {}


def _annotations(obj: dict[str, Any]) -> dict[str, str]:
    return _meta(obj).get("annotations") or {}


def _group(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def _gk(obj: dict[str, Any]) -> tuple[str, str]:
    return _group(str(obj.get("apiVersion", "v1"))), str(obj.get("kind", "Pod"))


def _pod_key(pod: dict[str, Any]) -> str:
    return f"{_meta(pod).get('namespace') or 'default'}/{_meta(pod).get('name')}"


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool) or value is None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _nested(obj: dict[str, Any], *path: str) -> Any:
    cur: Any = obj
    for p in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return cur


def podgroup_name(base: str, uid: str, suffix: str = "") -> str:
    """`pg-<base>-<uid>[-<suffix>]`, with `base` shortened when the whole would exceed a DNS subdomain."""
    tail = f"-{uid}" + (f"-{suffix}" if suffix else "")
    room = MAX_NAME - len("pg-") - len(tail)
    return f"pg-{base[:max(room, 1)].rstrip('-.')}{tail}"


# -- the owner walk ------------------------------------------------------------------------------------------------
class _Deferred(Exception):
    """An owner of a watched kind is not known (yet)."""


def top_owner(pod: dict[str, Any], get_owner: GetOwner, memo: GroupMemo | None = None) -> dict[str, Any]:
    """The highest object above `pod` reachable through watched kinds (the pod itself when it has none).
    Raises `_Deferred` when an owner of a watched kind is not known to `get_owner`."""
    cur = pod
    ns = _meta(pod).get("namespace") or "default"
    for _ in range(_MAX_DEPTH):
        refs = [r for r in (_meta(cur).get("ownerReferences") or []) if isinstance(r, dict)]
        ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
        if ref is None:
            return cur
        api_version, kind, name = str(ref.get("apiVersion", "")), str(ref.get("kind", "")), str(ref.get("name", ""))
        if (_group(api_version), kind) not in _WATCHED:
            return cur
        owner = get_owner(api_version, kind, ns, name)
        if owner is None:
            raise _Deferred(f"{kind} {ns}/{name}")
        if ref.get("uid") and _meta(owner).get("uid") and ref["uid"] != _meta(owner)["uid"]:
            raise _Deferred(f"{kind} {ns}/{name} (uid changed)")  # an old owner's pod: wait for the cache
        cur = memo.typed(owner, api_version, kind) if memo is not None else \
            {**owner, "apiVersion": owner.get("apiVersion") or api_version, "kind": owner.get("kind") or kind}
    return cur


# -- per-kind rules ------------------------------------------------------------------------------------------------
@dataclass
class _Group:
    """One PodGroup being built: where it comes from and the pods in it."""

    name: str
    namespace: str
    owner: dict[str, Any]  # the object the PodGroup is owned by (garbage-collected with)
    top: dict[str, Any]
    min_member: int
    default_priority: str
    pods: list[dict[str, Any]] = field(default_factory=list)
    lws_leader_ready: int | None = None  # LeaderReady LWS: the group size once workers exist


def _kubeflow_min_member(top: dict[str, Any]) -> int:
    kind = str(top.get("kind"))
    spec = top.get("spec") or {}
    min_available = _nested(spec, "runPolicy", "schedulingPolicy", "minAvailable")
    if min_available is not None:
        value = _int(min_available, 0)
    elif kind == "PyTorchJob" and _nested(spec, "elasticPolicy", "minReplicas") is not None:
        value = _int(_nested(spec, "elasticPolicy", "minReplicas"), 0)
    else:
        replica_specs = spec.get(_KUBEFLOW_SPECS[kind]) or {}
        if not isinstance(replica_specs, dict) or not replica_specs:
            raise GroupingError(f"spec.{_KUBEFLOW_SPECS[kind]} is missing or empty")
        value = sum(_int((rs or {}).get("replicas"), 1) for rs in replica_specs.values() if isinstance(rs, dict))
    if value < 1:
        raise GroupingError(f"minimum number of pods must be at least 1, got {value}")
    return value


def _mpi_launcher_wait(top: dict[str, Any], pods: Iterable[dict[str, Any]]) -> int:
    """Launcher replicas to leave out while a WaitForWorkersReady launcher does not exist yet."""
    spec = top.get("spec") or {}
    if top.get("kind") != "MPIJob" or spec.get("launcherCreationPolicy") != "WaitForWorkersReady":
        return 0
    if _nested(spec, "runPolicy", "schedulingPolicy", "minAvailable") is not None:
        return 0
    name = _meta(top).get("name")
    for pod in pods:
        labels = _labels(pod)
        if (labels.get(MPI_JOB_NAME_LABEL) == name and labels.get(MPI_JOB_ROLE_LABEL) == "launcher"
                and not _meta(pod).get("deletionTimestamp")):
            return 0
    return _int(_nested(spec, "mpiReplicaSpecs", "Launcher", "replicas"), 1)


def _replicated_job_count(rj: dict[str, Any]) -> int:
    replicas = max(_int(rj.get("replicas"), 1), 1)
    job_spec = _nested(rj, "template", "spec") or {}
    parallelism = max(_int(job_spec.get("parallelism"), 1), 1)
    completions = _int(job_spec.get("completions"), 0)
    if 0 < completions < parallelism:
        parallelism = completions
    return replicas * parallelism


def _jobset(top: dict[str, Any], pod: dict[str, Any]) -> tuple[str, int]:
    meta = _meta(top)
    rjs = [rj for rj in (_nested(top, "spec", "replicatedJobs") or []) if isinstance(rj, dict)]
    if not rjs:
        raise GroupingError("spec.replicatedJobs is missing or empty")
    order = _nested(top, "spec", "startupPolicy", "startupPolicyOrder") or "AnyOrder"
    if order == "InOrder":
        rj_name = _labels(pod).get("jobset.sigs.k8s.io/replicatedjob-name")
        rj = next((r for r in rjs if r.get("name") == rj_name), None)
        if rj is None:
            raise GroupingError(f"pod {_pod_key(pod)} names no replicatedJob of the JobSet "
                                f"(label jobset.sigs.k8s.io/replicatedjob-name={rj_name!r})")
        return podgroup_name(meta["name"], meta.get("uid", ""), str(rj_name)), _replicated_job_count(rj)
    return podgroup_name(meta["name"], meta.get("uid", "")), sum(_replicated_job_count(r) for r in rjs)


def _lws(top: dict[str, Any], pod: dict[str, Any]) -> tuple[str, int, bool]:
    """(name, group size, LeaderReady policy) of the LWS group `pod` is in."""
    meta = _meta(top)
    labels = _labels(pod)
    index = labels.get(LWS_GROUP_INDEX_LABEL)
    if index is None and labels.get(LWS_WORKER_INDEX_LABEL, "0") == "0":
        index = labels.get(STATEFULSET_POD_INDEX_LABEL)  # a leader: its StatefulSet ordinal is its group
    if index is None or not str(index).isdigit():
        raise GroupingError(f"pod {_pod_key(pod)} has no {LWS_GROUP_INDEX_LABEL} label")
    size = _int(_annotations(pod).get(LWS_SIZE_ANNOTATION), 0) or _int(
        _nested(top, "spec", "leaderWorkerTemplate", "size"), 1)
    if size < 1:
        raise GroupingError(f"group size must be at least 1, got {size}")
    leader_ready = _nested(top, "spec", "startupPolicy") == "LeaderReady"
    return podgroup_name(meta["name"], meta.get("uid", ""), f"group-{index}"), size, leader_ready


def _ray_min_member(top: dict[str, Any]) -> int:
    total = 1  # the head
    for i, g in enumerate(_nested(top, "spec", "workerGroupSpecs") or []):
        if not isinstance(g, dict) or g.get("suspended") is True:
            continue
        replicas, minimum = _int(g.get("replicas"), 0), _int(g.get("minReplicas"), 0)
        if minimum > replicas:
            raise GroupingError(f"workerGroupSpecs[{i}]: minReplicas {minimum} exceeds replicas {replicas}")
        hosts = max(_int(g.get("numOfHosts"), 1), 1)
        total += (minimum if minimum > 0 else replicas) * hosts
    return total


def _group_for(pod: dict[str, Any], top: dict[str, Any]) -> _Group:
    """The group `pod` belongs to, given its top owner (raises `GroupingError`)."""
    pmeta, tmeta = _meta(pod), _meta(top)
    ns = pmeta.get("namespace") or "default"
    gk = _gk(top)
    pod_ref = {"apiVersion": "v1", "kind": "Pod", "metadata": pmeta}
    uid = tmeta.get("uid", "")
    if top is pod:  # a bare pod, or one whose owner is of a kind that is not watched
        return _Group(podgroup_name(pmeta["name"], pmeta.get("uid", "")), ns, pod_ref, top, 1, TRAIN)
    if gk in _PER_POD_INFERENCE:
        return _Group(podgroup_name(pmeta["name"], pmeta.get("uid", "")), ns, pod_ref, top, 1, INFERENCE)
    if gk == ("", "Pod"):
        return _Group(podgroup_name(tmeta["name"], uid), ns, top, top, 1, TRAIN)
    if gk == ("batch", "Job"):
        return _Group(podgroup_name(pmeta["name"], uid), ns, top, top, 1, TRAIN)
    if gk[0] == "kubeflow.org" and gk[1] in _KUBEFLOW_SPECS:
        return _Group(podgroup_name(tmeta["name"], uid), ns, top, top, _kubeflow_min_member(top), TRAIN)
    if gk == ("jobset.x-k8s.io", "JobSet"):
        name, size = _jobset(top, pod)
        return _Group(name, ns, top, top, size, TRAIN)
    if gk == ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"):
        name, size, leader_ready = _lws(top, pod)
        return _Group(name, ns, top, top, size, TRAIN, lws_leader_ready=size if leader_ready else None)
    if gk == ("ray.io", "RayCluster"):
        return _Group(podgroup_name(tmeta["name"], uid), ns, top, top, _ray_min_member(top), TRAIN)
    return _Group(podgroup_name(tmeta["name"], uid), ns, top, top, 1, TRAIN)  # pragma: no cover (all watched)


# -- the PodGroup object ---------------------------------------------------------------------------------------------
def _queue(top: dict[str, Any], pod: dict[str, Any], default_queue: str) -> str:
    for labels in (_labels(top), _labels(pod)):
        for key in (QUEUE_LABEL, LEGACY_QUEUE_LABEL):
            if labels.get(key):
                return labels[key]
    return default_queue


def _priority(top: dict[str, Any], pod: dict[str, Any], default: str) -> str:
    if _gk(top) == ("ray.io", "RayCluster") and _labels(top).get(RAY_PRIORITY_LABEL):
        return _labels(top)[RAY_PRIORITY_LABEL]
    spec_pc = (pod.get("spec") or {}).get("priorityClassName")
    if spec_pc:
        return str(spec_pc)
    for labels in (_labels(top), _labels(pod)):
        if labels.get(PRIORITY_LABEL):
            return labels[PRIORITY_LABEL]
    return default


def _topology(top: dict[str, Any], pod: dict[str, Any]) -> dict[str, str] | None:
    for ann in (_annotations(top), _annotations(pod)):
        topo = ann.get(TOPOLOGY_ANNOTATION)
        req, pref = ann.get(TOPOLOGY_REQUIRED_ANNOTATION), ann.get(TOPOLOGY_PREFERRED_ANNOTATION)
        if topo or req or pref:
            out = {"topology": topo, "requiredTopologyLevel": req, "preferredTopologyLevel": pref}
            return {k: v for k, v in out.items() if v}
    return None


def _podgroup(group: _Group, default_queue: str) -> dict[str, Any]:
    pod, top = group.pods[0], group.top
    ometa = _meta(group.owner)
    owner_ref = {"apiVersion": group.owner.get("apiVersion", "v1"), "kind": group.owner.get("kind", "Pod"),
                 "name": ometa.get("name"), "uid": ometa.get("uid", "")}
    min_member = group.min_member
    if group.lws_leader_ready is not None:  # LeaderReady: workers appear once the leader runs
        only_pending_leaders = all(_labels(p).get(LWS_WORKER_INDEX_LABEL, "0") == "0"
                                   and not (p.get("spec") or {}).get("nodeName") for p in group.pods)
        min_member = 1 if only_pending_leaders else group.lws_leader_ready
    min_member -= _mpi_launcher_wait(top, group.pods)
    spec: dict[str, Any] = {"minMember": max(min_member, 1), "queue": _queue(top, pod, default_queue),
                            "priorityClassName": _priority(top, pod, group.default_priority)}
    topology = _topology(top, pod)
    if topology:
        spec["topologyConstraint"] = topology
    meta: dict[str, Any] = {"name": group.name, "namespace": group.namespace}
    if _labels(top):
        meta["labels"] = dict(_labels(top))
    if owner_ref["uid"]:  # an ownerReference needs the uid; objects from the API always have one
        meta["ownerReferences"] = [owner_ref]
    return {"apiVersion": PODGROUP.api_version, "kind": PODGROUP.kind, "metadata": meta, "spec": spec}


class GroupMemo:
    """What `group_pods` worked out for objects that did not change since its last call, so the pass over a steady
    cluster costs a lookup per pod. Entries are keyed by `id()` and hold the object they were made from; an entry is
    used only while that object is the one passed again (a reused id never matches), and entries not used in a call
    are dropped at its end."""

    def __init__(self) -> None:
        self._pods: dict[int, tuple[Any, ...]] = {}
        self._tops: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
        self._next_pods: dict[int, tuple[Any, ...]] = {}
        self._next_tops: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def begin(self) -> None:
        self._next_pods, self._next_tops = {}, {}

    def end(self) -> None:
        self._pods, self._tops = self._next_pods, self._next_tops
        self._next_pods, self._next_tops = {}, {}

    def typed(self, owner: dict[str, Any], api_version: str, kind: str) -> dict[str, Any]:
        """`owner` with apiVersion and kind set (list items lack them), the same copy while `owner` is the same."""
        e = self._tops.get(id(owner)) or self._next_tops.get(id(owner))
        if e is None or e[0] is not owner:
            e = (owner, {**owner, "apiVersion": owner.get("apiVersion") or api_version,
                         "kind": owner.get("kind") or kind})
        self._next_tops[id(owner)] = e
        return e[1]


def group_pods(pods: list[dict[str, Any]], get_owner: GetOwner, default_queue: str,
               memo: GroupMemo | None = None) -> Grouping:
    """Group our pods (the caller passes only pods of our scheduler). Finished pods and pods whose
    `pod-group-name` annotation names a group of the user's own are skipped. With a `memo` kept across calls, an
    unchanged pod whose top owner is unchanged reuses its outcome."""
    out = Grouping()
    groups: dict[tuple[str, str], _Group] = {}
    tops: dict[str, dict[str, Any]] = {}  # owner uid -> top owner (one walk per owner)
    memo = memo or GroupMemo()
    memo.begin()
    old, new = memo._pods, memo._next_pods
    for pod in pods:
        e = old.get(id(pod))
        if e is None or e[0] is not pod:
            meta = _meta(pod)
            if not meta.get("name") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                new[id(pod)] = e = (pod, None, None, None, None, False)
                continue
            e = (pod, _pod_key(pod), _annotations(pod).get(PODGROUP_ANNOTATION), None, None,
                 not (pod.get("spec") or {}).get("nodeName"))
        key, annotated = e[1], e[2]
        if key is None:  # finished, or no name
            new[id(pod)] = e
            continue
        if e[5]:
            out.unbound.append((key, annotated))
        try:  # an unchanged pod that was its own top owner still is (its ownerReferences are the same)
            top = pod if e[3] is pod else _cached_top(pod, get_owner, tops, memo)
        except _Deferred as exc:
            if not annotated:
                out.deferred.append(key)
                log.debug("pod %s not grouped yet: owner %s not known", key, exc)
            continue
        if e[3] is not top:
            try:
                outcome: _Group | str = _group_for(pod, top)
            except GroupingError as exc:
                outcome = f"pod {key}: {_describe(top)}: {exc}"
            e = (pod, key, annotated, top, outcome, e[5])
        new[id(pod)] = e
        outcome = e[4]
        if isinstance(outcome, str):
            if not annotated:
                out.errors.append(outcome)
            continue
        if annotated and annotated != outcome.name:
            continue  # the user's own group
        known = groups.get((outcome.namespace, outcome.name))
        if known is None:
            known = groups[(outcome.namespace, outcome.name)] = replace(outcome, pods=[])
        known.pods.append(pod)
        out.assignments[key] = outcome.name
        out.annotated[key] = annotated
    memo.end()
    out.podgroups = [_podgroup(g, default_queue) for g in groups.values()]
    return out


def _cached_top(pod: dict[str, Any], get_owner: GetOwner, tops: dict[str, dict[str, Any]],
                memo: GroupMemo | None = None) -> dict[str, Any]:
    refs = _meta(pod).get("ownerReferences") or []
    if not refs:
        return pod
    ref = next((r for r in refs if isinstance(r, dict) and r.get("controller")), refs[0] if refs else None)
    uid = ref.get("uid") if isinstance(ref, dict) else None
    if uid and uid in tops:
        return tops[uid]
    top = top_owner(pod, get_owner, memo)
    if uid and top is not pod:
        tops[uid] = top
    return top


def _describe(obj: dict[str, Any]) -> str:
    meta = _meta(obj)
    return f"{obj.get('kind', 'Pod')} {meta.get('namespace') or 'default'}/{meta.get('name')}"


def desired_podgroups(pods: list[dict[str, Any]], get_owner: GetOwner, default_queue: str) -> list[dict[str, Any]]:
    """The PodGroups our pods need (see the module docstring); `group_pods` also gives each pod's group."""
    return group_pods(pods, get_owner, default_queue).podgroups


# -- making the cluster match ------------------------------------------------------------------------------------------
def _changes(want: dict[str, Any], have: dict[str, Any]) -> dict[str, Any]:
    """The spec fields of `want` that `have` differs in (only minMember and queue are kept up to date)."""
    ws, hs = want.get("spec") or {}, have.get("spec") or {}
    return {k: ws[k] for k in ("minMember", "queue") if k in ws and ws[k] != hs.get(k)}


def sync_podgroups(api: client.ApiClient, desired: list[dict[str, Any]], existing: list[dict[str, Any]], *,
                   workers: int = 8) -> None:
    """Create the desired PodGroups that do not exist and patch those whose minMember or queue changed;
    idempotent. A request the server refuses is logged and skipped (the next cycle retries); an unreachable
    server raises `ClusterError`."""
    have = {(_meta(pg).get("namespace") or "default", _meta(pg).get("name")): pg for pg in existing}
    co = client.CustomObjectsApi(api)
    todo: list[Callable[[], None]] = []
    for pg in desired:
        ns, name = _meta(pg).get("namespace") or "default", _meta(pg)["name"]
        call = sync_call(co, pg, ns, name, have.get((ns, name)))
        if call is not None:
            todo.append(call)
    _run(todo, workers, api, "sync podgroups")


def sync_call(co: client.CustomObjectsApi, pg: dict[str, Any], ns: str, name: str,
              current: dict[str, Any] | None) -> Callable[[], None] | None:
    """The request that makes the existing PodGroup `current` (None: there is none) match the desired `pg`;
    None when it already does."""
    if current is None:
        return lambda: _create(co, ns, pg)
    patch = _changes(pg, current)
    return (lambda: _patch(co, ns, name, patch)) if patch else None


def run_calls(todo: list[Callable[[], None]], api: client.ApiClient, what: str, *, workers: int = 8) -> None:
    """Run API calls on up to `workers` threads; an unreachable server raises `ClusterError`."""
    _run(todo, workers, api, what)


def _create(co: client.CustomObjectsApi, ns: str, pg: dict[str, Any]) -> None:
    try:
        co.create_namespaced_custom_object(PODGROUP.group, PODGROUP.version, ns, PODGROUP.plural, pg)
    except ApiException as exc:
        if exc.status == 409:  # created meanwhile (another cycle, or the user): the next sync compares it
            return
        log.warning("create PodGroup %s/%s: %s %s", ns, _meta(pg)["name"], exc.status, status_message(exc))


def _patch(co: client.CustomObjectsApi, ns: str, name: str, patch: dict[str, Any]) -> None:
    try:  # a dict body is sent as a JSON merge patch
        co.patch_namespaced_custom_object(PODGROUP.group, PODGROUP.version, ns, PODGROUP.plural, name,
                                          {"spec": patch})
    except ApiException as exc:
        if exc.status != 404:  # deleted meanwhile: recreated next cycle
            log.warning("patch PodGroup %s/%s: %s %s", ns, name, exc.status, status_message(exc))


def annotate_pods(api: client.ApiClient, pods: list[dict[str, Any]], assignments: dict[str, str], *,
                  workers: int = 8) -> int:
    """Write `pod-group-name` on each assigned pod that does not carry it yet; returns the number patched.
    Call after `sync_podgroups`, so a pod never names a group that does not exist."""
    v1 = client.CoreV1Api(api)
    todo: list[Callable[[], None]] = []
    for pod in pods:
        key = _pod_key(pod)
        name = assignments.get(key)
        if name is None or _annotations(pod).get(PODGROUP_ANNOTATION) == name:
            continue
        ns, pod_name = key.split("/", 1)
        todo.append(lambda ns=ns, pod_name=pod_name, name=name: _annotate(v1, ns, pod_name, name))
    _run(todo, workers, api, "annotate pods")
    return len(todo)


def _annotate(v1: client.CoreV1Api, ns: str, name: str, group: str) -> None:
    try:
        v1.patch_namespaced_pod(name, ns, {"metadata": {"annotations": {PODGROUP_ANNOTATION: group}}})
    except ApiException as exc:
        if exc.status != 404:  # the pod is gone
            log.warning("annotate pod %s/%s: %s %s", ns, name, exc.status, status_message(exc))


def _run(todo: list[Callable[[], None]], workers: int, api: client.ApiClient, what: str) -> None:
    try:
        if len(todo) <= 1 or workers <= 1:
            for call in todo:
                call()
            return
        with ThreadPoolExecutor(max_workers=min(workers, len(todo))) as pool:
            for future in [pool.submit(call) for call in todo]:
                future.result()
    except urllib3.exceptions.HTTPError as exc:
        raise cluster_error(exc, what, api) from exc
