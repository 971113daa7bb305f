"""KAI-Scheduler's GPU-sharing contract, carried out by kai-opt's binder for pods with `gpu-fraction` or
`gpu-memory` (optionally `gpu-fraction-num-devices`, `gpu-fraction-container-name`).

A shared device is a GPU group: an opaque id (a UUID, as KAI names them) that every pod sharing the device carries
as a label, `runai-gpu-group: <id>` for a pod on one device, `runai-gpu-group/<id>: <id>` per device for a pod
spanning several. The group holds its device through one reservation pod on the node (namespace
`kai-resource-reservation`, labels `app: kai-resource-reservation` and the group label, `nvidia.com/gpu: 1`,
`spec.nodeName` set, so the device plugin allocates it a GPU). The reservation pod's container reports the GPU it
was given in its own annotation `run.ai/reserve_for_gpu_index` (`python -m kai_opt.reservation`); until it has,
no pod of the group is bound. Each sharing pod then gets its shared-GPU ConfigMaps, owned by the pod: their names
come from the pod's annotation `runai/shared-gpu-configmap` (a prefix `<owner or pod name>-<7 chars>-shared-gpu`)
plus `-<container index>` (`-i<index>` for an init container) for the capabilities map (`NVIDIA_VISIBLE_DEVICES`,
`GPU_PORTION`, `RUNAI_NUM_OF_GPUS`, and for a `gpu-memory` pod kai-opt's `GPU_MEMORY_LIMIT_MIB`) and that name plus
`-evar` for the map the container takes whole as environment (`NVIDIA_VISIBLE_DEVICES`). The Binding then records
`received-resource-type: Fraction` and the ConfigMap prefix on the pod as it binds it.

Rules:
- kai-opt's plan chooses the device index; the index maps to one group per node, found from the reservation pod
  of that index (kai-opt's `kai-opt.io/gpu-devices` annotation on it), else a bound sharing pod on that index, else
  a new group. The GPU the group really gets is the one the device plugin gives its reservation pod.
- One reservation pod per group, created under a per-device lock; pods of the group wait for its report for at
  most `reservation_timeout_s` from its creation; then the reservation pod is deleted and the binds fail (the
  pods are placed again next cycle, a FailedBinding Event says why), and the next bind creates a new one.
- `sync()` deletes a reservation pod of kai-opt's once no unfinished pod outside the reservation namespace on its
  node carries its group (and no bind used it within `SETTLE_S`). Reservation pods kai-opt did not create
  (`app.kubernetes.io/managed-by` is not kai-opt: KAI's binder's) are never touched.
- In the snapshot a pod with the reservation `app` label holds no GPU (the sharing pods account for the device),
  as KAI's scheduler counts them.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import string
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.api.pod import (
    GPU_DEVICES_ANNOTATION,
    GPU_FRACTION_ANNOTATION,
    GPU_FRACTION_NUM_DEVICES_ANNOTATION,
    GPU_GROUP_LABEL,
    GPU_MEMORY_ANNOTATION,
)
from kai_opt.config import GpuSharing as SharingConfig
from kai_opt.k8s.client import MERGE_PATCH, object_path, request

log = logging.getLogger(__name__)

# KAI's names
MULTI_GROUP_PREFIX = GPU_GROUP_LABEL + "/"
RESERVED_GPU_ANNOTATION = "run.ai/reserve_for_gpu_index"
CONFIGMAP_ANNOTATION = "runai/shared-gpu-configmap"
RECEIVED_TYPE_ANNOTATION = "received-resource-type"
CONTAINER_NAME_ANNOTATION = "gpu-fraction-container-name"
APP_LABEL = "app"
RESERVATION_PREFIX = "gpu-reservation"
RESERVATION_CONTAINER = "resource-reservation"
DO_NOT_DISRUPT_ANNOTATION = "karpenter.sh/do-not-disrupt"
GPU_RESOURCE = "nvidia.com/gpu"
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
GPU_PORTION = "GPU_PORTION"
NUM_OF_GPUS = "RUNAI_NUM_OF_GPUS"
CDI_PREFIX = "k8s.device-plugin.nvidia.com/gpu="
# kai-opt's own: the GPU memory a gpu-memory pod asked for (KAI's ConfigMap has no such key)
MEMORY_LIMIT = "GPU_MEMORY_LIMIT_MIB"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "kai-opt"
NODE_GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"

CONFIGMAP_SUFFIX = "shared-gpu"
MAX_VOLUME_NAME = 63  # the webhook mounts the capabilities map as volume `<name>-vol`
PREFIX_RANDOM = 7
# a reservation pod that a bind used this recently is kept even when the watch shows no sharing pod on it yet
SETTLE_S = 5.0
POLL_S = 0.05


class SharingError(Exception):
    """A shared pod cannot be bound now; `reason` is the bind failure's reason (pod placed again next cycle)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# -- what a pod asks for ---------------------------------------------------------------------------------------------
