"""kai-opt's native scenario YAML (`apiVersion: kai-opt/v1`, `kind: Scenario`): a cluster written by hand.

A scenario describes node pools, a queue tree, priority classes, topologies and jobs compactly; it is validated
with the pydantic models below, converted to the Kubernetes objects the API models read (`Node.from_k8s`, ...) and
loaded with `Snapshot.from_objects`. Every user error is an `InputError` naming the file and line, the scenario
object ("Scenario job team-a/train", "Scenario queue research") and the field.

Naming: node `i` (0-based) of pool `p` is `p-i`; replica `i` of job `j` is pod `j-i` (`j-<subgroup>-i` with
sub-groups). A job is one PodGroup named after the job.

Node topology labels: `nodePools[].topology` maps a node label to a value pattern evaluated per node, with the
placeholders `{index}` (the node's 0-based index in its pool), `{index/N}` (index divided by N, rounded down),
`{index%N}` (remainder) and `{pool}`; e.g. `{rack: "rack-{index/4}"}` puts 4 nodes in each rack. Nothing is
evaluated as code.

Running work: `jobs[].running.nodes` places the first replicas on the named nodes (`auto`: the first node in file
order with room, honouring node selector and taints); those pods are Running with a start time
`startedSecondsAgo` before `now`, and their GPU devices are recorded so the placement is exact.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from kai_opt.api.dra import API_VERSION as DRA_API
from kai_opt.api.meta import Toleration, format_time
from kai_opt.api.node import DEFAULT_GPU_MEMORY_MIB, GPU_MEMORY_LABEL, GPU_PRODUCT_LABEL
from kai_opt.api.pod import (
    GPU_DEVICES_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    GPU_FRACTION_NUM_DEVICES_ANNOTATION,
    GPU_MEMORY_ANNOTATION,
    PODGROUP_ANNOTATION,
    QUEUE_LABEL,
    SUBGROUP_LABEL,
)
from kai_opt.api.podgroup import LAST_START_ANNOTATION
from kai_opt.api.priorityclass import DEFAULT_PRIORITY_CLASSES
from kai_opt.api.queue import parse_duration
from kai_opt.errors import InputError
from kai_opt.limits import (
    INT32_MAX,
    INT32_MIN,
    MAX_AMOUNT,
    MAX_DURATION_S,
    MAX_GPU_MEMORY_MIB,
    MAX_GPUS_PER_NODE,
    over_ceiling,
)
from kai_opt.loaders.documents import Document
from kai_opt.snapshot import RawObject, Snapshot
from kai_opt.units import GPU_MILLI, GPU_RESOURCE, QuantityError, parse_quantity, to_internal

DEFAULT_SCHEDULER = "kai-opt"
AUTO = "auto"
GATE_NAME = "kai-opt.io/scenario-gate"
HOSTNAME_LABEL = "kubernetes.io/hostname"

_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_INDEX_EXPR = re.compile(r"^index(?:([/%])(\d+))?$")


# -- field types -----------------------------------------------------------------------------------------------------
def _dns_name(value: Any) -> str:
    if not isinstance(value, str) or not _DNS_NAME.match(value) or len(value) > 253:
        raise ValueError(f"must be a lowercase DNS name (a-z, 0-9, '-', '.'), got {value!r}")
    return value


def _quantity(value: Any, resource: str = "memory") -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"expected a quantity such as 8, 500m or 64Gi, got {value!r}")
    try:
        q = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(f"{exc} (e.g. 8, 500m, 64Gi)") from None
    if q < 0:
        raise ValueError(f"must not be negative, got {value!r}")
    try:
        to_internal(resource, value)  # in range for the state
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return str(value)


def _cpu_quantity(value: Any) -> str:
    return _quantity(value, "cpu")


def _duration(value: Any) -> str | float:
    try:
        parse_duration(value, obj="", field="")
    except InputError as exc:
        raise ValueError(exc.message) from None
    return value


Name = Annotated[str, PlainValidator(_dns_name), WithJsonSchema({"type": "string", "pattern": _DNS_NAME.pattern})]
Quantity = Annotated[str, PlainValidator(_quantity, json_schema_input_type=str | int | float)]
CpuQuantity = Annotated[str, PlainValidator(_cpu_quantity, json_schema_input_type=str | int | float)]
Duration = Annotated[str | float, PlainValidator(_duration, json_schema_input_type=str | float)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, coerce_numbers_to_str=True,
                              field_title_generator=lambda name, info: info.alias or to_camel(name))


def _fail(loc: tuple[str | int, ...], message: str) -> NoReturn:
    """A validation error at `loc` (relative to the model being validated), for checks across fields."""
    err = PydanticCustomError("scenario", "{msg}", {"msg": message})
    raise ValidationError.from_exception_data("Scenario", [InitErrorDetails(type=err, loc=loc, input=None)])


# -- cluster ---------------------------------------------------------------------------------------------------------
class TopologySpec(_Model):
    """A Topology: node label keys from the top level (e.g. zone) to the bottom (e.g. hostname)."""

    name: Name = Field(description="Topology name, referenced by jobs[].topology.topology.")
    levels: list[str] = Field(min_length=1, description="Node label keys, top level first.")

    @field_validator("levels")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("levels must be unique")
        return v


class TaintSpec(_Model):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeTemplate(_Model):
    """What every node of a pool has."""

    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_NODE, description="Whole GPU devices (nvidia.com/gpu).")
    gpu_memory_mib: int = Field(DEFAULT_GPU_MEMORY_MIB, gt=0, le=MAX_GPU_MEMORY_MIB, alias="gpuMemoryMiB",
                                description="Memory of one GPU device in MiB (label nvidia.com/gpu.memory).")
    gpu_product: str | None = Field(None, description="GPU model (label nvidia.com/gpu.product).")
    cpu: CpuQuantity = Field(description="Allocatable CPU, a Kubernetes quantity (e.g. 64 or 63500m).")
    memory: Quantity = Field(description="Allocatable memory, a Kubernetes quantity (e.g. 512Gi).")
    pods: int = Field(110, ge=1, le=MAX_AMOUNT, description="Allocatable pod count.")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra node labels.")
    taints: list[TaintSpec] = Field(default_factory=list, description="Node taints.")


class DraDevicesSpec(_Model):
    """DRA devices of each node of a pool: one ResourceSlice per node (pool = the node), `count` devices named
    `<prefix>-<index>` with string attributes."""

    driver: str = Field(min_length=1, description="The DRA driver (a DNS subdomain, e.g. gpu.example.com).")
    count: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="Devices per node.")
    prefix: Name = Field("dev", description="Device names are <prefix>-0, <prefix>-1, ...")
    attributes: dict[str, str] = Field(default_factory=dict, description="String attributes of every device.")


class DeviceClassSpec(_Model):
    """A DRA DeviceClass: the devices its CEL selectors (ANDed) select."""

    name: str = Field(min_length=1)
    selectors: list[str] = Field(default_factory=list, description="CEL expressions over `device`.")


class ClaimRequestSpec(_Model):
    """One device request of each replica's own claim (made from a ResourceClaimTemplate per job)."""

    device_class: str = Field(min_length=1)
    count: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE)
    selectors: list[str] = Field(default_factory=list, description="CEL expressions over `device`.")


