"""Autoscaler support (KAI's node-scale-adjuster): placeholder pods that cluster-autoscaler and Karpenter can see.

GPU-sharing pods ask for GPUs through annotations (`gpu-fraction`, `gpu-memory`), which autoscalers cannot read,
and kai-opt does not mark its pending pods `PodScheduled=False` (what autoscalers look for), so no autoscaler sees
kai-opt's pending GPU work. For every pending GPU pod the plan leaves pending because it fits no node, kai-opt
keeps placeholder pods that request whole `nvidia.com/gpu` with that pod's constraints:

- which pods: pending pods of ours in a PodGroup whose plan reasons include a fit failure on the nodes
  (`Unschedulable`) and no queue-capacity reason (`OverLimit`, `NonPreemptibleOverQuota`: a new node would not
  help). All of a group's pending pods count at once, so a gang that cannot fit asks for all its nodes together;
- GPU-sharing pods (`gpu-fraction`, or `gpu-memory` counted as `gpu_memory_to_fraction_ratio` of a device) with the
  same constraints and device count are packed first-fit decreasing into whole devices (a pod never spans two
  devices): one placeholder per bin, requesting the bin's device count and the largest CPU and memory request of
  its pods (each must fit a node; KAI's placeholders carry one pod's). Whole-GPU pods (`whole_gpu_pods`) get one
  placeholder each, with the pod's GPU, CPU and memory requests;
- constraints: `nodeSelector`, `affinity` and `tolerations` copied from the pod (pod (anti-)affinity terms without
  namespaces are pinned to the pod's namespace, since the placeholder lives in another);
- placeholders run with `scheduler_name` (never kai-opt's), the negative-priority `priority_class_name` and a
  pause image, and are marked `PodScheduled=False/Unschedulable` as KAI's scaling pods are;
- a placeholder goes once its pods are placed or gone, and as soon as it is bound to a node: the node it asked
  for exists, and kai-opt never evicts another scheduler's pod, so a bound placeholder would keep the GPUs from
  the real pods. After any deletion no new placeholder is made for `cool_down_s` (KAI's cool-down), so an
  autoscaler that just added a node is not asked again before the real pods had a cycle to land;
- the groups that have placeholders get a `WaitingForScaleUp` pending reason.

Which placeholders should exist is a pure function of the cluster state, the plan and the config
(`desired_placeholders`); `ScaleAdjuster` only reconciles the pods in `namespace` with them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kai_opt.config import Autoscaler, Config
from kai_opt.fairshare import FairShare
from kai_opt.heuristics.positions import queue_positions
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import MERGE_PATCH, object_path, request
from kai_opt.k8s.workqueue import TokenBucket, WorkPool, classify
from kai_opt.plan import Plan, Reason
from kai_opt.state import ClusterState, PodStatus
from kai_opt.units import GPU_MILLI, GPU_RESOURCE

log = logging.getLogger(__name__)

PLACEHOLDER_LABEL = "kai-opt.io/scaling-placeholder"  # "true" on every placeholder (what the reconciler owns)
FOR_ANNOTATION = "kai-opt.io/placeholder-for"  # the pending pods it stands for, "ns/name,ns/name"
PODGROUP_ANNOTATION = "kai-opt.io/placeholder-podgroups"  # their PodGroups
SPEC_ANNOTATION = "kai-opt.io/placeholder-spec"  # digest of what it asks for: a changed one is re-created
SCALE_UP_REASON = "WaitingForScaleUp"
FIT_REASONS = frozenset({"Unschedulable"})  # a pod fits no node
CAPACITY_REASONS = frozenset({"OverLimit", "NonPreemptibleOverQuota"})  # a node more would not help
CONTAINER = "placeholder"


@dataclass(frozen=True)
class Placeholder:
    name: str
    gpus: int  # whole nvidia.com/gpu devices
    cpu_milli: int
    memory: int  # bytes
    source: str  # the pod (ns/name) whose nodeSelector, affinity and tolerations it copies
    pods: tuple[str, ...]  # the pending pods it stands for
    groups: tuple[int, ...]  # their podgroup indexes


def needs_scale_up(reasons: list[Reason]) -> bool:
    codes = {r.code for r in reasons}
    return bool(codes & FIT_REASONS) and not codes & CAPACITY_REASONS


def _digest(*parts: Any) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=repr).encode()).hexdigest()[:12]


def _pending_pods(state: ClusterState, plan: Plan, g: int, placed: set[int]) -> list[int]:
    return [int(p) for p in state.group_pods(g).tolist()
            if int(state.pod_status[p]) == PodStatus.PENDING and state.pod_ours[p] and int(p) not in placed]


def desired_placeholders(state: ClusterState, plan: Plan, fs: FairShare, config: Config) -> list[Placeholder]:
    """The placeholders that should exist after this plan (see the module docstring), by name; over
    `max_placeholders`, those of the groups first in queue order."""
    cfg = config.autoscaler
    groups = sorted((g for g, reasons in plan.pending.items() if needs_scale_up(reasons)),
                    key=lambda g: state.pg_keys[g])
    placed = {pl.pod for pl in plan.placements if not pl.moved}
    whole: list[Placeholder] = []
    # sharing pods by (constraints, devices per pod): [(milli-GPU per device, pod, group)], in group order
    buckets: dict[str, list[tuple[int, int, int]]] = {}
    for g in groups:
        for p in _pending_pods(state, plan, g, placed):
            pod = state.pods[p]
            if state.pod_gpu_frac[p] or state.pod_gpu_mem[p]:
                milli = int(state.pod_gpu_frac[p]) if state.pod_gpu_frac[p] else \
                    max(1, min(GPU_MILLI, round(cfg.gpu_memory_to_fraction_ratio * GPU_MILLI)))
                key = _digest(repr(state.sigs[int(state.pod_sig[p])]), repr(pod.pod_affinity),
                              repr(pod.pod_anti_affinity), int(state.pod_gpu_ndev[p]))
                buckets.setdefault(key, []).append((milli, p, g))
            elif state.pod_gpu_whole[p] and cfg.whole_gpu_pods:
                whole.append(Placeholder(f"kai-opt-ph-{_digest(pod.key, pod.meta.uid)}", int(state.pod_gpu_whole[p]),
                                         int(pod.requests.get("cpu", 0)), int(pod.requests.get("memory", 0)),
                                         pod.key, (pod.key,), (g,)))
    shared: list[Placeholder] = []
    for key, items in buckets.items():
        shared += _pack(state, key, items)
    out = whole + shared
    if len(out) <= cfg.max_placeholders:
        return sorted(out, key=lambda ph: ph.name)
    # over the cap: the groups first in queue order keep theirs, a group's all or none (a gang's demand is
    # one), up to the first that no longer fits (the order costs a JobQueue walk: only now)
    pos = queue_positions(state, fs, config)
    rank = {g: (pos[g].overall if g in pos else len(pos) + 1, state.pg_keys[g]) for g in groups}
    per: dict[int, list[Placeholder]] = {}
    for ph in out:
        per.setdefault(min(ph.groups, key=lambda g: rank[g]), []).append(ph)
    kept: list[Placeholder] = []
    for g in sorted(per, key=lambda g: rank[g]):
        if len(kept) + len(per[g]) > cfg.max_placeholders:
            log.warning("autoscaler: max_placeholders %d reached; %s and the groups after it get none",
                        cfg.max_placeholders, state.pg_keys[g])
            break
        kept += per[g]
    return sorted(kept, key=lambda ph: ph.name)


def _pack(state: ClusterState, key: str, items: list[tuple[int, int, int]]) -> list[Placeholder]:
    """First-fit decreasing of sharing pods into whole devices: one placeholder per bin."""
    bins: list[list[tuple[int, int, int]]] = []
    used: list[int] = []
    order = {p: i for i, (_, p, _) in enumerate(items)}
    for item in sorted(items, key=lambda x: (-x[0], order[x[1]])):
        for j, u in enumerate(used):
            if u + item[0] <= GPU_MILLI:
                bins[j].append(item)
                used[j] += item[0]
                break
        else:
            bins.append([item])
            used.append(item[0])
    out = []
    for i, b in enumerate(bins):
        pods = [state.pods[p] for _, p, _ in b]
        first = min(b, key=lambda x: order[x[1]])[1]
        out.append(Placeholder(f"kai-opt-ph-{key}-{i}", int(state.pod_gpu_ndev[first]),
                               max(int(x.requests.get("cpu", 0)) for x in pods),
                               max(int(x.requests.get("memory", 0)) for x in pods),
                               state.pods[first].key, tuple(x.key for x in pods),
                               tuple(dict.fromkeys(g for _, _, g in b))))
    return out


def scale_up_reasons(state: ClusterState, placeholders: list[Placeholder], cfg: Autoscaler) -> dict[int, Reason]:
    """The `WaitingForScaleUp` reason of every group some placeholder stands for."""
    per: dict[int, list[Placeholder]] = {}
    for ph in placeholders:
        for g in ph.groups:
            per.setdefault(g, []).append(ph)
    out = {}
    for g, phs in per.items():
        gpus = sum(ph.gpus for ph in phs)
        out[g] = Reason(SCALE_UP_REASON, f"waiting for a scale-up: {len(phs)} placeholder pod(s) in namespace "
                        f"{cfg.namespace} ask the autoscaler for {gpus} {GPU_RESOURCE} for this group's pending "
                        "pods", {"placeholders": [ph.name for ph in phs], "gpus": gpus})
    return out


# -- the placeholder pod ---------------------------------------------------------------------------------------------
def _pin_namespaces(affinity: dict[str, Any], namespace: str) -> dict[str, Any]:
    out = copy.deepcopy(affinity)
    for kind in ("podAffinity", "podAntiAffinity"):
        section = out.get(kind)
        if not isinstance(section, dict):
            continue
        terms = list(section.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        terms += [t.get("podAffinityTerm") for t in section.get("preferredDuringSchedulingIgnoredDuringExecution")
                  or [] if isinstance(t, dict)]
        for t in terms:
            if isinstance(t, dict) and not t.get("namespaces") and "namespaceSelector" not in t:
                t["namespaces"] = [namespace]
    return out


def placeholder_pod(ph: Placeholder, source: dict[str, Any] | None, cfg: Autoscaler) -> dict[str, Any]:
    """The pod object of a placeholder; `source` is the pending pod whose constraints it copies (None: gone)."""
    spec_src = (source or {}).get("spec") or {}
    src_ns = ((source or {}).get("metadata") or {}).get("namespace") or ph.source.split("/", 1)[0]
    spec: dict[str, Any] = {
        "schedulerName": cfg.scheduler_name, "priorityClassName": cfg.priority_class_name,
        "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
        "containers": [{"name": CONTAINER, "image": cfg.image, "resources": {
            "requests": {GPU_RESOURCE: str(ph.gpus), "cpu": f"{ph.cpu_milli}m", "memory": str(ph.memory)},
            "limits": {GPU_RESOURCE: str(ph.gpus)}}}]}
    if spec_src.get("nodeSelector"):
        spec["nodeSelector"] = copy.deepcopy(spec_src["nodeSelector"])
    if spec_src.get("affinity"):
        spec["affinity"] = _pin_namespaces(spec_src["affinity"], src_ns)
    if spec_src.get("tolerations"):
        spec["tolerations"] = copy.deepcopy(spec_src["tolerations"])
    digest = _digest(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": ph.name, "namespace": cfg.namespace,
        "labels": {PLACEHOLDER_LABEL: "true", "app.kubernetes.io/managed-by": "kai-opt"},
        "annotations": {FOR_ANNOTATION: ",".join(ph.pods)[:4096], SPEC_ANNOTATION: digest}}, "spec": spec}


# -- the reconciler --------------------------------------------------------------------------------------------------
class ScaleAdjuster:
    """Keeps the placeholder pods in `autoscaler.namespace` equal to the last cycle's desired set (on its own
    one-worker pool, the latest cycle's set wins), fenced by leadership."""

    def __init__(self, api: Any, cache: ClusterCache, limiter: TokenBucket, cfg: Autoscaler, *,
                 fence: Callable[[], bool] = lambda: True, cool_down_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.cache = cache
        self.limiter = limiter
        self.cfg = cfg
        self.fence = fence
        self.cool_down_s = cfg.cool_down_s if cool_down_s is None else cool_down_s
        self.clock = clock
        self.pool = WorkPool("scale-adjust", 1)
        self._lock = threading.Lock()
        self._last_delete: float | None = None
        self.created = 0
        self.deleted = 0
        self.failures = 0

    def cycle(self, state: ClusterState, plan: Plan, fs: FairShare, config: Config) -> list[Placeholder]:
        """After the plan is applied: decide, add the pending reasons to the plan, queue the reconcile."""
        desired = desired_placeholders(state, plan, fs, config)
        for g, reason in scale_up_reasons(state, desired, self.cfg).items():
            plan.pending[g] = [*plan.pending.get(g, []), reason]
        def job() -> None:
            self.sync(desired)

        self.pool.submit("sync", job, replace=True)
        return desired

    def existing(self) -> list[dict[str, Any]]:
        return [p for p in self.cache.list("Pod", "v1")
                if (p.get("metadata") or {}).get("namespace") == self.cfg.namespace
                and ((p.get("metadata") or {}).get("labels") or {}).get(PLACEHOLDER_LABEL) == "true"]

    def sync(self, desired: list[Placeholder]) -> tuple[list[str], list[str]]:
        """Delete placeholders not desired (or bound, or changed), create missing ones outside the cool-down;
        returns (created, deleted) names."""
        if not self.fence():
            return [], []
        want = {}
        for ph in desired:
            ns, name = ph.source.split("/", 1)
            source = self.cache.get("v1", "Pod", ns, name)
            if source is not None:  # gone since the cycle: its constraints are not known, and it needs none
                want[ph.name] = placeholder_pod(ph, source, self.cfg)
        have: dict[str, dict[str, Any]] = {}
        deleted: list[str] = []
        for obj in self.existing():
            meta = obj.get("metadata") or {}
            name = str(meta.get("name"))
            if meta.get("deletionTimestamp"):
                continue
            target = want.get(name)
            bound = bool((obj.get("spec") or {}).get("nodeName"))
            same = target is not None and (meta.get("annotations") or {}).get(SPEC_ANNOTATION) == \
                target["metadata"]["annotations"][SPEC_ANNOTATION]
            if same and not bound:
                have[name] = obj
                continue
            if self._write("DELETE", object_path("v1", "pods", self.cfg.namespace, name),
                           body={"gracePeriodSeconds": 0}):
                deleted.append(name)
                with self._lock:
                    self._last_delete = self.clock()
                    self.deleted += 1
                log.info("placeholder %s/%s deleted (%s)", self.cfg.namespace, name,
                         "bound to a node" if bound else "not needed" if target is None else "changed")
            have[name] = obj  # bound or changed: not re-created in this pass
        created: list[str] = []
        with self._lock:
            cooling = self._last_delete is not None and self.clock() - self._last_delete < self.cool_down_s
        if cooling:
            return created, deleted
        for name, obj in want.items():
            if name in have:
                continue
            if self._write("POST", object_path("v1", "pods", self.cfg.namespace), body=obj):
                created.append(name)
                with self._lock:
                    self.created += 1
                self._write("PATCH", object_path("v1", "pods", self.cfg.namespace, name) + "/status",
                            body={"status": {"conditions": [{"type": "PodScheduled", "status": "False",
                                                             "reason": "Unschedulable",
                                                             "message": "kai-opt placeholder: waiting for a "
                                                             "node from the autoscaler"}]}},
                            content_type=MERGE_PATCH)
                log.info("placeholder %s/%s created: %s GPU(s) for %s", self.cfg.namespace, name,
                         obj["spec"]["containers"][0]["resources"]["requests"][GPU_RESOURCE],
                         obj["metadata"]["annotations"][FOR_ANNOTATION])
        return created, deleted

    def _write(self, method: str, path: str, *, body: Any, content_type: str | None = None) -> bool:
        if not self.fence():
            return False
        self.limiter.acquire()
        try:
            request(self.api, method, path, body=body, content_type=content_type)
            return True
        except Exception as exc:  # the next cycle's sync tries again
            f = classify(exc)
            if f.status in (404, 409) and method != "PATCH":  # gone already / made already
                return method == "DELETE"
            with self._lock:
                self.failures += 1
            log.warning("placeholder %s %s: %s %s", method, path, f.status or "", f.message)
            return False

    def stop(self) -> None:
        self.pool.stop()