def _meta(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("metadata") or {}


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return _meta(obj).get("annotations") or {}


def _labels(obj: dict[str, Any] | None) -> dict[str, str]:
    return _meta(obj).get("labels") or {}


def shares_gpu(pod: dict[str, Any] | None) -> bool:
    """The pod asks for part of a GPU (KAI: a `gpu-fraction` or `gpu-memory` annotation)."""
    ann = _annotations(pod)
    return GPU_FRACTION_ANNOTATION in ann or GPU_MEMORY_ANNOTATION in ann


def num_devices(pod: dict[str, Any]) -> int:
    raw = _annotations(pod).get(GPU_FRACTION_NUM_DEVICES_ANNOTATION)
    try:
        return max(1, int(raw)) if raw is not None else 1
    except ValueError:
        return 1


def group_labels(pod: dict[str, Any], groups: Iterable[str]) -> dict[str, str]:
    """KAI's GPU-group labels of a sharing pod: `runai-gpu-group` for one device, `runai-gpu-group/<group>` per
    device for a pod with gpu-fraction-num-devices > 1."""
    groups = list(groups)
    if num_devices(pod) > 1:
        return {MULTI_GROUP_PREFIX + g: g for g in groups}
    return {GPU_GROUP_LABEL: groups[0]} if groups else {}


def pod_groups(pod: dict[str, Any]) -> set[str]:
    """Every GPU group a pod's labels name."""
    out = set()
    for k, v in _labels(pod).items():
        if k == GPU_GROUP_LABEL or k.startswith(MULTI_GROUP_PREFIX):
            out.add(v)
    return out


def new_group() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True)
class ContainerRef:
    """The container that gets the shared GPU: `gpu-fraction-container-name` (init containers first), else the
    first container."""

    name: str
    index: int
    init: bool = False

    @property
    def suffix(self) -> str:
        return f"i{self.index}" if self.init else str(self.index)


def fraction_container(pod: dict[str, Any]) -> ContainerRef:
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    wanted = _annotations(pod).get(CONTAINER_NAME_ANNOTATION)
    if wanted is None:
        if not containers:
            raise SharingError("invalid", "the pod has no containers")
        return ContainerRef(str(containers[0].get("name", "")), 0)
    for init, items in ((True, spec.get("initContainers") or []), (False, containers)):
        for i, c in enumerate(items):
            if c.get("name") == wanted:
                return ContainerRef(wanted, i, init)
    raise SharingError("invalid", f"{CONTAINER_NAME_ANNOTATION}: no container named {wanted!r}")


def configmap_prefix(pod: dict[str, Any], ref: ContainerRef, token: str | None = None) -> str:
    """The pod's shared-GPU ConfigMap prefix: its `runai/shared-gpu-configmap` annotation, else
    `<owner or pod name, shortened>-<7 chars>-shared-gpu` (7 chars from `token`, else derived from the pod's uid),
    short enough that `<prefix>-<container>-evar` and the volume `<prefix>-<container>-vol` stay 63 characters."""
    have = _annotations(pod).get(CONFIGMAP_ANNOTATION)
    if have:
        return have
    meta = _meta(pod)
    owners = meta.get("ownerReferences") or []
    base = str((owners[0].get("name") if owners else None) or meta.get("name") or "pod")
    room = MAX_VOLUME_NAME - (PREFIX_RANDOM + 6) - len(CONFIGMAP_SUFFIX) - (len(str(ref.index)) + 1) - 5
    base = base[:room].rstrip("-.") or "pod"
    if token is None:
        digest = hashlib.sha256(str(meta.get("uid") or meta.get("name")).encode()).digest()
        alphabet = string.ascii_lowercase + string.digits
        token = "".join(alphabet[b % len(alphabet)] for b in digest[:PREFIX_RANDOM])
    return f"{base}-{token[:PREFIX_RANDOM]}-{CONFIGMAP_SUFFIX}"