class NodePoolSpec(_Model):
    """`count` identical nodes named `<name>-<index>`."""

    name: Name = Field(description="Pool name; nodes are named <name>-0, <name>-1, ...")
    count: int = Field(1, ge=1, le=INT32_MAX, description="Number of nodes.")
    template: NodeTemplate
    dra_devices: DraDevicesSpec | None = Field(None, description="DRA devices of each node (a ResourceSlice).")
    topology: dict[str, str] = Field(
        default_factory=dict,
        description="Node label -> value pattern per node, with placeholders {index}, {index/N} (integer "
                    "division), {index%N} and {pool}; e.g. {rack: 'rack-{index/4}'} puts 4 nodes in each rack.")

    @field_validator("topology")
    @classmethod
    def _patterns(cls, v: dict[str, str]) -> dict[str, str]:
        for label, pattern in v.items():
            try:
                check_pattern(pattern)
            except ValueError as exc:
                _fail((label,), str(exc))
        return v

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]


def check_pattern(pattern: str) -> None:
    """ValueError unless every placeholder of a topology label pattern is known (see `expand_pattern`)."""
    rest = _PLACEHOLDER.sub("", pattern)
    if "{" in rest or "}" in rest:
        raise ValueError(f"unbalanced braces in {pattern!r}")
    for expr in _PLACEHOLDER.findall(pattern):
        m = _INDEX_EXPR.match(expr.replace(" ", ""))
        if expr != "pool" and not m:
            raise ValueError(f"unknown placeholder {{{expr}}} in {pattern!r}; "
                             "use {index}, {index/N}, {index%N} or {pool}")
        if m and m.group(2) is not None and int(m.group(2)) == 0:
            raise ValueError(f"division by zero in {pattern!r}")


def expand_pattern(pattern: str, index: int, pool: str) -> str:
    """A topology label value for node `index` of `pool`: {index}, {index/N}, {index%N}, {pool} replaced."""

    def one(m: re.Match[str]) -> str:
        expr = m.group(1).replace(" ", "")
        if expr == "pool":
            return pool
        op, n = _INDEX_EXPR.match(expr).groups()  # type: ignore[union-attr]
        if op is None:
            return str(index)
        return str(index // int(n) if op == "/" else index % int(n))

    return _PLACEHOLDER.sub(one, pattern)


# -- queues and priorities -------------------------------------------------------------------------------------------
class QueueResourceSpec(_Model):
    """One resource of a queue, in the Queue CRD's units: gpu devices, cpu millicores, memory megabytes."""

    quota: float = Field(0, allow_inf_nan=False, description="Deserved amount; -1 = unlimited.")
    over_quota_weight: float = Field(1, allow_inf_nan=False, description="Share of the over-quota resources, "
                                     "relative to siblings.")
    limit: float = Field(-1, allow_inf_nan=False, description="Hard cap; -1 = unlimited.")

    @field_validator("quota", "limit")
    @classmethod
    def _minus_one_or_non_negative(cls, v: float) -> float:
        if v < 0 and v != -1:
            raise ValueError(f"must be >= 0 or -1 (unlimited), got {v:g}")
        return v

    @field_validator("over_quota_weight")
    @classmethod
    def _non_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"must be >= 0, got {v:g}")
        return v


