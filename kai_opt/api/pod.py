"""Pod: what it asks for (effective requests, GPU sharing), where it may go, and where it is."""

from __future__ import annotations

from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Any

from pydantic import BaseModel, field_validator, model_validator

from kai_opt.api.dra import PodClaim, parse_pod_claims
from kai_opt.api.meta import (
    MODEL,
    LabelSelector,
    NamespacedModel,
    NodeSelectorTerm,
    ObjectMeta,
    PodAffinityTerm,
    Toleration,
    as_dict,
    as_list,
    ident,
    parse_requirements,
    parse_time,
    str_map,
)
from kai_opt.api.node import parse_resource_list
from kai_opt.api.trusted import is_opt_str, trusted
from kai_opt.errors import InputError
from kai_opt.limits import INT32_MAX, INT32_MIN, MAX_GPU_MEMORY_MIB, MAX_GPUS_PER_NODE, number
from kai_opt.units import GPU_RESOURCE

# KAI-Scheduler's pod annotations and labels
GPU_FRACTION_ANNOTATION = "gpu-fraction"
GPU_MEMORY_ANNOTATION = "gpu-memory"
GPU_FRACTION_NUM_DEVICES_ANNOTATION = "gpu-fraction-num-devices"
PODGROUP_ANNOTATION = "pod-group-name"
QUEUE_LABEL = "kai.scheduler/queue"
LEGACY_QUEUE_LABEL = "runai/queue"
SUBGROUP_LABEL = "kai.scheduler/subgroup-name"
GPU_GROUP_LABEL = "runai-gpu-group"
# kai-opt's own record of the GPU devices a pod was given (written by the binder)
GPU_DEVICES_ANNOTATION = "kai-opt.io/gpu-devices"


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class PreferredTerm(BaseModel):
    model_config = MODEL
    weight: int
    term: NodeSelectorTerm


