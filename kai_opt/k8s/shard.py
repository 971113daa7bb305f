"""Scheduling shards (KAI-Scheduler's SchedulingShard): one scheduler per partition of the cluster.

A shard is a value of the partition label (`kai.scheduler/node-pool` by default) on nodes, queues and PodGroups.
The shard of value v sees the objects whose label is v; the shard of value '' sees the objects without the label
(KAI's default shard: an Equals selector for a value, DoesNotExist for ''). Pods follow their PodGroup:

- a bound pod (spec.nodeName) belongs to the shard of its node: it uses that node's capacity, whoever scheduled it;
- an unbound pod belongs to the shard of its PodGroup, and a pod naming no existing PodGroup to the shard its own
  label names; a pipelined pod nominated onto a node of another shard loses the nomination.

So nothing crosses a shard: a shard's plan places only its own pods, onto its own nodes, charged to its own queues.
`filter_snapshot` is the one filter: `kai-opt run` applies it to every cycle's snapshot from the watch cache, and
`kai-opt solve/simulate/explain --shard` to a snapshot file. PriorityClasses and Topologies are cluster-wide.
Cross-object links are checked again on what remains (a PodGroup whose queue is in another shard is not scheduled,
a queue whose parent is in another shard is rejected), as KAI's listers see only the shard's objects.

The pod grouper of a shard writes only its own PodGroups (`grouping_in_shard`), and a shard's SchedulingShard
object, when present, supplies its partition value and the settings that map onto kai-opt's config
(`apply_scheduling_shard`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from kai_opt.actions import ACTIONS
from kai_opt.api.pod import PODGROUP_ANNOTATION
from kai_opt.config import Config, parse_duration
from kai_opt.errors import ConfigError
from kai_opt.k8s.client import cluster_error, object_path, request
from kai_opt.snapshot import Snapshot

log = logging.getLogger(__name__)

SCHEDULING_SHARD_API = "kai.scheduler/v1"
SCHEDULING_SHARD_PLURAL = "schedulingshards"
# warnings computed from links between objects: worked out again on the shard's objects
_LINK_WARNINGS = frozenset({"QueueDoesNotExist", "PodGroupDoesNotExist", "TopologyDoesNotExist",
                            "TopologyLevelDoesNotExist"})


_LABEL_VALUE = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"


@dataclass(frozen=True)
class ShardFilter:
    """Which objects one shard schedules: those whose `label` is `value` ('' = those without `label`)."""

    name: str
    label: str
    value: str

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        if self.value == "":
            return self.label not in labels
        return labels.get(self.label) == self.value

    def labels(self) -> dict[str, str]:
        """The label an object of this shard carries (none for the default shard of value '')."""
        return {self.label: self.value} if self.value else {}

    def describe(self) -> str:
        sel = f"{self.label}={self.value}" if self.value else f"!{self.label}"
        return f"shard {self.name} ({sel})"


def shard_filter(config: Config) -> ShardFilter | None:
    """The config's shard, or None when sharding is off (shard.name '')."""
    s = config.shard
    return ShardFilter(s.name, s.partition_label, s.partition_value) if s.name else None


def offline_shard(config: Config, value: str | None) -> ShardFilter | None:
    """The shard an offline command schedules: `--shard VALUE` (a partition label value, '' = the unlabelled
    default shard; the label from the config), else the config's shard section."""
    if value is None:
        return shard_filter(config)
    s = config.shard
    if value and not re.fullmatch(_LABEL_VALUE, value):
        raise ConfigError(f"--shard {value!r} is not a label value")
    return ShardFilter(s.name or value or "default", s.partition_label, value)


def snapshot_of_shard(snap: Snapshot, config: Config, value: str | None) -> Snapshot:
    """An offline command's snapshot: the shard `offline_shard` names, or `snap` when none."""
    return filter_snapshot(snap, offline_shard(config, value))