def configmap_names(prefix: str, ref: ContainerRef) -> tuple[str, str]:
    """(capabilities map, direct environment map) of a container."""
    name = f"{prefix}-{ref.suffix}"
    return name, f"{name}-evar"


def node_gpu_memory_mib(node: dict[str, Any] | None) -> int | None:
    try:
        v = int(_labels(node).get(NODE_GPU_MEMORY_LABEL, ""))
    except ValueError:
        return None
    return v if v > 0 else None


def gpu_portion(pod: dict[str, Any], node: dict[str, Any] | None) -> str:
    """The part of each device the pod was given, as KAI writes it ("0.50"): its fraction, or its GPU memory over
    the node's GPU memory (capped at 1); "" when that is unknown."""
    ann = _annotations(pod)
    try:
        if GPU_FRACTION_ANNOTATION in ann:
            return f"{float(ann[GPU_FRACTION_ANNOTATION]):.2f}"
        mem = int(ann[GPU_MEMORY_ANNOTATION])
    except (KeyError, ValueError):
        return ""
    total = node_gpu_memory_mib(node)
    return f"{min(1.0, mem / total):.2f}" if total else ""


def device_names(gpu_ids: Iterable[str], *, cdi: bool) -> str:
    return ",".join(f"{CDI_PREFIX}{g}" if cdi else g for g in gpu_ids)


def configmaps(pod: dict[str, Any], prefix: str, ref: ContainerRef, visible_devices: str,
               portion: str) -> list[dict[str, Any]]:
    """The pod's two shared-GPU ConfigMaps, owned by the pod (they go with it)."""
    meta = _meta(pod)
    capabilities, direct = configmap_names(prefix, ref)
    owner = [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"), "uid": meta.get("uid")}]
    data = {VISIBLE_DEVICES: visible_devices, GPU_PORTION: portion, NUM_OF_GPUS: portion}
    mem = _annotations(pod).get(GPU_MEMORY_ANNOTATION)
    if mem is not None:
        data[MEMORY_LIMIT] = str(mem).strip()
    ns = meta.get("namespace") or "default"

    def cm(name: str, d: dict[str, str]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "ownerReferences": owner,
                             "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                "data": d}

    return [cm(capabilities, data), cm(direct, {VISIBLE_DEVICES: visible_devices})]


def reservation_name(node: str) -> str:
    alphabet = string.ascii_lowercase + string.digits
    suffix = "".join(secrets.choice(alphabet) for _ in range(5))
    head = f"{RESERVATION_PREFIX}-{node}"[: 253 - 6].rstrip("-.")
    return f"{head}-{suffix}"


def reservation_pod(cfg: SharingConfig, node: str, group: str, device: int, name: str | None = None
                    ) -> dict[str, Any]:
    """The reservation pod of GPU group `group` (device index `device` of kai-opt's plan) on `node`."""
    container: dict[str, Any] = {
        "name": RESERVATION_CONTAINER,
        "image": cfg.reservation_image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "kai_opt.reservation"],
        "resources": {"limits": {GPU_RESOURCE: "1"}, "requests": {GPU_RESOURCE: "1"}},
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
    }
    spec: dict[str, Any] = {"nodeName": node, "serviceAccountName": cfg.reservation_service_account,
                            "containers": [container]}
    if cfg.runtime_class_name:
        spec["runtimeClassName"] = cfg.runtime_class_name
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name or reservation_name(node),
            "namespace": cfg.reservation_namespace,
            "labels": {APP_LABEL: cfg.reservation_app_label, GPU_GROUP_LABEL: group, MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {DO_NOT_DISRUPT_ANNOTATION: "true", GPU_DEVICES_ANNOTATION: str(device)},
        },
        "spec": spec,
    }