class QueueSpec(_Model):
    """A queue; nest sub-queues under `children` or link them with `parent`. Only leaf queues hold jobs."""

    name: Name
    parent: str | None = Field(None, description="Parent queue name (alternative to nesting under children).")
    priority: int = Field(100, ge=INT32_MIN, le=INT32_MAX, description="Queue priority: higher gets over-quota "
                          "resources first.")
    gpu: QueueResourceSpec = Field(default_factory=QueueResourceSpec, description="GPU devices.")
    cpu: QueueResourceSpec = Field(default_factory=QueueResourceSpec, description="CPU millicores.")
    memory: QueueResourceSpec = Field(default_factory=QueueResourceSpec, description="Memory in MB (10^6 bytes).")
    preempt_min_runtime: Duration | None = Field(None, description="Go duration (e.g. 10m); preempt victims "
                                                                   "must have run this long.")
    reclaim_min_runtime: Duration | None = Field(None, description="Go duration; reclaim victims must have run "
                                                                   "this long.")
    children: list[QueueSpec] = Field(default_factory=list, description="Child queues.")

    @model_validator(mode="after")
    def _children_agree(self) -> QueueSpec:
        for i, child in enumerate(self.children):
            if child.parent is not None and child.parent != self.name:
                _fail(("children", i, "parent"),
                      f"nested under queue {self.name!r} but names parent {child.parent!r}")
        return self


class PriorityClassSpec(_Model):
    name: Name
    value: int = Field(ge=INT32_MIN, le=INT32_MAX, description="Priority; below 100 is preemptible unless a job "
                       "says otherwise.")
    global_default: bool = False
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = "PreemptLowerPriority"


# -- jobs ------------------------------------------------------------------------------------------------------------
class TolerationSpec(_Model):
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""


