"""KAI-Scheduler behaviour cases (../shared/scenarios/kai, README there) as Kubernetes objects.

A case file describes a cluster the way KAI-Scheduler's Go test harness builds it (nodes, queues, jobs of tasks) plus
what the harness expects after running actions. `load_case` validates the file against a pydantic schema (unknown
keys are errors, so typos in a corpus are caught) and emits the objects a KAI cluster would hold for it, fed through
`Snapshot.from_objects` (strict) at a fixed `CASE_NOW`, so results are deterministic:

- node -> Node: allocatable cpu/memory/pods/`nvidia.com/gpu` (harness defaults from the `defaults` block), labels
  `kai.scheduler/type=<node>`, `nvidia.com/gpu.count`, `nvidia.com/gpu.memory`, MIG labels, then `labels` on top.
- queue -> Queue `scheduling.run.ai/v2` (memory bytes -> MB as the CRD wants), created at now + index minutes.
- job -> PodGroup `scheduling.run.ai/v2alpha2` (minMember, subGroups, topologyConstraint, explicit preemptibility)
  and a PriorityClass `kai-case-prio-<priority>`; created at now - (N - i) minutes after a stable sort by priority
  (descending), as the harness does; `stale_seconds` -> the stale-podgroup annotation.
- task -> Pod `<job>-<index>` (schedulerName `kai-opt`, `pod-group-name` annotation, queue/subgroup labels, one
  container with the per-task requests, GPU sharing annotations); its state decides nodeName / nominatedNodeName /
  phase / deletionTimestamp (Pipelined pods are nominated onto their node, Releasing pods are being deleted).

What cannot be represented (MIG, DRA, custom scheduler configuration, ...) is added to `Case.unsupported`, so a
runner reports the case as skipped instead of wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from kai_opt.actions import KAI_ACTION_NAMES
from kai_opt.api.meta import format_time
from kai_opt.api.node import GPU_MEMORY_LABEL
from kai_opt.api.pod import (
    GPU_FRACTION_ANNOTATION,
    GPU_GROUP_LABEL,
    GPU_MEMORY_ANNOTATION,
    PODGROUP_ANNOTATION,
    QUEUE_LABEL,
    SUBGROUP_LABEL,
)
from kai_opt.api.podgroup import LAST_START_ANNOTATION, STALE_TIMESTAMP_ANNOTATION
from kai_opt.api.queue import MEMORY_MB
from kai_opt.errors import InputError
from kai_opt.loaders.documents import read_documents
from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.units import GPU_RESOURCE

CASE_NOW = 1767225600.0  # 2026-01-01T00:00:00Z: every case describes the cluster at this instant
SCHEDULER_NAME = "kai-opt"
NODE_TYPE_LABEL = "kai.scheduler/type"  # what `node_affinity` matches (harness NodeAffinityKey)
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_ENABLED_LABEL = "node-role.kubernetes.io/mig-enabled"
TASK_ORDER_LABEL = "kai.scheduler/task-priority"  # KAI's taskorder plugin label (kai-opt reads spec.priority)
PRIORITY_CLASS_PREFIX = "kai-case-prio-"
DEFAULT_SUBGROUP = "default"  # the harness's implicit pod set for tasks without a subgroup
GATE_NAME = "kai-opt.io/case-gated"
RUNNING_SINCE_S = 3600.0  # running pods started an hour before now
LAST_START_AGE_S = 60.0  # harness: a group with allocated tasks last started a minute ago
ACTIONS = tuple(KAI_ACTION_NAMES)  # KAI's action names, in cycle order (kai_opt.actions)

Action = Literal[ACTIONS]  # type: ignore[valid-type]
TaskState = Literal["Pending", "Gated", "Allocated", "Pipelined", "Binding", "Bound", "Running", "Releasing",
                    "Succeeded", "Failed", "Unknown", "Deleted"]
BOUND_STATES = frozenset({"Running", "Bound", "Binding", "Allocated"})
ACTIVE_STATES = BOUND_STATES | {"Releasing", "Pipelined"}


# -- file schema ---------------------------------------------------------------------------------------------------
class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceRef(_Spec):
    file: str
    index: int
    test_func: str


class Rounds(_Spec):
    until_match: int = 2
    after_match: int = 5
    sleep_between_rounds_seconds: float | None = None


class Defaults(_Spec):
    node_cpu_millis: float = 20_000_000
    node_memory_bytes: float = 20e9
    node_gpu_memory_mib: int = 100
    node_max_pods: int = 110
    task_cpu_millis: float = 1000
    task_memory_bytes: float = 1e9
    queue_priority: int = 100


class Session(_Spec):
    staleness_grace_period_seconds: float = 0.0


class MigSpec(_Spec):
    strategy: str = ""
    instances: dict[str, int] = {}


class NodeSpec(_Spec):
    gpus: int = 0
    cpu_millis: float | None = None
    memory_bytes: float | None = None
    gpu_memory_mib: int | None = None
    labels: dict[str, str] = {}
    max_pods: int | None = None
    mig: MigSpec | None = None
    gpu_name: str | None = None  # transcribed; no effect in the harness


class QueueGpuSpec(_Spec):
    deserved: float = 0
    limit: float = -1
    over_quota_weight: float = 0


class QueueResourceSpec(_Spec):
    deserved: float = -1
    limit: float = -1


class QueueSpec(_Spec):
    name: str
    parent: str | None = None
    priority: int | None = None
    gpu: QueueGpuSpec = QueueGpuSpec()
    cpu: QueueResourceSpec = QueueResourceSpec()
    memory: QueueResourceSpec = QueueResourceSpec()  # bytes
    department: bool = False
    implicit: bool = False


class PerTaskSpec(_Spec):
    gpus: float = 0
    gpu_memory_mib: int | None = None
    cpu_millis: float | None = None
    memory_bytes: float | None = None


class TopologyConstraintSpec(_Spec):
    topology: str | None = None
    required_level: str | None = None
    preferred_level: str | None = None


class PodSetSpec(_Spec):
    name: str
    min_available: int
    topology_constraint: TopologyConstraintSpec | None = None


class SubGroupSetSpec(_Spec):
    name: str = ""
    topology_constraint: TopologyConstraintSpec | None = None
    pod_sets: list[PodSetSpec] = []
    sub_groups: list[SubGroupSetSpec] = []


class PodAffinitySpec(_Spec):
    labels: dict[str, str] = {}
    affinity_topology_key: str | None = None
    anti_affinity_topology_key: str | None = None


class TaskSpec(_Spec):
    name: str
    state: TaskState
    node: str | None = None
    gpu_groups: list[str] = []
    subgroup: str | None = None
    node_affinity: list[str] = []
    pod_affinity: PodAffinitySpec | None = None
    required_gpus: int | None = None
    priority: int | None = None
    mig: dict[str, int] = {}
    legacy_mig: bool = False
    resource_claims: list[str] = []


class JobSpec(_Spec):
    name: str
    namespace: str | None = None
    queue: str
    priority: int = 0
    preemptibility: Literal["preemptible", "non-preemptible"] | None = None
    preemptibility_explicit: bool = False
    best_effort: bool = False
    stale_seconds: float | None = None
    delete_in_test: bool = False
    per_task: PerTaskSpec = PerTaskSpec()
    min_available: int | None = None
    subgroups: SubGroupSetSpec | None = None
    tasks: list[TaskSpec] = []

    @property
    def effective_preemptibility(self) -> str:
        return self.preemptibility or ("preemptible" if self.priority < 100 else "non-preemptible")


class TopologySpec(_Spec):
    name: str
    levels: list[str]


class ExpectedResult(_Spec):
    """`E`: what the harness checks on every pod of a job, or on one task."""

    status: TaskState
    node: str | None = None
    gpus_required: float = 0
    gpus_accepted: float | None = None
    cpu_millis: float | None = None
    memory: float | None = None
    gpu_groups: list[str] = []
    dont_validate_gpu_groups: bool = False
    error_message: str | None = None
    last_start_older_than_seconds: float | None = None


class NodeResources(_Spec):
    idle_gpus: float
    releasing_gpus: float


class Counts(_Spec):
    """At most this many cache Bind / Evict / TaskPipelined calls per session (0: the call must not happen)."""

    binds: int
    evictions: int
    pipelined: int


class Expected(_Spec):
    jobs: dict[str, ExpectedResult] = {}
    tasks: dict[str, ExpectedResult] = {}
    unmatched_tasks: dict[str, ExpectedResult] = {}  # keys naming no task: never checked by the harness
    node_resources: dict[str, NodeResources] = {}
    counts: Counts | None = None


class CaseFile(_Spec):
    name: str
    source: SourceRef
    mode: Literal["single-round", "integration"]
    actions: list[Action]
    rounds: Rounds | None = None
    defaults: Defaults = Defaults()
    session: Session | None = None
    nodes: dict[str, NodeSpec] = {}
    queues: list[QueueSpec] = []
    jobs: list[JobSpec] = []
    topologies: list[TopologySpec] = []
    predicates_enabled: bool = True
    expected: Expected = Expected()
    unsupported: list[str] = []
    scheduler_conf: dict[str, Any] | None = None  # custom plugin configuration (unsupported)
    dra: dict[str, Any] | None = None  # DRA objects (unsupported)


# -- the loaded case -----------------------------------------------------------------------------------------------
@dataclass
class Case:
    path: Path
    name: str
    source: dict[str, Any]
    mode: Literal["single-round", "integration"]
    actions: list[str]
    rounds: Rounds | None
    session: dict[str, Any]
    unsupported: list[str]
    snapshot: Snapshot
    expected: Expected
    task_pod: dict[str, str]  # task name -> pod key ns/name
    job_podgroup: dict[str, str]  # job name -> podgroup key ns/name
    job_tasks: dict[str, list[str]]
    deleting_jobs: set[str] = field(default_factory=set)
    now: float = CASE_NOW
    spec: CaseFile | None = None  # the validated file

    @property
    def supported(self) -> bool:
        return not self.unsupported


def load_cases(directory: str | Path) -> list[Case]:
    """Every case file (*.yaml, *.yml) under `directory`, recursively, sorted by path; a file path loads one."""
    root = Path(directory)
    if root.is_file():
        return [load_case(root)]
    if not root.is_dir():
        raise InputError("no such directory", source=str(root))
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in (".yaml", ".yml"))
    return [load_case(p) for p in files]


def load_case(path: str | Path, *, now: float = CASE_NOW) -> Case:
    p = Path(path)
    docs = read_documents(p)
    if len(docs) != 1 or not isinstance(docs[0].data, dict):
        raise InputError("a behaviour case is one YAML mapping", source=str(p))
    spec = parse_case(docs[0].data, source=str(p))
    return build_case(spec, p, now=now)


def parse_case(data: dict[str, Any], *, source: str | None = None) -> CaseFile:
    try:
        return CaseFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputError(f"{first['msg']}{more}", source=source, obj="behaviour case", field=where) from None


# reasons the extractor gives that this loader now represents (MIG resources; the harness's DRA objects)
DRA_REASON = "DRA objects (ResourceClaims/ResourceSlices/DeviceClasses)"
NOW_SUPPORTED = ("MIG", DRA_REASON)


def build_case(spec: CaseFile, path: Path, *, now: float = CASE_NOW) -> Case:
    unsupported = [r for r in spec.unsupported if r not in NOW_SUPPORTED]
    for reason in unsupported_reasons(spec):
        if reason not in unsupported:
            unsupported.append(reason)
    objects, maps = case_objects(spec, now=now, unsupported=unsupported)
    try:
        snapshot = Snapshot.from_objects([RawObject(kind, obj, source=str(path)) for kind, obj in objects],
                                         now=now, scheduler_names=(SCHEDULER_NAME,), source=str(path))
    except InputError as exc:  # never raise on an unrepresentable case: report it as skipped
        unsupported.append(f"snapshot: {exc.render()}")
        snapshot = Snapshot(now=now, source=str(path), scheduler_names=(SCHEDULER_NAME,))
    rounds = (spec.rounds or Rounds()) if spec.mode == "integration" else None
    session = Session().model_dump() | (spec.session.model_dump() if spec.session else {})
    return Case(
        path=path, name=spec.name, source=spec.source.model_dump(), mode=spec.mode, actions=list(spec.actions),
        rounds=rounds, session=session, unsupported=unsupported, snapshot=snapshot, expected=spec.expected,
        task_pod=maps.task_pod, job_podgroup=maps.job_podgroup, job_tasks=maps.job_tasks,
        deleting_jobs={j.name for j in spec.jobs if j.delete_in_test}, now=now, spec=spec,
    )


# -- what cannot be represented ------------------------------------------------------------------------------------
def unsupported_reasons(spec: CaseFile) -> list[str]:
    out: list[str] = []

    def add(reason: str) -> None:
        if reason not in out:
            out.append(reason)

    if spec.scheduler_conf is not None:
        add("custom scheduler conf (Mocks.SchedulerConf)")
    for reason in dra_reasons(spec):
        add(reason)
    if any(t.legacy_mig for j in spec.jobs for t in j.tasks):
        add("legacy MIG request")
    for q in spec.queues:
        if not q.name:
            add("queue with an empty name")
    for reason in _negative_weight_reasons(spec.queues):
        add(reason)
    for j in spec.jobs:
        for reason in _job_reasons(j, spec.nodes):
            add(reason)
    return out


def _negative_weight_reasons(queues: list[QueueSpec]) -> list[str]:
    """A negative GPU over-quota weight (the implicit `default` department's -1) is only harmless on a lone queue."""
    siblings: dict[str | None, int] = {}
    for q in queues:
        siblings[q.parent] = siblings.get(q.parent, 0) + 1
    return [f"queue {q.name}: negative GPU over-quota weight among sibling queues" for q in queues
            if q.gpu.over_quota_weight < 0 and siblings[q.parent] > 1]


def _job_reasons(job: JobSpec, nodes: dict[str, NodeSpec]) -> list[str]:
    out: list[str] = []
    g = job.per_task.gpus
    if g > 1 and g != int(g):
        out.append(f"job {job.name}: fractional GPU request above one device ({g:g})")
    if g < 0:
        out.append(f"job {job.name}: negative GPU request")
    if job.min_available is not None and job.min_available < 1:
        out.append(f"job {job.name}: min_available {job.min_available}")
    pod_sets = set(_pod_set_names(job.subgroups)) if job.subgroups else set()
    for reason in _subgroup_tree_reasons(job):
        out.append(reason)
    for i, t in enumerate(job.tasks):
        if t.name != f"{job.name}-{i}":
            out.append(f"task {t.name}: name is not <job>-<index>")
        if t.state in ("Unknown", "Deleted"):
            out.append(f"task {t.name}: state {t.state}")
        if t.state in ACTIVE_STATES and not t.node:
            out.append(f"task {t.name}: {t.state} without a node")
        if t.node and t.state != "Pending" and t.node not in nodes:
            out.append(f"task {t.name}: on unknown node {t.node}")
        if t.required_gpus is not None and 0 < g < 1:
            out.append(f"task {t.name}: required_gpus on a fractional job")
        if len(t.gpu_groups) > 1:
            out.append(f"task {t.name}: several GPU groups (multi-device fraction)")
        if t.subgroup and t.subgroup not in pod_sets:
            out.append(f"task {t.name}: subgroup {t.subgroup!r} is not a pod set of its job")
    return out


def _subgroup_tree_reasons(job: JobSpec) -> list[str]:
    if job.subgroups is None:
        return []
    out: list[str] = []
    names: list[str] = []

    def walk(node: SubGroupSetSpec) -> None:
        for ps in node.pod_sets:
            names.append(ps.name)
            if ps.min_available < 1:
                out.append(f"job {job.name}: pod set {ps.name} has min_available {ps.min_available}")
        for sg in node.sub_groups:
            names.append(sg.name)
            if not sg.pod_sets and not sg.sub_groups:
                out.append(f"job {job.name}: sub group {sg.name} is empty")
            walk(sg)

    walk(job.subgroups)
    if any(not t.subgroup for t in job.tasks):
        names.append(DEFAULT_SUBGROUP)
    if len(set(names)) != len(names) or "" in names:
        out.append(f"job {job.name}: sub group names are empty or not unique")
    return out


def _pod_set_names(node: SubGroupSetSpec) -> list[str]:
    return [ps.name for ps in node.pod_sets] + [n for sg in node.sub_groups for n in _pod_set_names(sg)]


# -- objects -------------------------------------------------------------------------------------------------------
@dataclass
class _Maps:
    task_pod: dict[str, str] = field(default_factory=dict)
    job_podgroup: dict[str, str] = field(default_factory=dict)
    job_tasks: dict[str, list[str]] = field(default_factory=dict)


def case_objects(spec: CaseFile, *, now: float = CASE_NOW,
                 unsupported: list[str] | None = None) -> tuple[list[tuple[str, dict[str, Any]]], _Maps]:
    """(kind, object) pairs for every Kubernetes object of the case, and the task/job -> object key maps."""
    objects: list[tuple[str, dict[str, Any]]] = []
    objects += [("Node", node_object(name, n, spec.defaults)) for name, n in spec.nodes.items()]
    objects += [("Queue", queue_object(q, i, spec.queues, spec.defaults, now))
                for i, q in enumerate(spec.queues) if q.name]
    objects += [("Topology", topology_object(t)) for t in spec.topologies]
    objects += [("PriorityClass", priority_class_object(v)) for v in sorted({j.priority for j in spec.jobs})]
    created = job_creation_times(spec.jobs, now)
    maps = _Maps()
    for job in spec.jobs:
        ns = job.namespace or "default"
        objects.append(("PodGroup", podgroup_object(job, ns, created[job.name], now)))
        maps.job_podgroup[job.name] = f"{ns}/{job.name}"
        maps.job_tasks[job.name] = [t.name for t in job.tasks]
        for t in job.tasks:
            objects.append(("Pod", pod_object(job, t, ns, created[job.name], spec, now)))
            maps.task_pod[t.name] = f"{ns}/{t.name}"
    objects += dra_objects(spec.dra)
    return objects, maps


# -- DRA (the harness's dra_fake objects) ------------------------------------------------------------------------
def dra_reasons(spec: CaseFile) -> list[str]:
    """What of a case's DRA objects the loader cannot represent."""
    dra = spec.dra
    out = []
    defined = {c.get("Name") for c in (dra or {}).get("ResourceClaims") or []}
    for name in sorted({c for j in spec.jobs for t in j.tasks for c in t.resource_claims} - defined):
        out.append(f"DRA claim {name} is not in the case's dra block")
    for c in (dra or {}).get("ResourceClaims") or []:
        status = c.get("ClaimStatus") or {}
        for k in ("ReservedFor", "Allocation"):
            if isinstance(status.get(k), str):
                out.append(f"DRA claim {c.get('Name')}: {k} not evaluated")
    return out


def dra_objects(dra: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """The harness's fake DRA objects: a DeviceClass per name (selecting its driver, the class name), a slice per
    entry with devices "0".."Count-1" in pool <node>, claims of one request (named as the claim) for Count
    devices of a class, with their allocation and reservedFor as given."""
    if not dra:
        return []
    v = "resource.k8s.io/v1"
    out: list[tuple[str, dict[str, Any]]] = []
    for name in dra.get("DeviceClasses") or []:
        out.append(("DeviceClass", {"apiVersion": v, "kind": "DeviceClass", "metadata": {"name": name}, "spec": {
            "selectors": [{"cel": {"expression": f"device.driver == {json.dumps(name)}"}}]}}))
    for s in dra.get("ResourceSlices") or []:
        node = s.get("NodeName")
        out.append(("ResourceSlice", {"apiVersion": v, "kind": "ResourceSlice", "metadata": {"name": s["Name"]},
                                      "spec": {"driver": s["DeviceClassName"], "nodeName": node,
                                               "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                                               "devices": [{"name": str(i)} for i in range(int(s.get("Count", 0)))]}}))
    for c in dra.get("ResourceClaims") or []:
        status: dict[str, Any] = {}
        cs = c.get("ClaimStatus") or {}
        alloc = cs.get("Allocation")
        if isinstance(alloc, dict):
            results = [{"request": r.get("Request"), "driver": r.get("Driver"), "pool": r.get("Pool"),
                        "device": r.get("Device")} for r in (alloc.get("Devices") or {}).get("Results") or []]
            status["allocation"] = {"devices": {"results": results}}
        if isinstance(cs.get("ReservedFor"), list):
            status["reservedFor"] = [{"resource": r.get("Resource", "pods"), "name": r.get("Name"),
                                      "uid": r.get("UID")} for r in cs["ReservedFor"]]
        out.append(("ResourceClaim", {
            "apiVersion": v, "kind": "ResourceClaim",
            "metadata": {"name": c["Name"], "namespace": c.get("Namespace") or "default",
                         "labels": dict(c.get("Labels") or {})},
            "spec": {"devices": {"requests": [{"name": c["Name"], "exactly": {
                "deviceClassName": c["DeviceClassName"], "count": int(c.get("Count", 1))}}]}},
            "status": status}))
    return out


def _num(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


def _qty(v: float) -> str:
    return str(_num(v))


def _millis(v: float) -> str:
    return f"{_num(v)}m"


def node_object(name: str, n: NodeSpec, d: Defaults) -> dict[str, Any]:
    mixed = n.mig is not None and n.mig.strategy == "mixed"
    mig_instances = {k: str(v) for k, v in (n.mig.instances if n.mig else {}).items()}
    common = {"cpu": _millis(n.cpu_millis if n.cpu_millis else d.node_cpu_millis),
              "memory": _qty(n.memory_bytes if n.memory_bytes else d.node_memory_bytes),
              "pods": str(n.max_pods if n.max_pods is not None else d.node_max_pods), **mig_instances}
    labels = {
        NODE_TYPE_LABEL: name,
        GPU_COUNT_LABEL: str(n.gpus),
        GPU_MEMORY_LABEL: str(d.node_gpu_memory_mib),
        MIG_ENABLED_LABEL: "true" if n.mig is not None and n.mig.strategy else "false",
        MIG_STRATEGY_LABEL: n.mig.strategy if n.mig else "",
    }
    labels.update(n.labels)
    if n.gpu_memory_mib:  # the harness sets the node's own GPU memory after merging labels
        labels[GPU_MEMORY_LABEL] = str(n.gpu_memory_mib)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": {**common, GPU_RESOURCE: str(n.gpus)},
            "allocatable": {**common, GPU_RESOURCE: "0" if mixed else str(n.gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def queue_object(q: QueueSpec, index: int, queues: list[QueueSpec], d: Defaults, now: float) -> dict[str, Any]:
    siblings = sum(1 for o in queues if o.parent == q.parent)
    weight = q.gpu.over_quota_weight
    if weight < 0 and siblings == 1:
        weight = 1  # a lone queue takes everything whatever its weight; the CRD forbids negative weights
    spec: dict[str, Any] = {
        "priority": q.priority if q.priority is not None else d.queue_priority,
        "resources": {
            "gpu": {"quota": _num(q.gpu.deserved), "overQuotaWeight": _num(max(weight, 0)),
                    "limit": _num(q.gpu.limit)},
            "cpu": {"quota": _num(q.cpu.deserved), "overQuotaWeight": 1, "limit": _num(q.cpu.limit)},
            "memory": {"quota": _memory_mb(q.memory.deserved), "overQuotaWeight": 1,
                       "limit": _memory_mb(q.memory.limit)},
        },
    }
    if q.parent:
        spec["parentQueue"] = q.parent
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
            "metadata": {"name": q.name, "creationTimestamp": format_time(now + 60.0 * index)}, "spec": spec}


def _memory_mb(value: float) -> int | float:
    return -1 if value == -1 else _num(value / MEMORY_MB)


def topology_object(t: TopologySpec) -> dict[str, Any]:
    return {"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": t.name},
            "spec": {"levels": [{"nodeLabel": lvl} for lvl in t.levels]}}


def priority_class_name(value: int) -> str:
    return f"{PRIORITY_CLASS_PREFIX}{value}" if value >= 0 else f"{PRIORITY_CLASS_PREFIX}m{-value}"


def priority_class_object(value: int) -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": priority_class_name(value)}, "value": value}


def job_creation_times(jobs: list[JobSpec], now: float) -> dict[str, float]:
    """The harness stable-sorts jobs by priority (descending); position i is created (N - i) minutes ago."""
    ordered = sorted(jobs, key=lambda j: -j.priority)
    return {j.name: now - 60.0 * (len(jobs) - i) for i, j in enumerate(ordered)}


# -- podgroups -----------------------------------------------------------------------------------------------------
def _topology_constraint(tc: TopologyConstraintSpec | None) -> dict[str, str] | None:
    if tc is None or not (tc.required_level or tc.preferred_level):
        return None
    out = {"topology": tc.topology, "requiredTopologyLevel": tc.required_level,
           "preferredTopologyLevel": tc.preferred_level}
    return {k: v for k, v in out.items() if v}


def _subgroup(name: str, min_member: int, parent: str | None,
              tc: TopologyConstraintSpec | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "minMember": max(1, min_member)}
    if parent:
        out["parent"] = parent
    constraint = _topology_constraint(tc)
    if constraint:
        out["topologyConstraint"] = constraint
    return out


def flatten_subgroups(node: SubGroupSetSpec, parent: str | None = None) -> list[dict[str, Any]]:
    """The pod-set tree below `node` as PodGroup spec.subGroups; a non-leaf subgroup needs all its children."""
    out = [_subgroup(ps.name, ps.min_available, parent, ps.topology_constraint) for ps in node.pod_sets]
    for sg in node.sub_groups:
        out.append(_subgroup(sg.name, len(sg.pod_sets) + len(sg.sub_groups), parent, sg.topology_constraint))
        out += flatten_subgroups(sg, sg.name)
    return out


def _leaf_min_sum(node: SubGroupSetSpec) -> int:
    return sum(ps.min_available for ps in node.pod_sets) + sum(_leaf_min_sum(sg) for sg in node.sub_groups)


def _has_default_pod_set(job: JobSpec) -> bool:
    return job.subgroups is not None and any(not t.subgroup for t in job.tasks)


def podgroup_spec(job: JobSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {"queue": job.queue, "priorityClassName": priority_class_name(job.priority),
                            "preemptibility": job.effective_preemptibility}
    if job.min_available is not None:
        min_member = job.min_available
    elif job.subgroups is not None:
        min_member = _leaf_min_sum(job.subgroups) + (len(job.tasks) if _has_default_pod_set(job) else 0)
        subgroups = flatten_subgroups(job.subgroups)
        if _has_default_pod_set(job):
            subgroups.append(_subgroup(DEFAULT_SUBGROUP, len(job.tasks), None, None))
        if subgroups:
            spec["subGroups"] = subgroups
        constraint = _topology_constraint(job.subgroups.topology_constraint)
        if constraint:
            spec["topologyConstraint"] = constraint
    else:
        min_member = len(job.tasks)
    spec["minMember"] = max(1, min_member)
    return spec


def podgroup_object(job: JobSpec, ns: str, created: float, now: float) -> dict[str, Any]:
    annotations: dict[str, str] = {}
    if job.stale_seconds is not None:
        annotations[STALE_TIMESTAMP_ANNOTATION] = format_time(now - job.stale_seconds) or ""
    if any(t.state in BOUND_STATES for t in job.tasks):  # harness: allocated tasks -> started a minute ago
        annotations[LAST_START_ANNOTATION] = format_time(now - LAST_START_AGE_S) or ""
    metadata: dict[str, Any] = {"name": job.name, "namespace": ns, "creationTimestamp": format_time(created)}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": metadata,
            "spec": podgroup_spec(job)}


# -- pods ----------------------------------------------------------------------------------------------------------
def _shares_gpu(job: JobSpec) -> bool:
    return 0 < job.per_task.gpus < 1 or bool(job.per_task.gpu_memory_mib)


def pod_resources(job: JobSpec, task: TaskSpec, d: Defaults) -> dict[str, Any]:
    if job.best_effort:
        return {}
    pt = job.per_task
    requests: dict[str, str] = {
        "cpu": _millis(pt.cpu_millis if pt.cpu_millis else d.task_cpu_millis),
        "memory": _qty(pt.memory_bytes if pt.memory_bytes else d.task_memory_bytes),
    }
    limits: dict[str, str] = {}
    whole = task.required_gpus if task.required_gpus is not None else (int(pt.gpus) if pt.gpus >= 1 else 0)
    if whole > 0:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(whole)
    for name, count in task.mig.items():
        requests[name] = limits[name] = str(count)
    out: dict[str, Any] = {"requests": requests}
    if limits:
        out["limits"] = limits
    return out


def pod_annotations(job: JobSpec, task: TaskSpec) -> dict[str, str]:
    ann = {PODGROUP_ANNOTATION: job.name}
    pt = job.per_task
    if 0 < pt.gpus < 1:
        ann[GPU_FRACTION_ANNOTATION] = str(pt.gpus)
    if pt.gpu_memory_mib:
        ann[GPU_MEMORY_ANNOTATION] = str(pt.gpu_memory_mib)
    for name, count in task.mig.items():  # the harness records MIG requests as annotations too
        ann[name] = str(count)
    return ann


def pod_labels(job: JobSpec, task: TaskSpec) -> dict[str, str]:
    labels = {QUEUE_LABEL: job.queue}
    if task.subgroup:
        labels[SUBGROUP_LABEL] = task.subgroup
    elif job.subgroups is not None:
        labels[SUBGROUP_LABEL] = DEFAULT_SUBGROUP
    if task.priority is not None:
        labels[TASK_ORDER_LABEL] = str(task.priority)
    # KAI writes the shared-GPU group when it places a sharing pod: only pods on (or nominated to) a node carry it
    if task.gpu_groups and _shares_gpu(job) and task.state in ACTIVE_STATES and task.node:
        labels[GPU_GROUP_LABEL] = task.gpu_groups[0]
    if task.pod_affinity:
        labels.update(task.pod_affinity.labels)
    return labels


def pod_affinity(task: TaskSpec) -> dict[str, Any] | None:
    affinity: dict[str, Any] = {}
    if task.node_affinity:
        affinity["nodeAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": NODE_TYPE_LABEL, "operator": "In", "values": list(task.node_affinity)}]}]}}
    pa = task.pod_affinity
    if pa and pa.labels:
        for key, kind in ((pa.affinity_topology_key, "podAffinity"), (pa.anti_affinity_topology_key,
                                                                        "podAntiAffinity")):
            if key:
                affinity[kind] = {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": dict(pa.labels)}, "topologyKey": key}]}
    return affinity or None


def _place(pod: dict[str, Any], task: TaskSpec, now: float) -> None:
    """nodeName / nominatedNodeName / phase / deletionTimestamp from the task state."""
    spec, status, meta = pod["spec"], pod["status"], pod["metadata"]
    state = task.state
    if state in BOUND_STATES or state == "Releasing":
        spec["nodeName"] = task.node
        status["phase"] = "Running"
        status["startTime"] = format_time(now - RUNNING_SINCE_S)
        if state == "Releasing":
            meta["deletionTimestamp"] = format_time(now)
            meta["deletionGracePeriodSeconds"] = 30
    elif state == "Pipelined":
        status["phase"] = "Pending"
        status["nominatedNodeName"] = task.node
    elif state in ("Failed", "Succeeded"):
        status["phase"] = state
        if task.node:
            spec["nodeName"] = task.node
    else:  # Pending, Gated (a `node` on a pending task is not used: README)
        status["phase"] = "Pending"
        if state == "Gated":
            spec["schedulingGates"] = [{"name": GATE_NAME}]


def pod_object(job: JobSpec, task: TaskSpec, ns: str, created: float, case: CaseFile,
               now: float) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceClaims": [{"name": c, "resourceClaimName": c} for c in task.resource_claims],
        "schedulerName": SCHEDULER_NAME,
        "containers": [{"name": "main", "image": "busybox", "resources": pod_resources(job, task, case.defaults)}],
    }
    if task.priority is not None:
        spec["priority"] = task.priority
    affinity = pod_affinity(task)
    if affinity:
        spec["affinity"] = affinity
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": task.name, "namespace": ns, "creationTimestamp": format_time(created),
                     "labels": pod_labels(job, task), "annotations": pod_annotations(job, task)},
        "spec": spec,
        "status": {},
    }
    _place(pod, task, now)
    return pod