class Pod(NamespacedModel, BaseModel):
    meta: ObjectMeta
    scheduler_name: str = "default-scheduler"
    phase: PodPhase = PodPhase.PENDING
    node_name: str | None = None
    nominated_node: str | None = None  # status.nominatedNodeName: placed onto resources still being released
    requests: dict[str, int] = {}  # effective requests, internal units (kai_opt.units), incl. "pods": 1
    gpu_fraction: float | None = None  # 0 < f < 1 of one device (per device when num_devices > 1)
    gpu_memory_mib: int | None = None  # GPU memory per device, converted with the node's GPU memory
    gpu_fraction_num_devices: int = 1
    podgroup: str | None = None
    queue: str | None = None
    subgroup: str | None = None
    priority: int | None = None
    priority_class_name: str | None = None
    node_selector: dict[str, str] = {}
    node_affinity: tuple[NodeSelectorTerm, ...] = ()  # required terms, ORed; empty = no constraint
    node_affinity_preferred: tuple[PreferredTerm, ...] = ()
    pod_affinity: tuple[PodAffinityTerm, ...] = ()  # required
    pod_anti_affinity: tuple[PodAffinityTerm, ...] = ()  # required
    tolerations: tuple[Toleration, ...] = ()
    scheduling_gates: tuple[str, ...] = ()
    start_time: float | None = None
    gpu_devices: tuple[int, ...] | None = None  # devices already assigned (running pods)
    gpu_group: str | None = None  # KAI's shared-GPU group id of a fractional pod
    resource_claims: tuple[PodClaim, ...] = ()  # spec.resourceClaims (DRA)
    dra_gpus: int = 0  # GPU devices its claims hold or ask for (set by kai_opt.dra; count as GPUs for queues)
    dra_nodes: tuple[str, ...] | None = None  # the nodes its DRA claims allow (set by kai_opt.dra); None: any

    @field_validator("gpu_fraction")
    @classmethod
    def _fraction_in_open_unit_interval(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v < 1:
            raise ValueError(f"gpu-fraction must be in (0, 1), got {v}")
        return v

    @field_validator("gpu_memory_mib")
    @classmethod
    def _gpu_memory_positive(cls, v: int | None) -> int | None:
        if v is not None and v <= 0:
            raise ValueError(f"gpu-memory must be a positive number of MiB, got {v}")
        return v

    @field_validator("gpu_fraction_num_devices")
    @classmethod
    def _num_devices_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"gpu-fraction-num-devices must be >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _sharing_excludes_whole_gpus(self) -> Pod:
        if (self.gpu_fraction is not None or self.gpu_memory_mib is not None) and self.requests.get(GPU_RESOURCE):
            raise ValueError("gpu-fraction/gpu-memory cannot be combined with a whole-GPU request")
        if self.gpu_fraction is not None and self.gpu_memory_mib is not None:
            raise ValueError("gpu-fraction and gpu-memory are mutually exclusive")
        return self

    # -- convenience ---------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.meta.name


    @cached_property
    def group_key(self) -> str | None:
        """`namespace/name` of the PodGroup the pod names (None: none)."""
        return f"{self.namespace}/{self.podgroup}" if self.podgroup else None

    @property
    def labels(self) -> dict[str, str]:
        return self.meta.labels

    @property
    def whole_gpus(self) -> int:
        return self.requests.get(GPU_RESOURCE, 0) // 1000

    @property
    def shares_gpu(self) -> bool:
        return self.gpu_fraction is not None or self.gpu_memory_mib is not None

    @property
    def finished(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)

    @property
    def releasing(self) -> bool:
        return self.meta.deletion_timestamp is not None and not self.finished

    # -- conversion ----------------------------------------------------------------------------------------------
    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> Pod:
        who = ident("Pod", obj)
        meta = ObjectMeta.from_k8s("Pod", obj, namespaced=True, who=who)
        spec = obj.get("spec")
        if type(spec) is not dict:
            spec = as_dict(spec, obj=who, field="spec")
        status = obj.get("status")
        if type(status) is not dict:
            status = as_dict(status, obj=who, field="status")
        ann, labels = meta.annotations, meta.labels
        requests = effective_requests(spec, who)
        fraction = _float_annotation(ann, GPU_FRACTION_ANNOTATION, who)
        gpu_mem = _int_annotation(ann, GPU_MEMORY_ANNOTATION, who, MAX_GPU_MEMORY_MIB)
        num_dev = _int_annotation(ann, GPU_FRACTION_NUM_DEVICES_ANNOTATION, who, MAX_GPUS_PER_NODE)
        priority = spec.get("priority")
        affinity = as_dict(spec.get("affinity"), obj=who, field="spec.affinity")
        phase = status.get("phase") or "Pending"
        if not isinstance(phase, str) or phase not in _PHASES:
            raise InputError(f"unknown phase {phase!r}", obj=who, field="status.phase")
        devices = None
        if ann.get(GPU_DEVICES_ANNOTATION):
            try:
                devices = _device_list(ann[GPU_DEVICES_ANNOTATION])
                if any(not 0 <= d < MAX_GPUS_PER_NODE for d in devices):
                    raise ValueError("device index out of range")
            except ValueError as exc:
                raise InputError(f"expected comma-separated device indexes, got {ann[GPU_DEVICES_ANNOTATION]!r}",
                                 obj=who, field=f"metadata.annotations.{GPU_DEVICES_ANNOTATION}") from exc
        raw_gates = spec.get("schedulingGates")
        gates = () if raw_gates is None else tuple(
            str(as_dict(g, obj=who, field="spec.schedulingGates").get("name", ""))
            for g in as_list(raw_gates, obj=who, field="spec.schedulingGates"))
        try:  # ValueErrors of the helpers below and pydantic's become one-line InputErrors
            fields = {
                "meta": meta,
                "scheduler_name": str(spec.get("schedulerName") or "default-scheduler"),
                "phase": _PHASES[phase],
                "node_name": spec.get("nodeName") or None,
                "nominated_node": status.get("nominatedNodeName") or None,
                "requests": requests,
                "gpu_fraction": fraction,
                "gpu_memory_mib": gpu_mem,
                "gpu_fraction_num_devices": num_dev if num_dev is not None else 1,
                "podgroup": ann.get(PODGROUP_ANNOTATION) or labels.get(PODGROUP_ANNOTATION) or None,
                "queue": labels.get(QUEUE_LABEL) or labels.get(LEGACY_QUEUE_LABEL) or None,
                "subgroup": labels.get(SUBGROUP_LABEL) or None,
                "priority": priority,
                "priority_class_name": spec.get("priorityClassName") or None,
                "node_selector": str_map(spec.get("nodeSelector"), obj=who, field="spec.nodeSelector"),
                "node_affinity": _node_affinity_required(affinity, who) if affinity else (),
                "node_affinity_preferred": _node_affinity_preferred(affinity, who) if affinity else (),
                "pod_affinity": _pod_affinity_terms(affinity, "podAffinity", who) if affinity else (),
                "pod_anti_affinity": _pod_affinity_terms(affinity, "podAntiAffinity", who) if affinity else (),
                "tolerations": _tolerations(spec, who),
                "scheduling_gates": gates,
                "start_time": parse_time(status.get("startTime"), obj=who, field="status.startTime"),
                "gpu_devices": devices,
                "gpu_group": labels.get(GPU_GROUP_LABEL) or None,
                "resource_claims": parse_pod_claims(spec, status, who),
                "dra_gpus": 0,
                "dra_nodes": None,
            }
            pod = trusted(cls, fields) if _checked(fields) else cls(**fields)
        except ValueError as exc:  # pydantic ValidationError is a ValueError
            raise InputError(_first_error(exc), obj=who, field=_annotation_field(exc)) from exc
        if pod.priority is not None:  # Kubernetes: int32 (checked once pydantic has converted "5" or 5.0)
            number(pod.priority, obj=who, field="spec.priority", lo=INT32_MIN, hi=INT32_MAX, whole=True)
        return pod


_PHASES: dict[object, PodPhase] = {p.value: p for p in PodPhase}


@lru_cache(maxsize=1 << 12)
def _device_list(text: str) -> tuple[int, ...]:
    """`kai-opt.io/gpu-devices` ("0,1,2") as device indexes (few distinct values: each is parsed once)."""
    return tuple(int(x) for x in text.split(",") if x.strip())


def _checked(f: dict[str, Any]) -> bool:
    """Whether `Pod(**f)` would keep every value as it is: the values not converted by `from_k8s` have their
    field's type, and the sharing rules of `_sharing_excludes_whole_gpus` hold (annotations are range-checked)."""
    priority = f["priority"]
    sharing = f["gpu_fraction"] is not None or f["gpu_memory_mib"] is not None
    return (is_opt_str(f["node_name"]) and is_opt_str(f["nominated_node"]) and is_opt_str(f["priority_class_name"])
            and (priority is None or type(priority) is int)
            and not (sharing and (f["requests"].get(GPU_RESOURCE)
                                  or (f["gpu_fraction"] is not None and f["gpu_memory_mib"] is not None))))


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return str(first.get("msg", exc)).removeprefix("Value error, ")
    return str(exc)


def _annotation_field(exc: ValueError) -> str | None:
    msg = _first_error(exc)
    for name in (GPU_FRACTION_NUM_DEVICES_ANNOTATION, GPU_FRACTION_ANNOTATION, GPU_MEMORY_ANNOTATION):
        if name in msg:
            return f"metadata.annotations.{name}"
    return None


def _float_annotation(ann: dict[str, str], key: str, who: str) -> float | None:
    raw = ann.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError as exc:
        raise InputError(f"expected a number, got {raw!r}", obj=who, field=f"metadata.annotations.{key}") from exc
    if not 0 < value < 1:
        raise InputError(f"must be in (0, 1), got {raw}", obj=who, field=f"metadata.annotations.{key}")
    return value


def _int_annotation(ann: dict[str, str], key: str, who: str, hi: int) -> int | None:
    raw = ann.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise InputError(f"expected a whole number, got {raw!r}", obj=who, field=f"metadata.annotations.{key}") from exc
    if value < 1:
        raise InputError(f"must be >= 1, got {raw}", obj=who, field=f"metadata.annotations.{key}")
    return number(value, obj=who, field=f"metadata.annotations.{key}", lo=1, hi=hi, whole=True)


def _container_requests(c: dict[str, Any], who: str, field: str) -> dict[str, int]:
    res = c.get("resources")
    if type(res) is not dict:
        res = as_dict(res, obj=who, field=f"{field}.resources")
    raw_limits = res.get("limits")
    limits = {} if raw_limits is None else parse_resource_list(raw_limits, obj=who,
                                                             field=f"{field}.resources.limits")
    requests = parse_resource_list(res.get("requests"), obj=who, field=f"{field}.resources.requests")
    for k, v in limits.items():  # API defaulting: a request left out takes the limit
        requests.setdefault(k, v)
    return requests


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _max(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for k, v in b.items():
        out[k] = max(out.get(k, 0), v)
    return out


def effective_requests(spec: dict[str, Any], who: str) -> dict[str, int]:
    """What kube-scheduler reserves: max(sum of app containers + sidecars, any init step) + overhead, plus 1 pod."""
    total: dict[str, int] = {}
    for i, c in enumerate(as_list(spec.get("containers"), obj=who, field="spec.containers")):
        if type(c) is not dict:
            c = as_dict(c, obj=who, field=f"spec.containers[{i}]")
        total = _add(total, _container_requests(c, who, f"spec.containers[{i}]"))
    inits = spec.get("initContainers")
    if inits is not None:
        sidecars: dict[str, int] = {}
        init_peak: dict[str, int] = {}
        for i, c in enumerate(as_list(inits, obj=who, field="spec.initContainers")):
            c = as_dict(c, obj=who, field=f"spec.initContainers[{i}]")
            req = _container_requests(c, who, f"spec.initContainers[{i}]")
            if c.get("restartPolicy") == "Always":  # native sidecar: runs alongside the app containers
                total = _add(total, req)
                sidecars = _add(sidecars, req)
            else:
                init_peak = _max(init_peak, _add(req, sidecars))
        total = _max(total, init_peak)
    overhead = spec.get("overhead")
    if overhead is not None:
        total = _add(total, parse_resource_list(overhead, obj=who, field="spec.overhead"))
    total["pods"] = 1
    return {k: v for k, v in total.items() if v or k == "pods"}


def _node_affinity_required(affinity: dict[str, Any], who: str) -> tuple[NodeSelectorTerm, ...]:
    na = as_dict(affinity.get("nodeAffinity"), obj=who, field="spec.affinity.nodeAffinity")
    req = as_dict(na.get("requiredDuringSchedulingIgnoredDuringExecution"), obj=who,
                  field="spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution")
    base = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
    return tuple(_term(t, who, f"{base}[{i}]")
                 for i, t in enumerate(as_list(req.get("nodeSelectorTerms"), obj=who, field=base)))


def _node_affinity_preferred(affinity: dict[str, Any], who: str) -> tuple[PreferredTerm, ...]:
    na = as_dict(affinity.get("nodeAffinity"), obj=who, field="spec.affinity.nodeAffinity")
    base = "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution"
    out = []
    for i, p in enumerate(as_list(na.get("preferredDuringSchedulingIgnoredDuringExecution"), obj=who, field=base)):
        p = as_dict(p, obj=who, field=f"{base}[{i}]")
        weight = p.get("weight", 1)
        number(weight, obj=who, field=f"{base}[{i}].weight", lo=INT32_MIN, hi=INT32_MAX, whole=True)
        out.append(PreferredTerm(weight=weight, term=_term(p.get("preference"), who,
                                                                           f"{base}[{i}].preference")))
    return tuple(out)


def _term(raw: Any, who: str, field: str) -> NodeSelectorTerm:
    raw = as_dict(raw, obj=who, field=field)
    return NodeSelectorTerm(
        match_expressions=parse_requirements(raw.get("matchExpressions"), obj=who, field=f"{field}.matchExpressions"),
        match_fields=parse_requirements(raw.get("matchFields"), obj=who, field=f"{field}.matchFields"),
    )


def _pod_affinity_terms(affinity: dict[str, Any], kind: str, who: str) -> tuple[PodAffinityTerm, ...]:
    pa = as_dict(affinity.get(kind), obj=who, field=f"spec.affinity.{kind}")
    base = f"spec.affinity.{kind}.requiredDuringSchedulingIgnoredDuringExecution"
    out = []
    for i, t in enumerate(as_list(pa.get("requiredDuringSchedulingIgnoredDuringExecution"), obj=who, field=base)):
        t = as_dict(t, obj=who, field=f"{base}[{i}]")
        key = t.get("topologyKey")
        if not key:
            raise InputError("topologyKey is required", obj=who, field=f"{base}[{i}].topologyKey")
        out.append(PodAffinityTerm(
            selector=LabelSelector.from_k8s(t.get("labelSelector"), obj=who, field=f"{base}[{i}].labelSelector"),
            topology_key=str(key),
            namespaces=tuple(str(n) for n in as_list(t.get("namespaces"), obj=who, field=f"{base}[{i}].namespaces")),
        ))
    return tuple(out)


def _tolerations(spec: dict[str, Any], who: str) -> tuple[Toleration, ...]:
    raw = spec.get("tolerations")
    if raw is None:
        return ()
    out = []
    for i, t in enumerate(as_list(raw, obj=who, field="spec.tolerations")):
        t = as_dict(t, obj=who, field=f"spec.tolerations[{i}]")
        op = t.get("operator") or "Equal"
        if op not in ("Equal", "Exists"):
            raise InputError(f"unknown operator {op!r}", obj=who, field=f"spec.tolerations[{i}].operator")
        out.append(Toleration(key=str(t.get("key") or ""), operator=op, value=str(t.get("value") or ""),
                              effect=str(t.get("effect") or "")))
    return tuple(out)