class PodSpec(_Model):
    """What each replica asks for. GPUs: whole `gpus`, or a share (`gpuFraction` or `gpuMemoryMiB`) of
    `gpuFractionNumDevices` devices."""

    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_NODE, description="Whole GPU devices.")
    gpu_fraction: float | None = Field(None, allow_inf_nan=False, description="Share of one GPU device, 0 < x < 1.")
    gpu_memory_mib: int | None = Field(None, le=MAX_GPU_MEMORY_MIB, alias="gpuMemoryMiB",
                                       description="GPU memory per device, MiB.")
    gpu_fraction_num_devices: int = Field(1, ge=1, le=MAX_GPUS_PER_NODE,
                                          description="Devices a gpuFraction/gpuMemoryMiB share spans.")
    cpu: CpuQuantity | None = Field(None, description="CPU request, a Kubernetes quantity.")
    memory: Quantity | None = Field(None, description="Memory request, a Kubernetes quantity.")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    claims: list[ClaimRequestSpec] = Field(default_factory=list, description="DRA device requests of each "
                                           "replica's own ResourceClaim.")

    @field_validator("gpu_fraction")
    @classmethod
    def _fraction(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None:
            return v
        if not 0 < v < 1:
            raise ValueError(f"must be in (0, 1), got {v:g}; use gpus for whole devices")
        if info.data.get("gpus"):
            raise ValueError("cannot be combined with gpus (a whole-GPU request)")
        return v

    @field_validator("gpu_memory_mib")
    @classmethod
    def _gpu_memory(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None:
            return v
        if v <= 0:
            raise ValueError(f"must be a positive number of MiB, got {v}")
        if info.data.get("gpus"):
            raise ValueError("cannot be combined with gpus (a whole-GPU request)")
        if info.data.get("gpu_fraction") is not None:
            raise ValueError("cannot be combined with gpuFraction")
        return v

    @field_validator("gpu_fraction_num_devices")
    @classmethod
    def _num_devices(cls, v: int, info: ValidationInfo) -> int:
        if v > 1 and info.data.get("gpu_fraction") is None and info.data.get("gpu_memory_mib") is None:
            raise ValueError("needs gpuFraction or gpuMemoryMiB")
        return v


class TopologyConstraintSpec(_Model):
    topology: str | None = Field(None, description="Topology name (may be left out when there is one).")
    required_level: str | None = Field(None, description="Node label: all pods in one domain of this level.")
    preferred_level: str | None = Field(None, description="Node label: best effort.")

    @model_validator(mode="after")
    def _some_level(self) -> TopologyConstraintSpec:
        if not (self.required_level or self.preferred_level):
            _fail(("requiredLevel",), "requiredLevel or preferredLevel is required")
        return self

    def k8s(self) -> dict[str, str]:
        out = {"topology": self.topology, "requiredTopologyLevel": self.required_level,
               "preferredTopologyLevel": self.preferred_level}
        return {k: v for k, v in out.items() if v}


class SubGroupSpec(_Model):
    """A sub-gang; leaf sub-groups hold `replicas` pods, parents only group their children."""

    name: Name
    min_member: int = Field(1, ge=1, le=INT32_MAX)
    parent: str | None = None
    replicas: int | None = Field(None, ge=0, le=INT32_MAX, description="Pods in this sub-group (default: minMember "
                                 "for a leaf, "
                                                         "0 for a parent).")
    topology: TopologyConstraintSpec | None = None


class RunningSpec(_Model):
    """The current placement of the first replicas."""

    nodes: list[str] = Field(min_length=1, description="One node name (or 'auto') per running replica.")
    started_seconds_ago: int = Field(3600, ge=0, le=MAX_DURATION_S, description="Start time, in seconds before "
                                     "now.")


class JobSpec(_Model):
    """A workload: one PodGroup (a gang of minMember) and its replicas."""

    name: Name
    namespace: Name = "default"
    queue: str = Field(description="Leaf queue name.")
    priority_class: str | None = Field(None, description="Priority class (KAI defaults: train 50, "
                                                         "build-preemptible 75, build 100, inference 125).")
    preemptibility: Literal["preemptible", "non-preemptible"] | None = None
    scheduler_name: str | None = Field(None, description="Default: the scenario's schedulerName.")
    pod: PodSpec = Field(default_factory=PodSpec)
    sub_groups: list[SubGroupSpec] = Field(default_factory=list)
    replicas: int | None = Field(None, ge=0, le=INT32_MAX, validate_default=True,
                                 description="Pods (default 1, or the sum of the sub-groups' replicas).")
    min_member: int | None = Field(None, ge=1, le=INT32_MAX, description="Gang size (default: replicas, or the sum "
                                   "of the leaf "
                                                           "sub-groups' minMember).")
    topology: TopologyConstraintSpec | None = None
    gated: bool = Field(False, description="Pending pods carry a scheduling gate (never placed).")
    running: RunningSpec | None = None
    created_seconds_ago: int | None = Field(None, ge=0, le=MAX_DURATION_S, description="Default: started time "
                                            "(when running) plus "
                                                                    "one second per later job in the file.")

    @field_validator("sub_groups")
    @classmethod
    def _sub_group_tree(cls, subs: list[SubGroupSpec]) -> list[SubGroupSpec]:
        index = {}
        for i, s in enumerate(subs):
            if s.name in index:
                _fail((i, "name"), f"duplicate sub-group name {s.name!r}")
            index[s.name] = i
        for i, s in enumerate(subs):
            if s.parent is not None and s.parent not in index:
                _fail((i, "parent"), f"parent sub-group {s.parent!r} does not exist")
        for i, s in enumerate(subs):
            seen, cur = [s.name], s.parent
            while cur is not None:
                if cur in seen:
                    _fail((i, "parent"), f"sub-group parent links form a cycle: {' -> '.join([*seen, cur])}")
                seen.append(cur)
                cur = subs[index[cur]].parent
        parents = {s.parent for s in subs}
        for i, s in enumerate(subs):
            if s.name in parents and s.replicas:
                _fail((i, "replicas"), "a sub-group with child sub-groups holds no pods of its own")
        return subs

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: int | None, info: ValidationInfo) -> int | None:
        subs = info.data.get("sub_groups")
        if v is not None and subs:
            total = sum(n for _, n in _leaf_counts(subs))
            if v != total:
                raise ValueError(f"is {v} but the sub-groups hold {total} pods (leave it out to use their sum)")
        return v

    @model_validator(mode="after")
    def _running_fits(self) -> JobSpec:
        if self.running is not None and len(self.running.nodes) > self.total_replicas:
            _fail(("running", "nodes"), f"{len(self.running.nodes)} nodes for {self.total_replicas} replicas")
        return self

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def total_replicas(self) -> int:
        if self.sub_groups:
            return sum(n for _, n in _leaf_counts(self.sub_groups))
        return 1 if self.replicas is None else self.replicas

    @property
    def gang_size(self) -> int:
        if self.min_member is not None:
            return self.min_member
        if self.sub_groups:
            parents = {s.parent for s in self.sub_groups}
            return max(1, sum(s.min_member for s in self.sub_groups if s.name not in parents))
        return max(1, self.total_replicas)

    def pods(self) -> list[tuple[str, str | None]]:
        """(pod name, sub-group) per replica, in order."""
        if not self.sub_groups:
            return [(f"{self.name}-{i}", None) for i in range(self.total_replicas)]
        return [(f"{self.name}-{sg}-{i}", sg) for sg, n in _leaf_counts(self.sub_groups) for i in range(n)]


def _leaf_counts(subs: list[SubGroupSpec]) -> list[tuple[str, int]]:
    parents = {s.parent for s in subs}
    return [(s.name, s.replicas if s.replicas is not None else (0 if s.name in parents else s.min_member))
            for s in subs]


# -- the scenario ----------------------------------------------------------------------------------------------------
class Scenario(_Model):
    """A cluster written by hand: node pools, queues, priority classes, topologies and jobs."""

    api_version: Literal["kai-opt/v1"] = Field(description="kai-opt/v1")
    kind: Literal["Scenario"]
    now: datetime | None = Field(None, description="The time the scenario describes (RFC 3339); default: now.")
    scheduler_name: str = Field(DEFAULT_SCHEDULER, description="Scheduler name of the jobs' pods.")
    topologies: list[TopologySpec] = Field(default_factory=list)
    node_pools: list[NodePoolSpec] = Field(default_factory=list)
    queues: list[QueueSpec] = Field(default_factory=list)
    priority_classes: list[PriorityClassSpec] = Field(default_factory=list)
    device_classes: list[DeviceClassSpec] = Field(default_factory=list, description="DRA DeviceClasses.")
    jobs: list[JobSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        self._check_ceilings()  # before anything below makes a name per node or pod
        _unique("topologies", [t.name for t in self.topologies], "topology")
        _unique("nodePools", [p.name for p in self.node_pools], "node pool")
        _unique("priorityClasses", [p.name for p in self.priority_classes], "priority class")
        flat = self.flat_queues()
        _unique_at([((*loc, "name"), q.name) for q, _, loc in flat], "queue")
        by_name = {q.name: parent for q, parent, _ in flat}
        for _, parent, loc in flat:
            if parent is not None and parent not in by_name:
                _fail((*loc, "parent"), f"parent queue {parent!r} does not exist")
        for q, parent, loc in flat:
            seen, cur = [q.name], parent
            while cur is not None:
                if cur in seen:
                    _fail((*loc, "parent"), f"parent links form a cycle: {' -> '.join([*seen, cur])}")
                seen.append(cur)
                cur = by_name[cur]
        nodes = {n for p in self.node_pools for n in p.node_names()}
        classes = set(DEFAULT_PRIORITY_CLASSES) | {p.name for p in self.priority_classes}
        _unique_at([(("jobs", i, "name"), j.key) for i, j in enumerate(self.jobs)], "job")
        pod_names: dict[str, str] = {}
        for i, job in enumerate(self.jobs):
            if job.priority_class is not None and job.priority_class not in classes:
                _fail(("jobs", i, "priorityClass"),
                      f"unknown priority class {job.priority_class!r}; known: {', '.join(sorted(classes))}")
            for k, node in enumerate(job.running.nodes if job.running else []):
                if node != AUTO and node not in nodes:
                    _fail(("jobs", i, "running", "nodes", k), f"node {node!r} does not exist")
            for pod, _ in job.pods():
                other = pod_names.setdefault(f"{job.namespace}/{pod}", job.name)
                if other != job.name:
                    _fail(("jobs", i, "name"), f"pod {pod!r} of this job has the same name as one of job {other!r}")
        return self

    def _check_ceilings(self) -> None:
        """Refuse a scenario that would create more objects than a ceiling (kai_opt.limits), before any is made."""
        sections = {"Node": "nodePools", "GPU devices": "nodePools", "Pod": "jobs", "PodGroup": "jobs",
                    "Queue": "queues"}
        counts = {"Node": sum(p.count for p in self.node_pools),
                  "GPU devices": sum(p.count * p.template.gpus for p in self.node_pools),
                  "Pod": sum(j.total_replicas for j in self.jobs),
                  "PodGroup": len(self.jobs),
                  "Queue": len(self.flat_queues())}
        over = over_ceiling(counts)
        if over is not None:
            _fail((sections[over[0]],), f"asks for {over[1]}")

    def flat_queues(self) -> list[tuple[QueueSpec, str | None, tuple[str | int, ...]]]:
        """Every queue with its parent name and its location in the document, parents before children."""
        out: list[tuple[QueueSpec, str | None, tuple[str | int, ...]]] = []

        def walk(q: QueueSpec, parent: str | None, loc: tuple[str | int, ...]) -> None:
            out.append((q, parent, loc))
            for i, child in enumerate(q.children):
                walk(child, q.name, (*loc, "children", i))

        for i, q in enumerate(self.queues):
            walk(q, q.parent, ("queues", i))
        return out


def _unique(section: str, names: list[str], what: str) -> None:
    _unique_at([((section, i, "name"), n) for i, n in enumerate(names)], what)


def _unique_at(named: list[tuple[tuple[str | int, ...], str]], what: str) -> None:
    seen: set[str] = set()
    for loc, name in named:
        if name in seen:
            _fail(loc, f"duplicate {what} name {name!r}")
        seen.add(name)


def scenario_json_schema() -> dict[str, Any]:
    """JSON Schema of the scenario format (for editors; committed as kai_opt/schemas/scenario.schema.json)."""
    schema = Scenario.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "kai-opt Scenario", **{
        k: v for k, v in schema.items() if k != "title"}}


# -- errors: pydantic locations -> file line, scenario object, field -------------------------------------------------
_OBJECT_LISTS = {"topologies": "topology", "nodePools": "nodePool", "queues": "queue", "children": "queue",
                 "priorityClasses": "priorityClass", "jobs": "job"}


def scenario_error(doc: Document, loc: tuple[str | int, ...], message: str) -> InputError:
    """An InputError for the value at `loc` of the scenario document."""
    obj, field = _object_and_field(doc.data, loc)
    return InputError(message, source=doc.source, line=_line_of(doc, loc) or doc.line, obj=obj, field=field)


def _object_and_field(data: Any, loc: tuple[str | int, ...]) -> tuple[str, str | None]:
    obj, start, cur = "Scenario", 0, data
    for i, part in enumerate(loc):
        if isinstance(part, int) and i > 0 and loc[i - 1] in _OBJECT_LISTS:
            item = cur[part] if isinstance(cur, list) and part < len(cur) else None
            kind = _OBJECT_LISTS[str(loc[i - 1])]
            obj = f"Scenario {kind} {_label(kind, item, part)}"
            start = i + 1
        if isinstance(cur, dict):
            cur = cur.get(part)
        elif isinstance(cur, list) and isinstance(part, int) and part < len(cur):
            cur = cur[part]
        else:
            cur = None
    field = ""
    for part in loc[start:]:
        field += f"[{part}]" if isinstance(part, int) else (f".{part}" if field else str(part))
    return obj, field or None


def _label(kind: str, item: Any, index: int) -> str:
    if not isinstance(item, dict) or not item.get("name"):
        return f"#{index + 1}"
    return f"{item.get('namespace') or 'default'}/{item['name']}" if kind == "job" else str(item["name"])


def _line_of(doc: Document, loc: tuple[str | int, ...]) -> int | None:
    """The line of the value at `loc`, found by re-reading the YAML file (None when that fails)."""
    try:
        text = Path(doc.source).read_text(encoding="utf-8")
        node = next((n for n in yaml.compose_all(text, Loader=yaml.SafeLoader)
                     if n is not None and n.start_mark.line + 1 == doc.line), None)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for part in loc:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
    return node.start_mark.line + 1 if node is not None else line


def _message(err: Any) -> str:
    kind, msg = err["type"], str(err["msg"])
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        allowed = _fields_at(err["loc"][:-1])
        return "unknown field" + (f"; expected one of: {', '.join(allowed)}" if allowed else "")
    if kind in ("value_error", "scenario"):
        return msg.removeprefix("Value error, ")
    shown = repr(err.get("input"))
    return f"{msg}, got {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """The field names (aliases) the model at `loc` accepts."""
    model: Any = Scenario
    for part in loc:
        if isinstance(part, int):
            continue
        fld = next((f for f in model.model_fields.values() if f.alias == part), None)
        model = _model_in(fld.annotation) if fld is not None else None
        if model is None:
            return []
    return [f.alias or name for name, f in model.model_fields.items()]


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def load_scenario(doc: Document) -> Scenario:
    """Validate a scenario document; the first problem raises an InputError."""
    try:
        return Scenario.model_validate(doc.data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise scenario_error(doc, tuple(first["loc"]), _message(first)) from None


# -- conversion to Kubernetes objects --------------------------------------------------------------------------------
class _Room:
    """What is still free on one node while running replicas are placed."""

    def __init__(self, name: str, labels: dict[str, str], template: NodeTemplate) -> None:
        self.name, self.labels = name, labels
        self.taints = template.taints
        self.cpu = to_internal("cpu", template.cpu)
        self.memory = to_internal("memory", template.memory)
        self.pods = template.pods
        self.gpu_memory_mib = template.gpu_memory_mib
        self.devices = [0] * template.gpus  # milli-GPUs used per device

    def admits(self, pod: PodSpec, tolerations: list[Toleration]) -> bool:
        if any(self.labels.get(k) != v for k, v in pod.node_selector.items()):
            return False
        return all(t.effect not in ("NoSchedule", "NoExecute")
                   or any(tol.tolerates(t.key, t.value, t.effect) for tol in tolerations) for t in self.taints)

    def take(self, pod: PodSpec) -> list[int] | None:
        """Reserve room for one replica; the GPU devices it gets, or None when it does not fit."""
        cpu = to_internal("cpu", pod.cpu) if pod.cpu else 0
        mem = to_internal("memory", pod.memory) if pod.memory else 0
        if cpu > self.cpu or mem > self.memory or self.pods < 1:
            return None
        devices = self._devices(pod)
        if devices is None:
            return None
        self.cpu, self.memory, self.pods = self.cpu - cpu, self.memory - mem, self.pods - 1
        for d, amount in devices:
            self.devices[d] += amount
        return [d for d, _ in devices]

    def _devices(self, pod: PodSpec) -> list[tuple[int, int]] | None:
        if pod.gpus:
            free = [d for d, used in enumerate(self.devices) if used == 0][: pod.gpus]
            return [(d, GPU_MILLI) for d in free] if len(free) == pod.gpus else None
        if pod.gpu_fraction is not None:
            amount = max(1, round(pod.gpu_fraction * GPU_MILLI))
        elif pod.gpu_memory_mib is not None:
            amount = min(GPU_MILLI, -(-pod.gpu_memory_mib * GPU_MILLI // self.gpu_memory_mib))
        else:
            return []
        chosen: list[int] = []
        for _ in range(pod.gpu_fraction_num_devices):  # the fullest device it fits on, else a fresh one
            fits = [d for d, used in enumerate(self.devices) if d not in chosen and used + amount <= GPU_MILLI]
            if not fits:
                return None
            chosen.append(max(fits, key=lambda d: (self.devices[d], -d)))
        return [(d, amount) for d in chosen]


def _node_objects(sc: Scenario) -> tuple[list[tuple[dict[str, Any], tuple[str | int, ...]]], list[_Room]]:
    objects, rooms = [], []
    for p, pool in enumerate(sc.node_pools):
        t = pool.template
        for i, name in enumerate(pool.node_names()):
            labels = {HOSTNAME_LABEL: name, **t.labels}
            if t.gpus:
                labels[GPU_MEMORY_LABEL] = str(t.gpu_memory_mib)
                if t.gpu_product:
                    labels[GPU_PRODUCT_LABEL] = t.gpu_product
            labels.update({k: expand_pattern(v, i, pool.name) for k, v in pool.topology.items()})
            resources = {"cpu": t.cpu, "memory": t.memory, "pods": str(t.pods)}
            if t.gpus:
                resources[GPU_RESOURCE] = str(t.gpus)
            objects.append(({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": [x.model_dump() for x in t.taints]} if t.taints else {},
                "status": {"capacity": dict(resources), "allocatable": resources,
                           "conditions": [{"type": "Ready", "status": "True"}]},
            }, ("nodePools", p)))
            rooms.append(_Room(name, labels, t))
            if pool.dra_devices is not None:
                d = pool.dra_devices
                attrs = {k: {"string": v} for k, v in d.attributes.items()}
                objects.append(({"apiVersion": DRA_API, "kind": "ResourceSlice",
                                 "metadata": {"name": f"{name}-{d.driver}"},
                                 "spec": {"driver": d.driver, "nodeName": name,
                                          "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                                          "devices": [{"name": f"{d.prefix}-{k}", "attributes": attrs}
                                                      for k in range(d.count)]}}, ("nodePools", p)))
    return objects, rooms


def _dra_objects(sc: Scenario) -> list[tuple[dict[str, Any], tuple[str | int, ...]]]:
    """DeviceClasses, and per job whose pods ask for devices its ResourceClaimTemplate `<job>-devices`."""
    out: list[tuple[dict[str, Any], tuple[str | int, ...]]] = [
        ({"apiVersion": DRA_API, "kind": "DeviceClass", "metadata": {"name": c.name},
          "spec": {"selectors": [{"cel": {"expression": e}} for e in c.selectors]}}, ("deviceClasses", i))
        for i, c in enumerate(sc.device_classes)]
    for j, job in enumerate(sc.jobs):
        if not job.pod.claims:
            continue
        requests = [{"name": f"r{k}", "exactly": {"deviceClassName": c.device_class, "count": c.count,
                                                  "selectors": [{"cel": {"expression": e}} for e in c.selectors]}}
                    for k, c in enumerate(job.pod.claims)]
        out.append(({"apiVersion": DRA_API, "kind": "ResourceClaimTemplate",
                     "metadata": {"name": f"{job.name}-devices", "namespace": job.namespace},
                     "spec": {"spec": {"devices": {"requests": requests}}}}, ("jobs", j, "pod", "claims")))
    return out


def _queue_objects(sc: Scenario) -> list[tuple[dict[str, Any], tuple[str | int, ...]]]:
    out = []
    for q, parent, loc in sc.flat_queues():
        spec: dict[str, Any] = {
            "priority": q.priority,
            "resources": {r: getattr(q, r).model_dump(by_alias=True) for r in ("gpu", "cpu", "memory")},
        }
        if parent:
            spec["parentQueue"] = parent
        if q.preempt_min_runtime is not None:
            spec["preemptMinRuntime"] = q.preempt_min_runtime
        if q.reclaim_min_runtime is not None:
            spec["reclaimMinRuntime"] = q.reclaim_min_runtime
        out.append(({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": q.name},
                     "spec": spec}, loc))
    return out


def _job_objects(sc: Scenario, doc: Document, now: float,
                 rooms: list[_Room]) -> list[tuple[dict[str, Any], tuple[str | int, ...]]]:
    by_name = {r.name: r for r in rooms}
    out: list[tuple[dict[str, Any], tuple[str | int, ...]]] = []
    for j, job in enumerate(sc.jobs):
        loc: tuple[str | int, ...] = ("jobs", j)
        started = now - job.running.started_seconds_ago if job.running else None
        created_ago = job.created_seconds_ago
        if created_ago is None:
            created_ago = (job.running.started_seconds_ago if job.running else 0) + len(sc.jobs) - j
        created = format_time(now - created_ago)
        pg_meta: dict[str, Any] = {"name": job.name, "namespace": job.namespace, "creationTimestamp": created}
        if started is not None:
            pg_meta["annotations"] = {LAST_START_ANNOTATION: format_time(started)}
        spec: dict[str, Any] = {"minMember": job.gang_size, "queue": job.queue}
        if job.priority_class:
            spec["priorityClassName"] = job.priority_class
        if job.preemptibility:
            spec["preemptibility"] = job.preemptibility
        if job.topology:
            spec["topologyConstraint"] = job.topology.k8s()
        if job.sub_groups:
            spec["subGroups"] = [
                {"name": s.name, "minMember": s.min_member,
                 **({"parent": s.parent} if s.parent else {}),
                 **({"topologyConstraint": s.topology.k8s()} if s.topology else {})}
                for s in job.sub_groups]
        out.append(({"apiVersion": "scheduling.run.ai/v2alpha2", "kind": "PodGroup", "metadata": pg_meta,
                     "spec": spec}, loc))
        tolerations = [Toleration(**t.model_dump()) for t in job.pod.tolerations]
        placements = job.running.nodes if job.running else []
        for r, (pod_name, subgroup) in enumerate(job.pods()):
            pod = _pod_object(sc, job, pod_name, subgroup, created)
            if r < len(placements):
                try:
                    node, devices = _place(job, pod_name, placements[r], tolerations, rooms, by_name)
                except ValueError as exc:
                    raise scenario_error(doc, (*loc, "running", "nodes", r), str(exc)) from None
                pod["spec"]["nodeName"] = node
                pod["status"] = {"phase": "Running", "startTime": format_time(started)}
                if devices:
                    pod["metadata"]["annotations"][GPU_DEVICES_ANNOTATION] = ",".join(map(str, devices))
            elif job.gated:
                pod["spec"]["schedulingGates"] = [{"name": GATE_NAME}]
            out.append((pod, loc))
    return out


def _place(job: JobSpec, pod_name: str, node: str, tolerations: list[Toleration], rooms: list[_Room],
           by_name: dict[str, _Room]) -> tuple[str, list[int]]:
    """The node and GPU devices of one running replica; ValueError when there is no room."""
    if node != AUTO:
        devices = by_name[node].take(job.pod)
        if devices is None:
            raise ValueError(f"node {node!r} has no room left for pod {pod_name}")
        return node, devices
    for room in rooms:
        if room.admits(job.pod, tolerations):
            devices = room.take(job.pod)
            if devices is not None:
                return room.name, devices
    raise ValueError(f"no node has room for pod {pod_name} (auto placement, in node order)")


def _pod_object(sc: Scenario, job: JobSpec, name: str, subgroup: str | None, created: str | None) -> dict[str, Any]:
    p = job.pod
    labels = {QUEUE_LABEL: job.queue}
    if subgroup:
        labels[SUBGROUP_LABEL] = subgroup
    annotations = {PODGROUP_ANNOTATION: job.name}
    if p.gpu_fraction is not None:
        annotations[GPU_FRACTION_ANNOTATION] = str(p.gpu_fraction)
    if p.gpu_memory_mib is not None:
        annotations[GPU_MEMORY_ANNOTATION] = str(p.gpu_memory_mib)
    if p.gpu_fraction_num_devices > 1:
        annotations[GPU_FRACTION_NUM_DEVICES_ANNOTATION] = str(p.gpu_fraction_num_devices)
    requests = {k: v for k, v in (("cpu", p.cpu), ("memory", p.memory)) if v is not None}
    resources: dict[str, Any] = {"requests": requests}
    if p.gpus:
        resources["limits"] = {GPU_RESOURCE: str(p.gpus)}
    spec: dict[str, Any] = {
        "schedulerName": job.scheduler_name or sc.scheduler_name,
        "containers": [{"name": "main", "resources": resources}],
    }
    if job.priority_class:
        spec["priorityClassName"] = job.priority_class
    if p.node_selector:
        spec["nodeSelector"] = dict(p.node_selector)
    if p.tolerations:
        spec["tolerations"] = [t.model_dump() for t in p.tolerations]
    if p.claims:
        spec["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": f"{job.name}-devices"}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": job.namespace, "creationTimestamp": created,
                         "labels": labels, "annotations": annotations},
            "spec": spec, "status": {"phase": "Pending"}}


def scenario_objects(sc: Scenario, doc: Document, now: float) -> list[tuple[dict[str, Any], tuple[str | int, ...]]]:
    """Kubernetes object dicts of a validated scenario, each with the location of the scenario object it came
    from."""
    nodes, rooms = _node_objects(sc)
    topologies = [({"apiVersion": "kai.scheduler/v1alpha1", "kind": "Topology", "metadata": {"name": t.name},
                    "spec": {"levels": [{"nodeLabel": lvl} for lvl in t.levels]}}, ("topologies", i))
                  for i, t in enumerate(sc.topologies)]
    classes = [({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": pc.name},
                 "value": pc.value, "globalDefault": pc.global_default, "preemptionPolicy": pc.preemption_policy},
                ("priorityClasses", i)) for i, pc in enumerate(sc.priority_classes)]
    return nodes + topologies + _queue_objects(sc) + classes + _dra_objects(sc) + _job_objects(sc, doc, now, rooms)


def snapshot_from_scenario(doc: Document, *, scheduler_names: tuple[str, ...] | None = None,
                           now: float | None = None) -> Snapshot:
    """Validate a `kind: Scenario` document, convert it to Kubernetes objects and load them as a Snapshot."""
    sc = load_scenario(doc)
    if now is None and sc.now is not None:
        when = sc.now if sc.now.tzinfo else sc.now.replace(tzinfo=UTC)
        now = when.timestamp()
    objects = scenario_objects(sc, doc, time.time() if now is None else now)
    origin = {_ident(obj): loc for obj, loc in objects}
    raws = [RawObject(obj["kind"], obj, doc.source, None) for obj, _ in objects]
    try:
        return Snapshot.from_objects(raws, scheduler_names=scheduler_names or (sc.scheduler_name,), now=now,
                                     source=doc.source)
    except InputError as exc:  # a check the scenario models missed: point at the scenario object anyway
        loc = origin.get(exc.obj or "")
        if loc is None:
            raise
        err = scenario_error(doc, loc, exc.message)
        raise InputError(exc.message, source=err.source, line=err.line, obj=f"{err.obj} ({exc.obj})",
                         field=exc.field) from None


def _ident(obj: dict[str, Any]) -> str:
    md = obj["metadata"]
    return f"{obj['kind']} {md['namespace']}/{md['name']}" if md.get("namespace") else f"{obj['kind']} {md['name']}"
