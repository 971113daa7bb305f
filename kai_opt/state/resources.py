"""The resource axis of every node and pod array, and the queue resource axis."""

from __future__ import annotations

from kai_opt.units import GPU_RESOURCE

# Node/pod resource columns (internal units, int64): the first four are fixed, extended resources follow sorted.
BASE_RESOURCES = ("cpu", "memory", GPU_RESOURCE, "pods")
R_CPU, R_MEM, R_GPU, R_PODS = 0, 1, 2, 3

# Queue resources (float64, KAI units): GPU devices (fractions allowed), CPU millicores, memory bytes.
QR = ("gpu", "cpu", "memory")
Q_GPU, Q_CPU, Q_MEM = 0, 1, 2
# node/pod column feeding each queue resource, and the divisor from internal units to KAI units
QR_COLUMN = (R_GPU, R_CPU, R_MEM)
QR_DIVISOR = (1000.0, 1.0, 1.0)


def resource_axis(names: set[str]) -> tuple[str, ...]:
    extra = sorted(n for n in names if n not in BASE_RESOURCES)
    return BASE_RESOURCES + tuple(extra)


def short_name(resource: str) -> str:
    return "gpu" if resource == GPU_RESOURCE else resource