def filter_snapshot(snap: Snapshot, shard: ShardFilter | None) -> Snapshot:
    """The part of `snap` that `shard` schedules (module docstring); `snap` itself when `shard` is None."""
    if shard is None:
        return snap
    nodes = [n for n in snap.nodes if shard.matches(n.meta.labels)]
    queues = [q for q in snap.queues if shard.matches(q.meta.labels)]
    all_groups = {g.key for g in snap.podgroups}
    podgroups = [g for g in snap.podgroups if shard.matches(g.meta.labels)]
    node_names = {n.name for n in nodes}
    group_keys = {g.key for g in podgroups}
    pods = []
    for p in snap.pods:
        if p.node_name is not None:
            if p.node_name in node_names:
                pods.append(p)
            continue
        group = p.group_key
        mine = group in group_keys if group is not None and group in all_groups else shard.matches(p.labels)
        if not mine:
            continue
        if p.nominated_node is not None and p.nominated_node not in node_names:
            p = p.model_copy(update={"nominated_node": None})
        pods.append(p)
    kept = {"Node": node_names, "Queue": {q.name for q in queues}, "PodGroup": group_keys,
            "Pod": {p.key for p in pods}}

    def stays(kind: str, name: str) -> bool:
        return kind not in kept or name in kept[kind]

    out = dataclasses.replace(
        snap, nodes=nodes, pods=pods, podgroups=podgroups, queues=queues,
        priority_classes=list(snap.priority_classes), topologies=list(snap.topologies),
        warnings=[w for w in snap.warnings if w.reason not in _LINK_WARNINGS and stays(w.kind, w.name)],
        rejected=list(snap.rejected), ignored_kinds=dict(snap.ignored_kinds), any_pod_claims=None)
    out.validate(strict=False)  # links again, on the shard's objects only
    return out


