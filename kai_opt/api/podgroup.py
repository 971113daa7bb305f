"""PodGroup `scheduling.run.ai/v2alpha2`: a gang (minMember) with optional nested sub-groups and topology."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, field_validator, model_validator

from kai_opt.api.meta import MODEL, NamespacedModel, ObjectMeta, as_dict, as_list, ident, parse_time
from kai_opt.api.trusted import is_opt_str, trusted
from kai_opt.errors import InputError
from kai_opt.limits import INT32_MAX, number

STALE_TIMESTAMP_ANNOTATION = "kai.scheduler/stale-podgroup-timestamp"
LAST_START_ANNOTATION = "kai.scheduler/last-start-timestamp"

Preemptibility = Literal["preemptible", "non-preemptible"]


class TopologyConstraint(BaseModel):
    model_config = MODEL
    topology: str | None = None
    required_level: str | None = None  # node label: all pods in one domain of this level
    preferred_level: str | None = None  # node label: best effort

    @property
    def empty(self) -> bool:
        return not (self.required_level or self.preferred_level)

    @classmethod
    def from_k8s(cls, raw: Any, *, obj: str, field: str) -> TopologyConstraint | None:
        if raw is None:
            return None
        raw = as_dict(raw, obj=obj, field=field)
        tc = cls(topology=raw.get("topology") or None, required_level=raw.get("requiredTopologyLevel") or None,
                 preferred_level=raw.get("preferredTopologyLevel") or None)
        return None if tc.empty else tc


class SubGroup(BaseModel):
    model_config = MODEL
    name: str
    min_member: int = 1
    parent: str | None = None
    topology_constraint: TopologyConstraint | None = None

    @field_validator("min_member")
    @classmethod
    def _min_member_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"minMember must be >= 1, got {v}")
        return v


class PodGroup(NamespacedModel, BaseModel):
    meta: ObjectMeta
    min_member: int = 1
    queue: str | None = None
    priority_class_name: str | None = None
    preemptibility: Preemptibility | None = None
    topology_constraint: TopologyConstraint | None = None
    sub_groups: tuple[SubGroup, ...] = ()
    stale_since: float | None = None  # when the running group fell below minMember (KAI annotation)
    last_start: float | None = None

    @field_validator("min_member")
    @classmethod
    def _min_member_positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"minMember must be >= 1, got {v}")
        return v

    @model_validator(mode="after")
    def _subgroup_tree(self) -> PodGroup:
        names = [s.name for s in self.sub_groups]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"duplicate subgroup name {dup!r}")
        parents = {s.name: s.parent for s in self.sub_groups}
        for s in self.sub_groups:
            if s.parent is not None and s.parent not in parents:
                raise ValueError(f"subgroup {s.name!r} names a parent {s.parent!r} that does not exist")
        for s in self.sub_groups:
            seen, cur = {s.name}, s.parent
            while cur is not None:
                if cur in seen:
                    raise ValueError(f"subgroup parent links form a cycle through {cur!r}")
                seen.add(cur)
                cur = parents[cur]
        return self

    @property
    def name(self) -> str:
        return self.meta.name


    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> PodGroup:
        who = ident("PodGroup", obj)
        meta = ObjectMeta.from_k8s("PodGroup", obj, namespaced=True, who=who)
        spec = as_dict(obj.get("spec"), obj=who, field="spec")
        min_member = spec.get("minMember", 1)
        if isinstance(min_member, bool) or not isinstance(min_member, int) or min_member < 1:
            raise InputError(f"must be a whole number >= 1, got {min_member!r}", obj=who, field="spec.minMember")
        number(min_member, obj=who, field="spec.minMember", lo=1, hi=INT32_MAX, whole=True)
        pre = spec.get("preemptibility") or None
        if pre not in (None, "preemptible", "non-preemptible"):
            raise InputError(f"must be preemptible or non-preemptible, got {pre!r}", obj=who,
                             field="spec.preemptibility")
        subs = []
        raw_subs = spec.get("subGroups")
        for i, s in enumerate(() if raw_subs is None else as_list(raw_subs, obj=who, field="spec.subGroups")):
            f = f"spec.subGroups[{i}]"
            s = as_dict(s, obj=who, field=f)
            if not s.get("name"):
                raise InputError("name is required", obj=who, field=f"{f}.name")
            mm = s.get("minMember", 1)
            if isinstance(mm, bool) or not isinstance(mm, int) or mm < 1:
                raise InputError(f"must be a whole number >= 1, got {mm!r}", obj=who, field=f"{f}.minMember")
            number(mm, obj=who, field=f"{f}.minMember", lo=1, hi=INT32_MAX, whole=True)
            subs.append(SubGroup(name=str(s["name"]), min_member=mm, parent=s.get("parent") or None,
                                 topology_constraint=TopologyConstraint.from_k8s(
                                     s.get("topologyConstraint"), obj=who, field=f"{f}.topologyConstraint")))
        ann = meta.annotations
        try:
            fields = {
                "meta": meta,
                "min_member": min_member,
                "queue": spec.get("queue") or None,
                "priority_class_name": spec.get("priorityClassName") or None,
                "preemptibility": pre,
                "topology_constraint": TopologyConstraint.from_k8s(spec.get("topologyConstraint"), obj=who,
                                                                   field="spec.topologyConstraint"),
                "sub_groups": tuple(subs),
                "stale_since": parse_time(ann.get(STALE_TIMESTAMP_ANNOTATION), obj=who,
                                          field=f"metadata.annotations.{STALE_TIMESTAMP_ANNOTATION}"),
                "last_start": parse_time(ann.get(LAST_START_ANNOTATION), obj=who,
                                         field=f"metadata.annotations.{LAST_START_ANNOTATION}"),
            }
            # checked above: min_member, preemptibility; no sub-groups, so the tree validator has nothing to check
            if not subs and type(min_member) is int and is_opt_str(fields["queue"]) \
                    and is_opt_str(fields["priority_class_name"]):
                return trusted(cls, fields)
            return cls(**fields)
        except ValueError as exc:
            errors = getattr(exc, "errors", None)
            msg = errors()[0]["msg"].removeprefix("Value error, ") if callable(errors) else str(exc)
            raise InputError(msg, obj=who, field="spec.subGroups") from exc