def without_gpu(pod: dict[str, Any]) -> dict[str, Any]:
    """A copy of a reservation pod whose containers request no `nvidia.com/gpu` (its device is accounted by the
    pods sharing it)."""
    spec = pod.get("spec") or {}

    def strip(c: dict[str, Any]) -> dict[str, Any]:
        res = c.get("resources") or {}
        return {**c, "resources": {k: {r: q for r, q in (v or {}).items() if r != GPU_RESOURCE}
                                   for k, v in res.items()}}

    return {**pod, "spec": {**spec, "containers": [strip(c) for c in spec.get("containers") or []],
                            "initContainers": [strip(c) for c in spec.get("initContainers") or []]}}


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# -- at bind time ------------------------------------------------------------------------------------------------------
@dataclass
class _Reservation:
    group: str
    name: str
    created: float  # monotonic
    used: float  # monotonic: last bind that used it


class GpuSharingBinder:
    """Prepares shared-GPU pods for their bind (`prepare`), undoes that when the bind fails (`rollback`), and
    deletes reservation pods nobody uses any more (`sync`). `write()` is called before every write (client rate
    limit and leadership fence; it raises to abandon the work); `stop` ends waits early."""

    def __init__(self, api: client.ApiClient, cache: Any, cfg: SharingConfig, *, write: Callable[[], None],
                 stop: threading.Event, timeout: Any = (5.0, 10.0)) -> None:
        self.api = api
        self.cache = cache
        self.cfg = cfg
        self.write = write
        self.stop = stop
        self.timeout = timeout
        self._lock = threading.Lock()
        self._device_locks: dict[tuple[str, int], threading.Lock] = {}
        self._reservations: dict[tuple[str, int], _Reservation] = {}
        self._busy: dict[tuple[str, int], int] = {}

    # -- the bind's part -------------------------------------------------------------------------------------------
    def prepare(self, pod: dict[str, Any] | None, node: str, devices: tuple[int, ...]) -> dict[str, str]:
        """Make a shared pod's placement real before its bind; returns the annotations the Binding adds. Nothing
        for a pod that does not share a GPU. Raises SharingError (bind fails) or an API error (retried)."""
        if pod is None or not shares_gpu(pod):
            return {}
        if not devices:
            raise SharingError("invalid", "a shared-GPU pod was placed without a GPU device")
        ref = fraction_container(pod)
        groups, gpu_ids = [], []
        for device in devices:
            group, gpu = self._reserve(node, device)
            groups.append(group)
            gpu_ids.append(gpu)
        self._label(pod, group_labels(pod, groups))
        prefix = configmap_prefix(pod, ref)
        visible = device_names(gpu_ids, cdi=self.cfg.cdi_device_names)
        for cm in configmaps(pod, prefix, ref, visible, gpu_portion(pod, self.cache.get("v1", "Node", None, node))):
            self._upsert_configmap(cm)
        return {RECEIVED_TYPE_ANNOTATION: "Fraction", CONFIGMAP_ANNOTATION: prefix}

    def rollback(self, pod: dict[str, Any] | None, node: str, devices: tuple[int, ...]) -> None:
        """After a failed bind: the pod loses its group labels (best effort). Its ConfigMaps stay (they go with the
        pod, and the next bind rewrites them: their names do not change), so kai-opt needs no right to delete
        ConfigMaps; the reservation pods stay for `sync` to judge."""
        if pod is None or not shares_gpu(pod):
            return
        with self._lock:
            for d in devices:
                r = self._reservations.get((node, d))
                if r is not None:
                    r.used = time.monotonic()
        meta = _meta(pod)
        ns, name = meta.get("namespace") or "default", meta.get("name")
        try:
            current = request(self.api, "GET", object_path("v1", "pods", ns, name), timeout=self.timeout)
        except Exception:
            return
        if (current.get("spec") or {}).get("nodeName") or _meta(current).get("uid") != meta.get("uid"):
            return  # bound after all (ours or not), or another pod of that name: leave it
        try:
            drop = {k: None for k in _labels(current) if k == GPU_GROUP_LABEL or k.startswith(MULTI_GROUP_PREFIX)}
            if drop:
                self.write()
                request(self.api, "PATCH", object_path("v1", "pods", ns, name),
                        body={"metadata": {"labels": drop}}, content_type=MERGE_PATCH, timeout=self.timeout)
        except Exception as exc:  # best effort: a stale label on an unbound pod holds nothing
            log.debug("rollback of %s/%s: %s", ns, name, exc)

    def _device_lock(self, key: tuple[str, int]) -> threading.Lock:
        with self._lock:
            return self._device_locks.setdefault(key, threading.Lock())

    def _reserve(self, node: str, device: int) -> tuple[str, str]:
        """(group, GPU id) of device `device` on `node`: its reservation pod, created when there is none, waited
        for until it reports its GPU."""
        key = (node, device)
        with self._lock:
            self._busy[key] = self._busy.get(key, 0) + 1
        try:
            with self._device_lock(key):
                r = self._current(key)
                if r is None:
                    group = self._group_of_bound_pods(node, device) or new_group()
                    r = self._create_reservation(node, device, group)
                r.used = time.monotonic()
                gpu = self._await_gpu(r, node)
                r.used = time.monotonic()
                return r.group, gpu
        finally:
            with self._lock:
                self._busy[key] -= 1
                if not self._busy[key]:
                    del self._busy[key]

    def _current(self, key: tuple[str, int]) -> _Reservation | None:
        """The live reservation of a device: the one we know (unless the watch shows it gone), else one of ours
        on the watch."""
        node, device = key
        ns = self.cfg.reservation_namespace
        with self._lock:
            r = self._reservations.get(key)
        if r is not None:
            obj = self.cache.pod(ns, r.name)
            if obj is not None and not _meta(obj).get("deletionTimestamp"):
                return r
            if obj is None and time.monotonic() - r.created < SETTLE_S:
                return r  # created a moment ago: the watch has not shown it yet
            with self._lock:
                self._reservations.pop(key, None)
        for obj in self._reservation_pods():
            meta = _meta(obj)
            if ((obj.get("spec") or {}).get("nodeName") == node and not meta.get("deletionTimestamp")
                    and _annotations(obj).get(GPU_DEVICES_ANNOTATION) == str(device)
                    and _labels(obj).get(GPU_GROUP_LABEL)):
                now = time.monotonic()
                age = _age_s(meta.get("creationTimestamp"))
                r = _Reservation(_labels(obj)[GPU_GROUP_LABEL], meta["name"], now - age, now)
                with self._lock:
                    self._reservations[key] = r
                return r
        return None

    def _group_of_bound_pods(self, node: str, device: int) -> str | None:
        """The group of a bound, unfinished sharing pod on this device (its reservation pod went away)."""
        _obj, on_node, _assumed = self.cache.node_view(node)
        for p in on_node:
            if _finished(p) or _meta(p).get("namespace") == self.cfg.reservation_namespace:
                continue
            labels = _labels(p)
            if GPU_GROUP_LABEL in labels and _annotations(p).get(GPU_DEVICES_ANNOTATION) == str(device):
                return labels[GPU_GROUP_LABEL]
        return None

    def _reservation_pods(self) -> list[dict[str, Any]]:
        ns = self.cfg.reservation_namespace
        return [p for p in self.cache.list("Pod", "v1")
                if _meta(p).get("namespace") == ns and _labels(p).get(MANAGED_BY_LABEL) == MANAGED_BY
                and _labels(p).get(APP_LABEL) == self.cfg.reservation_app_label]

    def _create_reservation(self, node: str, device: int, group: str) -> _Reservation:
        body = reservation_pod(self.cfg, node, group, device)
        self.write()
        request(self.api, "POST", object_path("v1", "pods", self.cfg.reservation_namespace), body=body,
                timeout=self.timeout)
        now = time.monotonic()
        r = _Reservation(group, body["metadata"]["name"], now, now)
        with self._lock:
            self._reservations[(node, device)] = r
        log.info("GPU reservation pod %s/%s created on %s (device %d, group %s)", self.cfg.reservation_namespace,
                 r.name, node, device, group)
        return r

    def _await_gpu(self, r: _Reservation, node: str) -> str:
        ns = self.cfg.reservation_namespace
        deadline = r.created + self.cfg.reservation_timeout_s
        while True:
            obj = self.cache.pod(ns, r.name)
            gpu = _annotations(obj).get(RESERVED_GPU_ANNOTATION, "").strip()
            if gpu:
                return gpu
            if (obj is not None and _meta(obj).get("deletionTimestamp")) or (
                    obj is None and time.monotonic() - r.created > SETTLE_S):
                self._forget(node, r)
                raise SharingError("reservation-gone", f"GPU reservation pod {ns}/{r.name} on {node} went away "
                                   "before it reported its GPU")
            if time.monotonic() >= deadline:
                self._delete_reservation(r.name)
                self._forget(node, r)
                raise SharingError("reservation-timeout", f"GPU reservation pod {ns}/{r.name} on {node} did not "
                                   f"report its GPU ({RESERVED_GPU_ANNOTATION}) within "
                                   f"{self.cfg.reservation_timeout_s:g}s; it was deleted")
            if self.stop.wait(POLL_S):
                raise SharingError("dropped", "stopping")

    def _forget(self, node: str, r: _Reservation) -> None:
        with self._lock:
            for key, known in list(self._reservations.items()):
                if known is r and key[0] == node:
                    del self._reservations[key]

    def _delete_reservation(self, name: str) -> None:
        try:
            self.write()
            request(self.api, "DELETE", object_path("v1", "pods", self.cfg.reservation_namespace, name),
                    query={"gracePeriodSeconds": 0}, timeout=self.timeout)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _label(self, pod: dict[str, Any], labels: dict[str, str]) -> None:
        """Set the pod's group labels (stale group labels of an earlier attempt removed); the pod's uid is the
        patch's precondition."""
        meta = _meta(pod)
        current = _labels(pod)
        patch: dict[str, Any] = {k: None for k in current
                                 if (k == GPU_GROUP_LABEL or k.startswith(MULTI_GROUP_PREFIX)) and k not in labels}
        patch.update({k: v for k, v in labels.items() if current.get(k) != v})
        if not patch:
            return
        self.write()
        request(self.api, "PATCH", object_path("v1", "pods", meta.get("namespace") or "default", meta.get("name")),
                body={"metadata": {"uid": meta.get("uid"), "labels": patch}}, content_type=MERGE_PATCH,
                timeout=self.timeout)

    def _upsert_configmap(self, cm: dict[str, Any]) -> None:
        meta = cm["metadata"]
        self.write()
        try:
            request(self.api, "POST", object_path("v1", "configmaps", meta["namespace"]), body=cm,
                    timeout=self.timeout)
            return
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.write()  # it exists (an earlier attempt, or a stale map of that name): ours from now on
        request(self.api, "PATCH", object_path("v1", "configmaps", meta["namespace"], meta["name"]),
                body={"metadata": {"ownerReferences": meta["ownerReferences"], "labels": meta["labels"]},
                      "data": cm["data"]}, content_type=MERGE_PATCH, timeout=self.timeout)

    # -- cleaning up ---------------------------------------------------------------------------------------------------
    def sync(self) -> list[str]:
        """Delete kai-opt's reservation pods whose group no unfinished pod on their node carries any more (and no
        bind used within SETTLE_S); returns the names deleted."""
        reservations = self._reservation_pods()
        if not reservations:
            return []
        ns = self.cfg.reservation_namespace
        used: set[tuple[str, str]] = set()
        for p in self.cache.list("Pod", "v1"):
            node = (p.get("spec") or {}).get("nodeName")
            if not node or _meta(p).get("namespace") == ns or _finished(p):
                continue
            for g in pod_groups(p):
                used.add((node, g))
        deleted = []
        now = time.monotonic()
        for obj in reservations:
            meta = _meta(obj)
            node = (obj.get("spec") or {}).get("nodeName") or ""
            group = _labels(obj).get(GPU_GROUP_LABEL, "")
            if meta.get("deletionTimestamp") or (node, group) in used:
                continue
            with self._lock:
                keys = [k for k, r in self._reservations.items() if r.name == meta.get("name")]
                if any(k in self._busy for k in keys) or any(now - self._reservations[k].used < SETTLE_S
                                                             for k in keys):
                    continue
                if not keys and _age_s(meta.get("creationTimestamp")) < SETTLE_S:
                    continue
                for k in keys:
                    del self._reservations[k]
            try:
                self._delete_reservation(meta["name"])
            except Exception as exc:  # next sync tries again
                log.warning("deleting GPU reservation pod %s/%s failed: %s", ns, meta.get("name"), exc)
                continue
            log.info("GPU reservation pod %s/%s on %s deleted: no pod shares its GPU any more", ns, meta["name"],
                     node)
            deleted.append(meta["name"])
        return deleted


def _age_s(stamp: Any) -> float:
    """Seconds since an RFC 3339 timestamp (0 when unknown)."""
    if not isinstance(stamp, str):
        return 0.0
    try:
        t = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
    return max(0.0, time.time() - t)
