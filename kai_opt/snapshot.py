"""Snapshot: every API object of one scheduling cycle, validated across objects.

`Snapshot.from_objects` turns raw Kubernetes objects (from any loader or the watch cache) into typed models.
In strict mode (files) the first bad object raises an `InputError`; in lenient mode (a live cluster) the bad object
is set aside in `rejected` so the rest is still scheduled, and the caller reports it on that object.
Problems that affect one workload only (a PodGroup naming an unknown queue, a pod naming an unknown PodGroup) are
never errors: they become `warnings` and that workload stays pending with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, cast

from pydantic import ValidationError

from kai_opt.api import Node, Pod, PodGroup, PriorityClass, Queue, Topology
from kai_opt.api.dra import API_VERSION as DRA_API_VERSION
from kai_opt.api.dra import DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice
from kai_opt.api.meta import ident
from kai_opt.api.taintrule import API_VERSION as TAINT_RULE_API_VERSION
from kai_opt.api.taintrule import DeviceTaintRule, apply_taint_rules
from kai_opt.errors import InputError
from kai_opt.gcpause import gc_paused

KINDS: dict[str, type] = {
    "Node": Node,
    "Pod": Pod,
    "PodGroup": PodGroup,
    "Queue": Queue,
    "PriorityClass": PriorityClass,
    "Topology": Topology,
    "DeviceClass": DeviceClass,
    "ResourceSlice": ResourceSlice,
    "ResourceClaim": ResourceClaim,
    "ResourceClaimTemplate": ResourceClaimTemplate,
    "DeviceTaintRule": DeviceTaintRule,
}

# the one apiVersion per kind whose schema the models read; an object of another version (an old
# scheduling.run.ai/v1 Queue, a v1alpha1 PodGroup) is never read as this one. Objects without apiVersion (typed
# lists, KAI's snapshot ZIP) are read as these.
API_VERSIONS: dict[str, str] = {
    "Node": "v1",
    "Pod": "v1",
    "PodGroup": "scheduling.run.ai/v2alpha2",
    "Queue": "scheduling.run.ai/v2",
    "PriorityClass": "scheduling.k8s.io/v1",
    "Topology": "kai.scheduler/v1alpha1",
    "DeviceClass": DRA_API_VERSION,
    "ResourceSlice": DRA_API_VERSION,
    "ResourceClaim": DRA_API_VERSION,
    "ResourceClaimTemplate": DRA_API_VERSION,
    "DeviceTaintRule": TAINT_RULE_API_VERSION,  # beta in Kubernetes 1.36 (off by default)
}

DEFAULT_SCHEDULER_NAMES = ("kai-opt",)


@dataclass(frozen=True)
class Issue:
    """A problem found on one object: `reason` is machine-readable (e.g. QueueDoesNotExist)."""

    kind: str
    name: str  # ns/name or name
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind} {self.name}: {self.reason}: {self.message}"


@dataclass(frozen=True)
class RawObject:
    """One object as read, with where it came from (for error messages)."""

    kind: str
    obj: dict[str, Any]
    source: str | None = None
    line: int | None = None
    memo_key: tuple[str, ...] | None = None  # names this exact content (e.g. kind, uid, resourceVersion): its
    # parsed model may be reused from `from_objects(memo=...)`; None when the object was changed locally
    parsed: list[Any] = field(default_factory=list, compare=False, repr=False)  # [model] once `from_objects(memo=
    # ...)` parsed it: a RawObject handed again (a watch cache keeps them) is not looked up again


@dataclass
class Snapshot:
    nodes: list[Node] = field(default_factory=list)
    pods: list[Pod] = field(default_factory=list)
    podgroups: list[PodGroup] = field(default_factory=list)
    queues: list[Queue] = field(default_factory=list)
    priority_classes: list[PriorityClass] = field(default_factory=list)
    topologies: list[Topology] = field(default_factory=list)
    device_classes: list[DeviceClass] = field(default_factory=list)
    resource_slices: list[ResourceSlice] = field(default_factory=list)
    resource_claims: list[ResourceClaim] = field(default_factory=list)
    claim_templates: list[ResourceClaimTemplate] = field(default_factory=list)
    device_taint_rules: list[DeviceTaintRule] = field(default_factory=list)  # already in resource_slices' devices
    warnings: list[Issue] = field(default_factory=list)
    rejected: list[Issue] = field(default_factory=list)  # lenient mode: objects left out, with why
    scheduler_names: tuple[str, ...] = DEFAULT_SCHEDULER_NAMES  # pods with these schedulerNames are ours
    now: float | None = None  # time the snapshot describes (None: the wall clock when used)
    source: str | None = None
    ignored_kinds: dict[str, int] = field(default_factory=dict)
    # whether some pod has resource claims, when the snapshot's maker knows it (the watch cache's views); None: look
    any_pod_claims: bool | None = field(default=None, repr=False)
    origins: dict[int, tuple[str | None, int | None]] = field(default_factory=dict, repr=False)  # id(obj) ->

    # -- construction ----------------------------------------------------------------------------------------------
    @classmethod
    def from_objects(
        cls,
        objects: Iterable[RawObject],
        *,
        strict: bool = True,
        scheduler_names: tuple[str, ...] | None = None,
        now: float | None = None,
        source: str | None = None,
        memo: dict[tuple[str, ...], Any] | None = None,
    ) -> Snapshot:
        """`memo`: parsed models by `RawObject.memo_key`, reused and filled in (a watch cache passes the same
        dict every cycle, so unchanged objects are not parsed again; models are immutable). The cyclic GC is
        paused meanwhile (kai_opt.gcpause)."""
        with gc_paused():
            return cls._from_objects(objects, strict=strict, scheduler_names=scheduler_names, now=now,
                                     source=source, memo=memo)

    @classmethod
    def _from_objects(cls, objects: Iterable[RawObject], *, strict: bool, scheduler_names: tuple[str, ...] | None,
                      now: float | None, source: str | None, memo: dict[tuple[str, ...], Any] | None) -> Snapshot:
        snap = cls(now=now, source=source)
        if scheduler_names:
            snap.scheduler_names = tuple(scheduler_names)
        buckets: dict[str, list[Any]] = {k: [] for k in KINDS}
        skipped: list[tuple[RawObject, str]] = []
        for raw in objects:
            if raw.kind not in KINDS:
                snap.ignored_kinds[raw.kind] = snap.ignored_kinds.get(raw.kind, 0) + 1
                continue
            parsed, warning, rejection = read_raw(raw, strict=strict, memo=memo, source=source)
            if parsed is not None:
                buckets[raw.kind].append(parsed)
                if raw.line is not None or raw.source != source:  # else `_where` gives the snapshot's source
                    snap.origins[id(parsed)] = (raw.source, raw.line)
            elif warning is not None:
                skipped.append((raw, str(raw.obj.get("apiVersion"))))
                snap.warnings.append(warning)
            elif rejection is not None:
                snap.rejected.append(rejection)
        if skipped and strict and not any(buckets.values()):  # nothing else usable: the skip is the answer
            raw, version = skipped[0]
            more = f" ({len(skipped) - 1} more like it)" if len(skipped) > 1 else ""
            raise InputError(f"apiVersion {version[:60]!r} is not read (kai-opt reads {API_VERSIONS[raw.kind]}), "
                             f"and nothing else is usable{more}", source=raw.source, line=raw.line,
                             obj=f"{raw.kind} {_name_of(raw.obj)}".strip(), field="apiVersion")
        snap.fill(buckets, strict=strict)
        return snap

    def fill(self, buckets: dict[str, list[Any]], *, strict: bool, unique: bool = False,
             links: Links | None = None) -> None:
        """Take each kind's models from `buckets` and validate them across objects (`unique`: the caller knows no
        two objects of a kind share a name, as a store keyed by name does; `links`: what the checks read, kept by
        the caller)."""
        self.nodes = buckets["Node"]
        self.pods = buckets["Pod"]
        self.podgroups = buckets["PodGroup"]
        self.queues = buckets["Queue"]
        self.priority_classes = buckets["PriorityClass"]
        self.topologies = buckets["Topology"]
        self.device_classes = buckets["DeviceClass"]
        self.device_taint_rules = buckets["DeviceTaintRule"]
        self.resource_slices = apply_taint_rules(buckets["ResourceSlice"], self.device_taint_rules)
        self.resource_claims = buckets["ResourceClaim"]
        self.claim_templates = buckets["ResourceClaimTemplate"]
        self.validate(strict=strict, unique=unique, links=links)
        self.any_pod_claims = links.any_pod_claims if links is not None else None

    # -- cross-object validation -----------------------------------------------------------------------------------
    def validate(self, *, strict: bool = True, unique: bool = False, links: Links | None = None) -> None:
        """Duplicates and the queue tree are errors (strict) or rejections; dangling workload links are warnings."""
        for kind, items, keyf in () if unique else (
            ("Node", self.nodes, attrgetter("name")),
            ("Pod", self.pods, attrgetter("key")),
            ("PodGroup", self.podgroups, attrgetter("key")),
            ("Queue", self.queues, attrgetter("name")),
            ("PriorityClass", self.priority_classes, attrgetter("name")),
            ("Topology", self.topologies, attrgetter("name")),
            ("DeviceClass", self.device_classes, attrgetter("name")),
            ("ResourceSlice", self.resource_slices, attrgetter("name")),
            ("ResourceClaim", self.resource_claims, attrgetter("key")),
            ("ResourceClaimTemplate", self.claim_templates, attrgetter("key")),
        ):
            keys = list(map(keyf, items))
            if len(set(keys)) == len(keys):  # (the common case: no duplicates)
                continue
            seen: set[str] = set()
            keep: list[Any] = []  # of this kind
            for o in items:
                k = keyf(o)
                if k in seen:
                    err = InputError("duplicate name", **self._where(o), obj=f"{kind} {k}",
                                     field="metadata.name")
                    if strict:
                        raise err
                    self.rejected.append(Issue(kind, k, "Duplicate", err.message))
                    continue
                seen.add(k)
                keep.append(o)
            items[:] = keep
        self._validate_queue_tree(strict)
        links = links or Links.of(self)
        queues = {q.name for q in self.queues}
        unknown_queues = {q for q in links.group_queues if q is not None and q not in queues}
        for g in links.groups_naming(unknown_queues) if unknown_queues else ():
            self.warnings.append(Issue("PodGroup", g.key, "QueueDoesNotExist",
                                       f"queue {g.queue!r} does not exist; the podgroup is not scheduled"))
        if links.unknown_groups is not None:
            unknown_groups = links.unknown_groups()
        else:
            named = set(links.pod_groups)  # (set operations: no loop in Python over every pod's group)
            named.discard(None)
            unknown_groups = cast(set[str], named).difference(links.group_keys)
        for p in links.pods_naming(unknown_groups) if unknown_groups else ():
            if self.is_ours(p) and p.node_name is None and not p.finished:
                self.warnings.append(Issue("Pod", p.key, "PodGroupDoesNotExist",
                                           f"podgroup {p.podgroup!r} does not exist; the pod is not scheduled"))
        topologies = {t.name: t for t in self.topologies}
        for g in links.constrained():
            for tc, where in [(g.topology_constraint, "spec.topologyConstraint")] + [
                    (s.topology_constraint, f"subgroup {s.name}") for s in g.sub_groups]:
                if tc is None:
                    continue
                topo = topologies.get(tc.topology) if tc.topology else None
                if tc.topology and topo is None:
                    self.warnings.append(Issue("PodGroup", g.key, "TopologyDoesNotExist",
                                               f"{where}: topology {tc.topology!r} does not exist"))
                    continue
                levels = set(topo.levels) if topo else None
                for lvl in (tc.required_level, tc.preferred_level):
                    if lvl and levels is not None and lvl not in levels:
                        msg = f"{where}: level {lvl!r} is not a level of topology {tc.topology!r}"
                        self.warnings.append(Issue("PodGroup", g.key, "TopologyLevelDoesNotExist", msg))

    def _validate_queue_tree(self, strict: bool) -> None:
        by_name = {q.name: q for q in self.queues}
        bad: set[str] = set()
        for q in self.queues:
            if q.parent is not None and q.parent not in by_name:
                err = InputError(f"parent queue {q.parent!r} does not exist", **self._where(q),
                                 obj=f"Queue {q.name}", field="spec.parentQueue")
                if strict:
                    raise err
                bad.add(q.name)
                self.rejected.append(Issue("Queue", q.name, "ParentQueueDoesNotExist", err.message))
        for q in self.queues:
            seen, cur = [q.name], q.parent
            while cur is not None and cur in by_name:
                if cur in seen:
                    cycle = " -> ".join([*seen[seen.index(cur):], cur])
                    err = InputError(f"parent links form a cycle: {cycle}", **self._where(q),
                                     obj=f"Queue {q.name}", field="spec.parentQueue")
                    if strict:
                        raise err
                    bad.update(seen)
                    self.rejected.append(Issue("Queue", q.name, "QueueCycle", err.message))
                    break
                seen.append(cur)
                cur = by_name[cur].parent
        if bad:
            # children of rejected queues go too, so the tree that remains is consistent
            changed = True
            while changed:
                changed = False
                for q in self.queues:
                    if q.name not in bad and q.parent in bad:
                        bad.add(q.name)
                        changed = True
                        self.rejected.append(Issue("Queue", q.name, "ParentQueueRejected",
                                                   f"parent queue {q.parent!r} was rejected"))
            self.queues = [q for q in self.queues if q.name not in bad]

    def _where(self, obj: object) -> dict[str, Any]:
        """source/line an object was read from, for an error message."""
        source, line = self.origins.get(id(obj), (None, None))
        return {"source": source or self.source, "line": line}

    # -- lookups --------------------------------------------------------------------------------------------------
    def is_ours(self, pod: Pod) -> bool:
        return pod.scheduler_name in self.scheduler_names

    def counts(self) -> dict[str, int]:
        return {"nodes": len(self.nodes), "pods": len(self.pods), "podgroups": len(self.podgroups),
                "queues": len(self.queues), "priorityclasses": len(self.priority_classes),
                "topologies": len(self.topologies)}


@dataclass
class Links:
    """What the cross-object checks read from pods and PodGroups. `Links.of` reads it from a snapshot's lists; a
    caller that keeps it up to date (the watch cache's views) gives it, so the checks need not visit every object
    (each visit of 100,000 models costs about 0.1 s in memory reads alone)."""

    pod_groups: Collection[str | None]  # the group keys pods name
    group_keys: Collection[str]  # the PodGroups' keys
    group_queues: Collection[str | None]  # the queues PodGroups name
    pods_naming: Callable[[set[str]], list[Pod]]  # the pods naming one of these group keys, in snapshot order
    groups_naming: Callable[[set[str]], list[PodGroup]]  # the PodGroups naming one of these queues, in order
    constrained: Callable[[], list[PodGroup]]  # PodGroups with a topology constraint or subgroups, in order
    any_pod_claims: bool | None = None  # whether some pod has resource claims (None: not known, look)
    # the group keys pods name that no PodGroup has, kept by the caller (None: from pod_groups and group_keys)
    unknown_groups: Callable[[], set[str]] | None = None

    @staticmethod
    def of(snap: Snapshot) -> Links:
        pods, groups = snap.pods, snap.podgroups
        return Links(set(map(_GROUP_KEY, pods)), set(map(_KEY, groups)), set(map(_QUEUE, groups)),
                     lambda keys: [p for p in pods if p.group_key in keys],
                     lambda queues: [g for g in groups if g.queue in queues],
                     lambda: [g for g in groups if is_constrained(g)])


def is_constrained(group: PodGroup) -> bool:
    """A PodGroup the topology checks read."""
    return group.topology_constraint is not None or bool(group.sub_groups)


_QUEUE, _GROUP_KEY, _KEY = attrgetter("queue"), attrgetter("group_key"), attrgetter("key")


def read_raw(raw: RawObject, *, strict: bool, memo: dict[tuple[str, ...], Any] | None,
             source: str | None) -> tuple[Any, Issue | None, Issue | None]:
    """One object of a known kind: (its model, None, None), or (None, warning, None) for another apiVersion (not
    read), or (None, None, rejection) for a bad object (strict: raised as an InputError). With a `memo`, a model
    parsed before from the same RawObject or the same `memo_key` is reused."""
    if memo is not None and raw.parsed:  # parsed from this very RawObject before: it was read and checked then
        return raw.parsed[0], None, None
    if not isinstance(raw.obj, dict):
        err = InputError(f"expected an object, got {type(raw.obj).__name__}", source=raw.source, line=raw.line,
                         obj=raw.kind)
        if strict:
            raise err
        return None, None, Issue(raw.kind, "?", "Invalid", err.message)
    version = raw.obj.get("apiVersion")
    if version is not None and version != API_VERSIONS[raw.kind]:
        return None, Issue(raw.kind, _name_of(raw.obj), "UnsupportedAPIVersion",
                           f"apiVersion {str(version)[:60]!r} is not read (kai-opt reads {API_VERSIONS[raw.kind]}); "
                           "skipped"), None
    try:
        key = raw.memo_key if memo is not None else None
        parsed = memo.get(key) if key is not None and memo is not None else None
        if parsed is None:
            parsed = _parse(KINDS[raw.kind], raw)
            if key is not None and memo is not None:
                memo[key] = parsed
        if key is not None:
            raw.parsed.append(parsed)
        return parsed, None, None
    except InputError as exc:
        located = exc.at(source=raw.source, line=raw.line)
        if strict:
            raise located from None
        return None, None, Issue(raw.kind, _name_of(raw.obj), "Invalid", exc.render())


def _parse(model: Any, raw: RawObject) -> Any:
    """`model.from_k8s`, with a pydantic error its checks did not foresee (e.g. a number where a name belongs) as
    the one-line InputError naming the object and the model field."""
    try:
        return model.from_k8s(raw.obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(x) for x in first["loc"]) or None
        shown = repr(first.get("input"))
        msg = f"{str(first['msg']).removeprefix('Value error, ')}, got {shown[:40]}"
        raise InputError(msg, obj=ident(raw.kind, raw.obj), field=field) from None


def _name_of(obj: dict[str, Any]) -> str:
    return ident("", obj).strip()
