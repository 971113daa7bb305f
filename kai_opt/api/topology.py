"""Topology `kai.scheduler/v1alpha1`: ordered node-label levels, top (e.g. zone) to bottom (e.g. hostname)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, field_validator

from kai_opt.api.meta import MODEL, ObjectMeta, as_dict, as_list, ident
from kai_opt.errors import InputError


class Topology(BaseModel):
    model_config = MODEL
    meta: ObjectMeta
    levels: tuple[str, ...]  # node label keys, top -> bottom

    @field_validator("levels")
    @classmethod
    def _levels_unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a topology needs at least one level")
        if len(set(v)) != len(v):
            raise ValueError("topology levels must be unique")
        return v

    @property
    def name(self) -> str:
        return self.meta.name

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> Topology:
        who = ident("Topology", obj)
        meta = ObjectMeta.from_k8s("Topology", obj, namespaced=False)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        levels = []
        for i, lvl in enumerate(as_list(spec.get("levels"), obj=who, field="spec.levels")):
            label = as_dict(lvl, obj=who, field=f"spec.levels[{i}]").get("nodeLabel")
            if not label:
                raise InputError("nodeLabel is required", obj=who, field=f"spec.levels[{i}].nodeLabel")
            levels.append(str(label))
        if not levels:
            raise InputError("a topology needs at least one level", obj=who, field="spec.levels")
        if len(set(levels)) != len(levels):
            raise InputError("levels must be unique", obj=who, field="spec.levels")
        return cls(meta=meta, levels=tuple(levels))
