"""Pieces shared by every kind: object metadata, timestamps, selectors, affinity, tolerations."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cached_property, lru_cache
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, field_validator

from kai_opt.api.trusted import is_opt_str, trusted
from kai_opt.errors import InputError
from kai_opt.limits import MAX_EPOCH_S, MIN_EPOCH_S, number

MODEL = ConfigDict(frozen=True, extra="forbid")


def ident(kind: str, obj: dict[str, Any]) -> str:
    """`Kind ns/name` (or `Kind name`) for error messages."""
    md = obj.get("metadata") if isinstance(obj, dict) else None
    md = md if isinstance(md, dict) else {}
    name = md.get("name", "<unnamed>")
    ns = md.get("namespace")
    return f"{kind} {ns}/{name}" if ns else f"{kind} {name}"


def as_dict(value: Any, *, obj: str, field: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InputError(f"expected a mapping, got {type(value).__name__}", obj=obj, field=field)
    return value


def as_list(value: Any, *, obj: str, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"expected a list, got {type(value).__name__}", obj=obj, field=field)
    return value


def str_map(value: Any, *, obj: str, field: str) -> dict[str, str]:
    """Labels, annotations, selectors: scalars become their text; a nested mapping or list is an error."""
    if value is None:
        return {}
    out: dict[str, str] = {}
    for k, v in as_dict(value, obj=obj, field=field).items():
        if isinstance(v, dict | list):
            raise InputError(f"expected a string, got a {type(v).__name__}", obj=obj, field=f"{field}.{k}")
        out[str(k)] = "" if v is None else v if type(v) is str else str(v)
    return out


def parse_time(value: Any, *, obj: str, field: str) -> float | None:
    """RFC 3339 timestamp (or epoch seconds) as epoch seconds; None when absent."""
    if value is None or value == "":
        return None
    if type(value) is str:  # snapshots repeat timestamps: parse each text once
        try:
            return _parse_time_text(value)
        except ValueError as exc:
            raise InputError(f"invalid timestamp {value!r}", obj=obj, field=field) from exc
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(number(value, obj=obj, field=field, lo=MIN_EPOCH_S, hi=MAX_EPOCH_S))
    if isinstance(value, datetime):
        return _epoch(value)
    try:
        return _parse_time_text(str(value))
    except ValueError as exc:
        raise InputError(f"invalid timestamp {value!r}", obj=obj, field=field) from exc


@lru_cache(maxsize=1 << 16)
def _parse_time_text(value: str) -> float:
    return _epoch(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))


def _epoch(dt: datetime) -> float:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def format_time(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_rfc3339() -> str:
    """The time now as the API writes timestamps (whole seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class OwnerReference(BaseModel):
    model_config = MODEL
    api_version: str
    kind: str
    name: str
    uid: str = ""
    controller: bool = False


class ObjectMeta(BaseModel):
    model_config = MODEL
    name: str
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    creation_timestamp: float | None = None
    deletion_timestamp: float | None = None
    owner_references: tuple[OwnerReference, ...] = ()

    @field_validator("name")
    @classmethod
    def _name_not_empty(cls, v: str) -> str:
        if not v:
            raise ValueError("metadata.name must not be empty")
        return v

    @classmethod
    def from_k8s(cls, kind: str, obj: dict[str, Any], *, namespaced: bool, who: str | None = None) -> ObjectMeta:
        """`who`: the object's `ident(kind, obj)` when the caller has it already."""
        who = who or ident(kind, obj)
        md = obj.get("metadata")
        if type(md) is not dict:
            md = as_dict(md, obj=who, field="metadata")
        name = md.get("name")
        if not name or not isinstance(name, str):
            raise InputError("missing name", obj=who, field="metadata.name")
        ns = md.get("namespace") or ("default" if namespaced else None)
        raw_owners = md.get("ownerReferences")
        owners = () if raw_owners is None else tuple(
            trusted(OwnerReference, {
                "api_version": str(o.get("apiVersion", "")),
                "kind": str(o.get("kind", "")),
                "name": str(o.get("name", "")),
                "uid": str(o.get("uid", "")),
                "controller": bool(o.get("controller", False)),
            })
            for o in as_list(raw_owners, obj=who, field="metadata.ownerReferences")
            if isinstance(o, dict)
        )
        uid = md.get("uid")
        fields = {
            "name": name,
            "namespace": ns if namespaced else None,
            "uid": uid,
            "labels": str_map(md.get("labels"), obj=who, field="metadata.labels"),
            "annotations": str_map(md.get("annotations"), obj=who, field="metadata.annotations"),
            "creation_timestamp": parse_time(md.get("creationTimestamp"), obj=who,
                                             field="metadata.creationTimestamp"),
            "deletion_timestamp": parse_time(md.get("deletionTimestamp"), obj=who,
                                             field="metadata.deletionTimestamp"),
            "owner_references": owners,
        }
        if type(name) is str and is_opt_str(fields["namespace"]) and is_opt_str(uid):
            return trusted(cls, fields)  # every value checked above (name non-empty; maps and times converted)
        return cls(**fields)


SelectorOp = Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]


