"""Queue `scheduling.run.ai/v2`: an N-level tree with quota / over-quota weight / limit per resource."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, field_validator

from kai_opt.api.meta import MODEL, ObjectMeta, as_dict, ident
from kai_opt.errors import InputError

UNLIMITED = -1.0
DEFAULT_QUEUE_PRIORITY = 100
QUEUE_RESOURCES = ("gpu", "cpu", "memory")
MEMORY_MB = 1_000_000  # Queue memory is in megabytes (10^6 bytes), as in KAI

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any, *, obj: str, field: str) -> float | None:
    """A Go duration ("90s", "1h30m") or a number of seconds, as seconds."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        text = str(value).strip()
        pos, seconds = 0, 0.0
        for m in _DURATION.finditer(text):
            if m.start() != pos:
                break
            seconds += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
            pos = m.end()
        if pos != len(text) or not text:
            raise InputError(f"invalid duration {value!r} (e.g. 90s, 5m, 1h30m)", obj=obj, field=field)
    if seconds < 0:
        raise InputError(f"duration must not be negative, got {value!r}", obj=obj, field=field)
    return seconds


class QueueResource(BaseModel):
    """One resource of a queue in internal units (gpu devices, cpu millicores, memory bytes); -1 = unlimited."""

    model_config = MODEL
    quota: float = 0.0  # deserved; -1 = the whole cluster amount
    over_quota_weight: float = 1.0
    limit: float = UNLIMITED

    @field_validator("quota", "limit")
    @classmethod
    def _minus_one_or_non_negative(cls, v: float) -> float:
        if v < 0 and v != UNLIMITED:
            raise ValueError(f"must be >= 0 or -1 (unlimited), got {v:g}")
        return v

    @field_validator("over_quota_weight")
    @classmethod
    def _weight_non_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError(f"must be >= 0, got {v:g}")
        return v


class Queue(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    parent: str | None = None
    priority: int = DEFAULT_QUEUE_PRIORITY
    display_name: str | None = None
    gpu: QueueResource = QueueResource()
    cpu: QueueResource = QueueResource()
    memory: QueueResource = QueueResource()
    preempt_min_runtime_s: float | None = None
    reclaim_min_runtime_s: float | None = None

    @property
    def name(self) -> str:
        return self.meta.name

    def resource(self, name: str) -> QueueResource:
        return getattr(self, name)

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> Queue:
        who = ident("Queue", obj)
        meta = ObjectMeta.from_k8s("Queue", obj, namespaced=False)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        resources = as_dict(spec.get("resources"), obj=who, field="spec.resources")
        parsed: dict[str, QueueResource] = {}
        for res in QUEUE_RESOURCES:
            raw = as_dict(resources.get(res), obj=who, field=f"spec.resources.{res}")
            scale = MEMORY_MB if res == "memory" else 1
            values: dict[str, float] = {}
            for src, dst in (("quota", "quota"), ("overQuotaWeight", "over_quota_weight"), ("limit", "limit")):
                if raw.get(src) is None:
                    continue
                field = f"spec.resources.{res}.{src}"
                try:
                    v = float(raw[src])
                except (TypeError, ValueError) as exc:
                    raise InputError(f"expected a number, got {raw[src]!r}", obj=who, field=field) from exc
                if dst == "over_quota_weight":
                    if v < 0:
                        raise InputError(f"must be >= 0, got {v:g}", obj=who, field=field)
                elif v < 0 and v != UNLIMITED:
                    raise InputError(f"must be >= 0 or -1 (unlimited), got {v:g}", obj=who, field=field)
                values[dst] = v * scale if v != UNLIMITED and dst != "over_quota_weight" else v
            parsed[res] = QueueResource(**values)
        priority = spec.get("priority")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise InputError(f"expected a whole number, got {priority!r}", obj=who, field="spec.priority")
        parent = spec.get("parentQueue") or None
        if parent == meta.name:
            raise InputError("a queue cannot be its own parent", obj=who, field="spec.parentQueue")
        return cls(
            meta=meta,
            parent=parent,
            priority=DEFAULT_QUEUE_PRIORITY if priority is None else priority,
            display_name=spec.get("displayName"),
            preempt_min_runtime_s=parse_duration(spec.get("preemptMinRuntime"), obj=who,
                                                 field="spec.preemptMinRuntime"),
            reclaim_min_runtime_s=parse_duration(spec.get("reclaimMinRuntime"), obj=who,
                                                 field="spec.reclaimMinRuntime"),
            **parsed,
        )
