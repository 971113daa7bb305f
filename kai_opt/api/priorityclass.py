"""PriorityClass and KAI-Scheduler's default classes."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from kai_opt.api.meta import MODEL, ObjectMeta, ident
from kai_opt.errors import InputError
from kai_opt.limits import INT32_MAX, INT32_MIN, number
from kai_opt.priorities import DEFAULT_PRIORITY_CLASSES, NON_PREEMPTIBLE_PRIORITY  # noqa: F401  (re-exported)


class PriorityClass(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    value: int
    global_default: bool = False
    preemption_policy: str = "PreemptLowerPriority"

    @property
    def name(self) -> str:
        return self.meta.name

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> PriorityClass:
        who = ident("PriorityClass", obj)
        meta = ObjectMeta.from_k8s("PriorityClass", obj, namespaced=False)
        value = obj.get("value")
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"expected a whole number, got {value!r}", obj=who, field="value")
        number(value, obj=who, field="value", lo=INT32_MIN, hi=INT32_MAX, whole=True)  # Kubernetes: int32
        return cls(meta=meta, value=value, global_default=bool(obj.get("globalDefault", False)),
                   preemption_policy=str(obj.get("preemptionPolicy") or "PreemptLowerPriority"))
