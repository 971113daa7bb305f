"""Queue `scheduling.run.ai/v2`: an N-level tree with quota / over-quota weight / limit per resource."""

from __future__ import annotations

import contextlib
import math
import re
from typing import Any

from pydantic import BaseModel, field_validator

from kai_opt.api.meta import MODEL, ObjectMeta, as_dict, ident
from kai_opt.errors import InputError
from kai_opt.limits import INT32_MAX, INT32_MIN, MAX_AMOUNT, MAX_DURATION_S, MAX_WEIGHT, number

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
        seconds = float(number(value, obj=obj, field=field, lo=0, hi=MAX_DURATION_S))
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
        if not seconds <= MAX_DURATION_S:  # also inf, from "1e400h"-like digit runs
            raise InputError(f"duration {text[:40]!r} is longer than 100 years", obj=obj, field=field)
    if seconds < 0:
        raise InputError(f"duration must not be negative, got {value!r}", obj=obj, field=field)
    return seconds


_MAX_QUEUE_AMOUNT = {"gpu": MAX_AMOUNT // 1000, "cpu": MAX_AMOUNT, "memory": MAX_AMOUNT // MEMORY_MB}


def _queue_number(raw: Any, who: str, field: str) -> float:
    """A quota, limit or weight: a number, or a numeric string (the CRD's YAML is often written that way)."""
    if isinstance(raw, str):
        with contextlib.suppress(ValueError):  # not a number: number() names what it got
            raw = float(raw)
    if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) > 2**63:
        raise InputError("must be a number the cluster state holds, got one beyond int64", obj=who, field=field)
    return float(number(raw, obj=who, field=field, lo=-math.inf, hi=math.inf))


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
                v = _queue_number(raw[src], who, field)
                if dst == "over_quota_weight":
                    number(v, obj=who, field=field, lo=0, hi=MAX_WEIGHT)
                else:  # in the CRD's unit; the amount in internal units must be one the state holds
                    number(v, obj=who, field=field, lo=0, hi=_MAX_QUEUE_AMOUNT[res], unlimited=UNLIMITED)
                values[dst] = v * scale if v != UNLIMITED and dst != "over_quota_weight" else v
            parsed[res] = QueueResource(**values)
        priority = spec.get("priority")
        if priority is not None:
            number(priority, obj=who, field="spec.priority", lo=INT32_MIN, hi=INT32_MAX, whole=True)
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