CACHED_PROPERTIES = ("namespace", "key", "group_key")  # of NamespacedModel and its kinds


class NamespacedModel(BaseModel):
    """A namespaced object's model: `namespace` and `key` are read for every object every cycle, so they are
    computed once per (immutable) model; a copy that changes `meta` computes them again."""

    model_config = MODEL
    meta: ObjectMeta

    @cached_property
    def namespace(self) -> str:
        return self.meta.namespace or "default"

    @cached_property
    def key(self) -> str:
        return f"{self.namespace}/{self.meta.name}"

    def model_copy(self, *, update: Any = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        if update:  # what the cached properties are computed from may have changed
            for name in CACHED_PROPERTIES:
                copied.__dict__.pop(name, None)
        return copied



class SelectorRequirement(BaseModel):
    """One `matchExpressions` entry (node selector terms and label selectors share this shape)."""

    model_config = MODEL
    key: str
    operator: SelectorOp
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        has = self.key in labels
        if self.operator == "Exists":
            return has
        if self.operator == "DoesNotExist":
            return not has
        if self.operator == "In":
            return has and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not has or labels[self.key] not in self.values
        if not has or not self.values:
            return False
        try:
            lv, rv = int(labels[self.key]), int(self.values[0])
        except ValueError:
            return False
        return lv > rv if self.operator == "Gt" else lv < rv


def parse_requirements(raw: Any, *, obj: str, field: str) -> tuple[SelectorRequirement, ...]:
    out = []
    for i, r in enumerate(as_list(raw, obj=obj, field=field)):
        r = as_dict(r, obj=obj, field=f"{field}[{i}]")
        op = r.get("operator")
        if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
            raise InputError(f"unknown operator {op!r}", obj=obj, field=f"{field}[{i}].operator")
        out.append(SelectorRequirement(key=str(r.get("key", "")), operator=op,
                                       values=tuple(str(v) for v in as_list(r.get("values"), obj=obj,
                                                                              field=f"{field}[{i}].values"))))
    return tuple(out)


class NodeSelectorTerm(BaseModel):
    """Requirements ANDed; a node affinity's terms are ORed."""

    model_config = MODEL
    match_expressions: tuple[SelectorRequirement, ...] = ()
    match_fields: tuple[SelectorRequirement, ...] = ()  # only metadata.name is meaningful

    def matches(self, labels: dict[str, str], node_name: str) -> bool:
        if not self.match_expressions and not self.match_fields:
            return False  # an empty term matches nothing (kube-scheduler semantics)
        fields = {"metadata.name": node_name}
        return all(r.matches(labels) for r in self.match_expressions) and all(
            r.matches(fields) for r in self.match_fields)


class LabelSelector(BaseModel):
    model_config = MODEL
    match_labels: dict[str, str] = {}
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            r.matches(labels) for r in self.match_expressions)

    @classmethod
    def from_k8s(cls, raw: Any, *, obj: str, field: str) -> LabelSelector:
        raw = as_dict(raw, obj=obj, field=field)
        return cls(match_labels=str_map(raw.get("matchLabels"), obj=obj, field=f"{field}.matchLabels"),
                   match_expressions=parse_requirements(raw.get("matchExpressions"), obj=obj,
                                                        field=f"{field}.matchExpressions"))


class PodAffinityTerm(BaseModel):
    model_config = MODEL
    selector: LabelSelector
    topology_key: str
    namespaces: tuple[str, ...] = ()  # empty = the pod's own namespace


class Toleration(BaseModel):
    model_config = MODEL
    key: str = ""
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str = ""
    effect: str = ""  # "" = all effects

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        if self.effect and self.effect != effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != key:
            return False
        return self.operator == "Exists" or self.value == value