def grouping_in_shard(shard: ShardFilter | None, desired: list[dict[str, Any]], assignments: Mapping[str, str],
                      existing: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The pod grouper's output restricted to the shard's PodGroups: an existing PodGroup by its own labels (a
    relabelled group moves to the other shard, as in KAI), a new one by the labels it inherits from its top owner.
    Returns (PodGroups to create or patch, "ns/pod" -> group of the pods in them)."""
    if shard is None:
        return desired, dict(assignments)
    have = {_key(pg): pg for pg in existing}
    mine: set[str] = set()
    kept = []
    for pg in desired:
        key = _key(pg)
        if shard.matches((have.get(key) or pg).get("metadata", {}).get("labels")):
            mine.add(key)
            kept.append(pg)
    return kept, {pod: g for pod, g in assignments.items() if f"{pod.split('/', 1)[0]}/{g}" in mine}


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def pod_group_of(pod: Mapping[str, Any]) -> str | None:
    """The PodGroup a raw pod names (annotation, else label, as kai_opt.api.pod reads it)."""
    meta = pod.get("metadata") or {}
    return ((meta.get("annotations") or {}).get(PODGROUP_ANNOTATION)
            or (meta.get("labels") or {}).get(PODGROUP_ANNOTATION))


# -- KAI's SchedulingShard ---------------------------------------------------------------------------------------------
def read_scheduling_shard(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    """SchedulingShard `name` (cluster-scoped), or None when it or its CRD is not there, or kai-opt may not read
    it (403: RBAC of a chart before shards; logged, the config's partition is used)."""
    try:
        return request(api, "GET", object_path(SCHEDULING_SHARD_API, SCHEDULING_SHARD_PLURAL, None, name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status == 403:
            log.warning("shard %s: may not read SchedulingShard %s (403); using the config's partition", name, name)
            return None
        raise cluster_error(exc, f"read SchedulingShard {name}", api) from exc
    except Exception as exc:  # connection errors
        raise cluster_error(exc, f"read SchedulingShard {name}", api) from exc


def _is_set(model: BaseModel, path: tuple[str, ...]) -> bool:
    """Whether the config file set the field at `path` (or a section above it, as a whole)."""
    cur: Any = model
    for part in path:
        if not isinstance(cur, BaseModel) or part not in cur.model_fields_set:
            return False
        cur = getattr(cur, part)
    return True


def apply_scheduling_shard(config: Config, obj: Mapping[str, Any]) -> tuple[Config, list[str]]:
    """`config` with what SchedulingShard `obj` says: its partitionLabelValue always (it defines the shard), and
    placementStrategy, minRuntime, kValue, actions and usageDBConfig where the config file does not set the field.
    Returns the new config and one line per field taken or ignored. Bad values raise `ConfigError` naming the
    SchedulingShard's field."""
    name = (obj.get("metadata") or {}).get("name") or config.shard.name
    spec = obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise ConfigError("spec must be a mapping", source=f"SchedulingShard {name}")
    data = config.model_dump()
    notes: list[str] = []

    def take(path: tuple[str, ...], value: Any, field: str) -> None:
        if _is_set(config, path):
            notes.append(f"{field}: the config's {'.'.join(path)} is kept")
            return
        cur = data
        for part in path[:-1]:
            cur = cur[part]
        cur[path[-1]] = value
        notes.append(f"{field} -> {'.'.join(path)} = {value}")

    value = spec.get("partitionLabelValue", "") or ""
    if value != config.shard.partition_value:
        notes.append(f"partitionLabelValue -> shard.partition_value = {value!r}"
                     + (f" (replaces the config's {config.shard.partition_value!r})"
                        if _is_set(config, ("shard", "partition_value")) else ""))
    data["shard"]["partition_value"] = value
    placement = spec.get("placementStrategy") or {}
    for res in ("gpu", "cpu"):
        if isinstance(placement, Mapping) and placement.get(res) is not None:
            take(("placement", res), placement[res], f"placementStrategy.{res}")
    min_runtime = spec.get("minRuntime") or {}
    for kai, ours in (("preemptMinRuntime", "preempt_min_runtime_s"), ("reclaimMinRuntime", "reclaim_min_runtime_s")):
        if isinstance(min_runtime, Mapping) and min_runtime.get(kai) is not None:
            try:
                seconds = parse_duration(min_runtime[kai])
            except ValueError as exc:
                raise ConfigError(str(exc), source=f"SchedulingShard {name}", field=f"spec.minRuntime.{kai}") from None
            take((ours,), seconds, f"minRuntime.{kai}")
    if spec.get("kValue") is not None:
        take(("k_value",), spec["kValue"], "kValue")
    if spec.get("usageDBConfig") is not None:
        take(("usage_db",), spec["usageDBConfig"], "usageDBConfig")
    by_kai = {a.kai_name: a.name for a in ACTIONS}
    actions = spec.get("actions") or {}
    for kai_name, setting in (actions.items() if isinstance(actions, Mapping) else ()):
        enabled = setting.get("enabled") if isinstance(setting, Mapping) else None
        if kai_name not in by_kai:
            notes.append(f"actions.{kai_name}: not an action of kai-opt, ignored")
        elif enabled is not None:
            take(("actions", by_kai[kai_name]), enabled, f"actions.{kai_name}.enabled")
    for ignored in ("args", "queueDepthPerAction", "plugins"):
        if spec.get(ignored):
            notes.append(f"{ignored}: no kai-opt equivalent, ignored")
    try:
        merged = Config.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise ConfigError(err["msg"].removeprefix("Value error, "), source=f"SchedulingShard {name}",
                          field=f"(as config) {field}") from exc
    return merged, notes


def resolve_shard_config(api: client.ApiClient, config: Config) -> Config:
    """In a cluster: `config` with its SchedulingShard applied, when sharding is on, reading it is enabled, and
    the object exists (logged either way)."""
    s = config.shard
    if not s.name or not s.read_scheduling_shard:
        return config
    obj = read_scheduling_shard(api, s.name)
    if obj is None:
        log.info("shard %s: no SchedulingShard %s; partition %s=%r from the config", s.name, s.name,
                 s.partition_label, s.partition_value)
        return config
    merged, notes = apply_scheduling_shard(config, obj)
    log.info("shard %s: SchedulingShard %s read: %s", s.name, s.name, "; ".join(notes) or "nothing to take")
    return merged


def shard_config(config: Config) -> Config:
    """The per-shard names of a sharded scheduler: its usage ledger ConfigMap carries the shard's name (each shard
    records its own queues' usage), as its Lease does (kai_opt.k8s.leader.lease_name)."""
    s = config.shard
    if not s.name:
        return config
    data = config.model_dump()
    ledger = data["usage_db"]["ledger"]
    suffix = f"-{s.name}"
    if not ledger["config_map_name"].endswith(suffix):  # the chart's Role names the same (manifests._ledger_names)
        ledger["config_map_name"] += suffix
    return Config.model_validate(data)
