"""The re-check right before a bind: does the pod still fit its node in the newest cache?

A cycle plans from its snapshot; by the time a bind is sent, other schedulers (kube-scheduler, KAI-Scheduler) may
have bound pods onto the same node (KAI-Scheduler issue #1454's race). Right before each bind the node is checked
again against the watch cache: every pod the watch shows bound to it and not finished (terminating pods still hold
their resources), plus our own binds assumed onto it (queued or in flight, not shown by the watch yet), plus the pod
itself.

- Resources: for every resource the pod requests and the node's allocatable lists (cpu, memory, nvidia.com/gpu,
  pods, extended resources), the sum must stay within allocatable.
- GPU devices (a pod given devices by the plan): each chosen device's recorded use (whole = 1, a fraction or
  gpu-memory share = its part) plus the pod's must stay within 1, and the devices in use (recorded ones, plus one
  per whole GPU of pods without a device record, e.g. kube-scheduler's) must not exceed the node's GPUs.
- A node that is gone does not fit.
- A GPU reservation pod (label app=<the reservation app>, kai_opt.k8s.sharing) is left out, as in the snapshot: the
  pods sharing its device hold that device's parts.

A bind that does not fit is dropped: the binder reports it failed with reason `no-fit`, the cache forgets the
assumption and the pod is placed again next cycle from a snapshot that shows the other pods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kai_opt.api import Node, Pod
from kai_opt.errors import InputError
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.sharing import APP_LABEL
from kai_opt.units import GPU_RESOURCE

log = logging.getLogger(__name__)

NODE_GONE = "node-gone"
GPU_DEVICE = "gpu-device"
_EPS = 1e-9
PRUNE_MIN = 4096  # parsed pods remembered before the first pruning


@dataclass(frozen=True)
class Misfit:
    """Why a bind no longer fits: `resource` (a resource name, gpu-device or node-gone) and a message."""

    resource: str
    message: str


def _share(pod: Pod, gpu_memory_mib: int) -> float:
    """The part of one device a pod uses on each of its devices."""
    if pod.gpu_fraction is not None:
        return float(pod.gpu_fraction)
    if pod.gpu_memory_mib is not None:
        return min(1.0, pod.gpu_memory_mib / max(gpu_memory_mib, 1))
    return 1.0


def check_fit(node: Node | None, others: Iterable[Pod], pod: Pod, devices: tuple[int, ...] = ()) -> Misfit | None:
    """Whether `pod` (on GPU `devices`) still fits `node` beside `others` (the pods on it); None when it does."""
    if node is None:
        return Misfit(NODE_GONE, "the node is gone")
    active = [o for o in others if not o.finished]
    alloc = node.allocatable
    used: dict[str, int] = {}
    for o in active:
        for r, v in o.requests.items():
            used[r] = used.get(r, 0) + v
    for r, v in sorted(pod.requests.items()):
        if v <= 0 or r not in alloc:
            continue
        if used.get(r, 0) + v > alloc[r]:
            return Misfit(r, f"{r}: {used.get(r, 0)} of {alloc[r]} in use, the pod needs {v}")
    if not devices:
        return None
    mem = node.gpu_memory_mib
    recorded: dict[int, float] = {}
    unrecorded = 0
    for o in active:
        if o.gpu_devices:
            f = _share(o, mem)
            for d in o.gpu_devices:
                recorded[d] = recorded.get(d, 0.0) + f
        elif not o.shares_gpu:
            unrecorded += o.whole_gpus
    want = _share(pod, mem)
    for d in devices:
        if recorded.get(d, 0.0) + want > 1.0 + _EPS:
            return Misfit(GPU_DEVICE, f"GPU device {d}: {recorded[d]:.3g} of it in use, the pod needs {want:.3g}")
    n_devices = alloc.get(GPU_RESOURCE, 0) // 1000
    in_use = len(set(recorded) | set(devices)) + unrecorded
    if in_use > n_devices:
        return Misfit(GPU_DEVICE, f"GPU devices: {in_use} would be in use on a node with {n_devices}")
    return None


class PreBindCheck:
    """`check(namespace, name, uid, node, devices)`: the pre-bind re-check against `cache` (see the module
    docstring). Parsed pods and nodes are remembered by (uid, resourceVersion)."""

    def __init__(self, cache: ClusterCache) -> None:
        self.cache = cache
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, Pod | None]] = {}  # uid -> (resourceVersion, parsed; None: invalid)
        self._nodes: dict[str, tuple[str, Node | None]] = {}
        self._prune_at = PRUNE_MIN

    def check(self, namespace: str, name: str, uid: str, node: str, devices: tuple[int, ...]) -> Misfit | None:
        node_obj, bound, assumed = self.cache.node_view(node)
        raw = self.cache.pod(namespace, name)
        if raw is None or (raw.get("metadata") or {}).get("uid") != uid:
            return None  # gone or replaced: the bind request itself fails and says so
        if (raw.get("spec") or {}).get("nodeName"):
            return None  # bound already (an earlier attempt's answer was lost): the request finds out whose
        pod = self._pod(raw)
        if pod is None:
            return None
        n = self._node(node_obj) if node_obj is not None else None
        if node_obj is not None and n is None:
            return None  # a node the snapshot cannot read either: not ours to judge here
        others: dict[str, Pod] = {}
        reservation_app = self.cache.reservation_app
        for p in bound:
            puid = (p.get("metadata") or {}).get("uid")
            if reservation_app and ((p.get("metadata") or {}).get("labels") or {}).get(APP_LABEL) == reservation_app:
                continue  # a GPU reservation pod: the pods sharing its device account for it (as in the snapshot)
            if puid != uid and puid not in others and (parsed := self._pod(p)) is not None:
                others[str(puid)] = parsed
        for auid, a in assumed:
            if auid == uid or auid in others:
                continue
            p = self.cache.pod(a.namespace, a.name)
            if p is None or (p.get("metadata") or {}).get("uid") != auid:
                continue
            parsed = self._pod(p)
            if parsed is not None:
                devs = a.devices or None
                others[auid] = parsed.model_copy(update={"node_name": node, "gpu_devices": devs})
        self._prune()
        return check_fit(n, others.values(), pod, devices)

    def _pod(self, raw: dict[str, Any]) -> Pod | None:
        return self._parsed(self._pods, "uid", raw, Pod.from_k8s)

    def _node(self, raw: dict[str, Any]) -> Node | None:
        return self._parsed(self._nodes, "name", raw, Node.from_k8s)

    def _parsed(self, memo: dict[str, tuple[str, Any]], key: str, raw: dict[str, Any], parse: Any) -> Any:
        """parse(raw), remembered in `memo` by (metadata[key], resourceVersion); None for an object that does not
        parse (the snapshot reports it)."""
        meta = raw.get("metadata") or {}
        ident, rv = str(meta.get(key)), str(meta.get("resourceVersion"))
        with self._lock:
            hit = memo.get(ident)
        if hit is not None and hit[0] == rv:
            return hit[1]
        try:
            parsed = parse(raw)
        except (InputError, ValueError, TypeError):
            parsed = None
        with self._lock:
            memo[ident] = (rv, parsed)
        return parsed

    def _prune(self) -> None:
        """Forget parsed pods that are gone, each time the memo doubled since the last pruning (amortised O(1))."""
        with self._lock:
            if len(self._pods) < self._prune_at:
                return
        present = {str((p.get("metadata") or {}).get("uid")) for p in self.cache.list("Pod", "v1")}
        with self._lock:
            self._pods = {k: v for k, v in self._pods.items() if k in present}
            self._prune_at = max(PRUNE_MIN, 2 * len(self._pods))
