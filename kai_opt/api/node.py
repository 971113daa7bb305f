"""Node: allocatable resources, GPU labels, taints, schedulability."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kai_opt.api.meta import MODEL, ObjectMeta, as_dict, as_list, ident
from kai_opt.errors import InputError
from kai_opt.limits import MAX_GPU_MEMORY_MIB, number
from kai_opt.units import GPU_RESOURCE, QuantityError, to_internal

GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # MiB per device (GPU feature discovery)
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
DEFAULT_GPU_MEMORY_MIB = 81920  # accounting only, for a GPU node without the memory label: gpu-memory requests
# are never placed on such a node (see Node.gpu_memory_known)


class Taint(BaseModel):
    model_config = MODEL
    key: str
    value: str = ""
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute


def parse_resource_list(raw: Any, *, obj: str, field: str) -> dict[str, int]:
    """A Kubernetes ResourceList in internal units (see kai_opt.units)."""
    out: dict[str, int] = {}
    if type(raw) is not dict:
        raw = as_dict(raw, obj=obj, field=field)
    for name, value in raw.items():
        try:
            out[str(name)] = to_internal(str(name), value)
        except QuantityError as exc:
            raise InputError(str(exc), obj=obj, field=f"{field}.{name}") from exc
    return out


class Node(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    allocatable: dict[str, int]  # internal units; GPU under "nvidia.com/gpu" in milli-GPUs
    capacity: dict[str, int] = {}
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    ready: bool = True

    @property
    def name(self) -> str:
        return self.meta.name

    @property
    def labels(self) -> dict[str, str]:
        return self.meta.labels

    @property
    def gpus(self) -> int:
        """Whole GPU devices."""
        return self.allocatable.get(GPU_RESOURCE, 0) // 1000

    @property
    def gpu_memory_mib(self) -> int:
        raw = self.meta.labels.get(GPU_MEMORY_LABEL)
        try:
            return int(raw) if raw else DEFAULT_GPU_MEMORY_MIB
        except ValueError:
            return DEFAULT_GPU_MEMORY_MIB

    @property
    def gpu_memory_known(self) -> bool:
        """The GPU-memory label holds a positive number of MiB. As KAI-Scheduler, only such a node takes a gpu-memory
        request (without the label its GPU memory is unknown, "not synced" in KAI's words)."""
        raw = self.meta.labels.get(GPU_MEMORY_LABEL, "")
        try:
            return int(raw) > 0
        except ValueError:
            return False

    @property
    def gpu_product(self) -> str:
        return self.meta.labels.get(GPU_PRODUCT_LABEL, "")

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> Node:
        who = ident("Node", obj)
        meta = ObjectMeta.from_k8s("Node", obj, namespaced=False)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        status = as_dict(obj.get("status"), obj=who, field="status")
        capacity = parse_resource_list(status.get("capacity"), obj=who, field="status.capacity")
        allocatable = parse_resource_list(status.get("allocatable"), obj=who, field="status.allocatable")
        if not allocatable:
            allocatable = dict(capacity)
        mem_label = meta.labels.get(GPU_MEMORY_LABEL, "").strip()
        if mem_label.lstrip("+-").isdigit():  # text that is no number keeps the default
            where = f"metadata.labels.{GPU_MEMORY_LABEL}"
            if len(mem_label) > 20:
                raise InputError(f"must be between 1 and {MAX_GPU_MEMORY_MIB:,} MiB, got {len(mem_label)} digits",
                                 obj=who, field=where)
            number(int(mem_label), obj=who, field=where, lo=1, hi=MAX_GPU_MEMORY_MIB)
        gpu = allocatable.get(GPU_RESOURCE, 0)
        if gpu % 1000:
            raise InputError("GPU count must be a whole number", obj=who, field=f"status.allocatable.{GPU_RESOURCE}")
        taints = []
        for i, t in enumerate(as_list(spec.get("taints"), obj=who, field="spec.taints")):
            t = as_dict(t, obj=who, field=f"spec.taints[{i}]")
            if not t.get("key") or not t.get("effect"):
                raise InputError("taint needs key and effect", obj=who, field=f"spec.taints[{i}]")
            taints.append(Taint(key=str(t["key"]), value=str(t.get("value") or ""), effect=str(t["effect"])))
        ready = True
        conditions = as_list(status.get("conditions"), obj=who, field="status.conditions")
        for c in conditions:
            if isinstance(c, dict) and c.get("type") == "Ready":
                ready = str(c.get("status")) == "True"
        return cls(meta=meta, allocatable=allocatable, capacity=capacity, taints=tuple(taints),
                   unschedulable=bool(spec.get("unschedulable", False)), ready=ready)
