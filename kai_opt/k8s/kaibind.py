"""Hand-off to KAI-Scheduler's binder (`runtime.binder: kai`): kai-opt writes KAI's BindRequest objects
(`scheduling.run.ai/v1alpha2`) instead of binding, and follows their status, so a cluster running KAI keeps one
binder.

One BindRequest per pod, named and namespaced like the pod and owned by it (KAI's scheduler does the same): the
selected node, `receivedResourceType` (`Fraction` for a pod sharing a GPU, else `Regular`), `receivedGPU` (devices
and the portion of each), the GPU groups of a sharing pod, the allocations of its DRA claims, `backoffLimit`.
KAI's binder then binds the pod and, for a sharing pod, creates the group's reservation pod and the pod's
shared-GPU ConfigMaps; kai-opt's own GPU-sharing binder (kai_opt/k8s/sharing.py) is not used.

Rules:
- Before the BindRequest, one patch of the pod records kai-opt's device indexes (`kai-opt.io/gpu-devices`, as its
  own Binding would) and, for a sharing pod without one, the ConfigMap prefix KAI's binder needs
  (`runai/shared-gpu-configmap`, normally written by the admission webhook). The BindRequest carries the devices
  in the same annotation, aligned with `selectedGPUGroups`.
- DRA claims (`resourceClaimAllocations`, KAI's `ResourceClaimAllocation`): one entry per claim of the bind,
  named by the pod's `spec.resourceClaims` entry, with the claim's allocation (the one it has, or the devices the
  cycle chose, as kai-opt's own binder would write it: kai_opt.k8s.dra.ClaimWriter.allocation_entry). KAI's binder
  finds the claim through the pod (a template's claim must exist and be in the pod's status: kai-opt makes it
  first), writes the allocation if the claim has none and adds the pod to reservedFor. A failed bind lets the
  pod's claims go again (ClaimWriter.release_pod); pods gone or finished are released by the same sweep as with
  kai-opt's own binder (kai_opt.k8s.dra.release).
- A device (node, index) maps to one GPU group: the group of a pod on it (bound, or with a pending BindRequest),
  else a group handed out for it within SETTLE_S (the watch may lag), else a new one.
- State, KAI's rule: Failed once the phase is Failed and failedAttempts >= backoffLimit (no limit: at once).
  While a BindRequest is pending, its pod counts as bound on the selected node (also after a restart). A failed
  one, or one neither bound nor failed within `bind_timeout_s`, is deleted and the bind fails (the cache's
  assumption dropped, the pod placed again next cycle); so does one that disappears before its pod is bound.
- A BindRequest whose pod is gone, or whose pod finished, is deleted (KAI's binder then frees the pod's GPU groups:
  it only watches pods of its own scheduler name). Those of bound, running pods stay (their owner reference
  removes them with the pod), as KAI's scheduler leaves them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.api.pod import GPU_DEVICES_ANNOTATION
from kai_opt.config import KaiBinder
from kai_opt.k8s.client import MERGE_PATCH, object_path, request
from kai_opt.k8s.dra import ClaimWrite, ClaimWriter
from kai_opt.k8s.kinds import BINDREQUEST_API_VERSION, BINDREQUEST_KIND, BINDREQUEST_PLURAL
from kai_opt.k8s.sharing import (
    CONFIGMAP_ANNOTATION,
    GPU_GROUP_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SharingError,
    configmap_prefix,
    fraction_container,
    gpu_portion,
    new_group,
    shares_gpu,
)

if TYPE_CHECKING:
    from kai_opt.k8s.shard import ShardFilter

log = logging.getLogger(__name__)

API_VERSION, KIND, PLURAL = BINDREQUEST_API_VERSION, BINDREQUEST_KIND, BINDREQUEST_PLURAL
SELECTED_NODE_LABEL = "selected-node"
PHASE_FAILED = "Failed"
PHASE_SUCCEEDED = "Succeeded"
REGULAR = "Regular"
FRACTION = "Fraction"
PENDING, SUCCEEDED, FAILED = "pending", "succeeded", "failed"
# a BindRequest written this recently may not be in the watch yet; a group handed out this recently is kept
SETTLE_S = 5.0


class Request(Protocol):
    """What the binder hands off (kai_opt.k8s.binder.BindRequest)."""

    namespace: str
    name: str
    uid: str
    node: str
    devices: tuple[int, ...]
    claims: tuple[ClaimWrite, ...]


# -- the object ---------------------------------------------------------------------------------------------------
def _meta(obj: dict[str, Any] | None) -> dict[str, Any]:
    return (obj or {}).get("metadata") or {}


def _devices_text(devices: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in devices)


def parse_devices(text: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (text or "").split(",") if x.strip())
    except ValueError:
        return ()


def received_gpu(pod: dict[str, Any], node: dict[str, Any] | None, devices: tuple[int, ...]) -> tuple[str, dict]:
    """(receivedResourceType, receivedGPU) as KAI's scheduler writes them: a sharing pod gets `Fraction`, one device
    per GPU group and its portion of each ("0.50"); any other pod `Regular` with its whole devices ("1.00", or
    "0.00" without GPUs)."""
    if shares_gpu(pod):
        return FRACTION, {"count": len(devices), "portion": gpu_portion(pod, node) or "0.00"}
    return REGULAR, {"count": len(devices), "portion": "1.00" if devices else "0.00"}


def bind_request_body(pod: dict[str, Any], node: str, devices: tuple[int, ...], *, groups: list[str],
                      node_obj: dict[str, Any] | None, backoff_limit: int,
                      labels: dict[str, str] | None = None,
                      claims: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The BindRequest of `pod` placed on `node` on `devices` (GPU `groups` aligned with devices, sharing pods);
    `labels`: a scheduling shard's partition label (kai_opt.k8s.shard, as KAI labels its BindRequests); `claims`:
    the `resourceClaimAllocations` entries (ClaimWriter.allocation_entry)."""
    meta = _meta(pod)
    rtype, gpu = received_gpu(pod, node_obj, devices)
    spec: dict[str, Any] = {"podName": meta.get("name"), "selectedNode": node, "receivedResourceType": rtype,
                            "receivedGPU": gpu, "resourceClaimAllocations": list(claims or []),
                            "backoffLimit": backoff_limit}
    if rtype == FRACTION:
        spec["selectedGPUGroups"] = list(groups)
    return {
        "apiVersion": API_VERSION, "kind": KIND,
        "metadata": {
            "name": meta.get("name"), "namespace": meta.get("namespace") or "default",
            "labels": {**(labels or {}), SELECTED_NODE_LABEL: node, MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {GPU_DEVICES_ANNOTATION: _devices_text(devices)},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name"),
                                 "uid": meta.get("uid")}],
        },
        "spec": spec,
    }


def state_of(obj: dict[str, Any]) -> str:
    """pending | succeeded | failed, by KAI's rule (failed: phase Failed and failedAttempts >= backoffLimit)."""
    status = obj.get("status") or {}
    phase = status.get("phase")
    if phase == PHASE_SUCCEEDED:
        return SUCCEEDED
    if phase != PHASE_FAILED:
        return PENDING
    limit = (obj.get("spec") or {}).get("backoffLimit")
    if limit is None:
        return FAILED
    try:
        return FAILED if int(status.get("failedAttempts") or 0) >= int(limit) else PENDING
    except (TypeError, ValueError):
        return FAILED


def is_ours(obj: dict[str, Any]) -> bool:
    return (_meta(obj).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def owner_uid(obj: dict[str, Any]) -> str | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("kind") == "Pod":
            return ref.get("uid")
    return None


def groups_by_device(obj: dict[str, Any] | None) -> dict[int, str]:
    """device index -> GPU group of a BindRequest of ours (its devices annotation aligned with its groups)."""
    if obj is None:
        return {}
    devices = parse_devices((_meta(obj).get("annotations") or {}).get(GPU_DEVICES_ANNOTATION))
    groups = (obj.get("spec") or {}).get("selectedGPUGroups") or []
    return {d: str(g) for d, g in zip(devices, groups, strict=False) if g}


def held_claims(obj: dict[str, Any], pod: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """(claim name, allocation) of a BindRequest's `resourceClaimAllocations`, each entry resolved through the pod
    as KAI's binder does (a claim name, or the claim its template produced in the pod's status)."""
    entries = (obj.get("spec") or {}).get("resourceClaimAllocations") or []
    if not entries:
        return ()
    made = {s.get("name"): s.get("resourceClaimName")
            for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    names = {e.get("name"): e.get("resourceClaimName") or (made.get(e.get("name"))
                                                          if e.get("resourceClaimTemplateName") else None)
             for e in (pod.get("spec") or {}).get("resourceClaims") or []}
    return tuple((str(names[e.get("name")]), e["allocation"]) for e in entries
                 if names.get(e.get("name")) and e.get("allocation"))


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


# -- writing and following them -----------------------------------------------------------------------------------
@dataclass
class _Tracked:
    req: Any  # the binder's request
    start: float  # monotonic: when the bind was accepted
    written: float  # monotonic: when the BindRequest was written (or first seen, after a restart)


class KaiBindRequests:
    """Writes BindRequests (`hand_off`, on a binder worker) and follows them (`sync`, called often). `write()` is
    called before each write (rate limit, leadership; it raises to abandon the work); `done(req, start, ok, reason,
    message)` reports a bind's end (the binder's own `_done`); `make_request(ns, name, uid, node, devices)` builds
    the binder's request for a pending BindRequest met after a restart."""

    def __init__(self, api: client.ApiClient, cache: Any, cfg: KaiBinder, *, write: Callable[[], None],
                 done: Callable[..., None], make_request: Callable[..., Any], timeout: Any = (5.0, 10.0),
                 claims: ClaimWriter | None = None) -> None:
        self.api = api
        self.cache = cache
        self.cfg = cfg
        self.write = write
        self.done = done
        self.make_request = make_request
        self.timeout = timeout
        self.claims = claims  # DRA: the allocations the BindRequest carries
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}  # pod uid -> its pending hand-off
        self._recent: dict[tuple[str, int], tuple[str, float]] = {}  # (node, device) -> (group, when handed out)
        self._deleted: set[str] = set()  # BindRequest uids deleted (the watch may still show them)
        self.shard: ShardFilter | None = None  # a scheduling shard follows the BindRequests of its partition only

    def tracking(self, uid: str) -> bool:
        with self._lock:
            return uid in self._tracked

    # -- the bind's part ------------------------------------------------------------------------------------------
    def hand_off(self, req: Request, start: float) -> None:
        """Record the devices on the pod, then write its BindRequest. Raises SharingError (the bind fails) or an API
        error (classified by the binder: transient ones are retried)."""
        pod = self.cache.pod(req.namespace, req.name)
        if pod is None:
            raise SharingError("not-found", "the pod is gone")
        if _meta(pod).get("uid") != req.uid:
            raise SharingError("conflict", "another pod of that name")
        shared = shares_gpu(pod)
        if shared and not req.devices:
            raise SharingError("invalid", "a shared-GPU pod was placed without a GPU device")
        claims = []
        if req.claims:
            if self.claims is None:
                raise SharingError("invalid", "a pod with DRA claims and no claim writer")
            claims = [self.claims.allocation_entry(req.namespace, req.name, req.uid, req.node, w)
                      for w in req.claims]
        groups = self._groups(req.node, req.devices) if shared else []
        self._annotate(pod, req.devices, shared)
        body = bind_request_body(pod, req.node, req.devices, groups=groups,
                                 node_obj=self.cache.get("v1", "Node", None, req.node),
                                 backoff_limit=self.cfg.backoff_limit,
                                 labels=self.shard.labels() if self.shard is not None else None, claims=claims)
        self._create(body, req)
        now = time.monotonic()
        with self._lock:
            self._tracked[req.uid] = _Tracked(req, start, now)

    def _annotate(self, pod: dict[str, Any], devices: tuple[int, ...], shared: bool) -> None:
        """One patch (uid precondition): kai-opt's device record, and a sharing pod's ConfigMap prefix if missing."""
        meta = _meta(pod)
        have = meta.get("annotations") or {}
        want: dict[str, str] = {}
        text = _devices_text(devices)
        if have.get(GPU_DEVICES_ANNOTATION, "") != text and (text or GPU_DEVICES_ANNOTATION in have):
            want[GPU_DEVICES_ANNOTATION] = text
        if shared and not have.get(CONFIGMAP_ANNOTATION):
            want[CONFIGMAP_ANNOTATION] = configmap_prefix(pod, fraction_container(pod))
        if not want:
            return
        self.write()
        request(self.api, "PATCH", object_path("v1", "pods", meta.get("namespace") or "default", meta.get("name")),
                body={"metadata": {"uid": meta.get("uid"), "annotations": want}}, content_type=MERGE_PATCH,
                timeout=self.timeout)

    def _create(self, body: dict[str, Any], req: Request) -> None:
        """POST; a BindRequest of that name already there is ours from an earlier attempt (same pod and node: done),
        stale (failed, or of an earlier pod of that name: replaced once), or a pending one elsewhere (conflict)."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for attempt in range(2):
            self.write()
            try:
                request(self.api, "POST", object_path(API_VERSION, PLURAL, ns), body=body, timeout=self.timeout)
                return
            except ApiException as exc:
                if exc.status != 409 or attempt:
                    raise
            old = request(self.api, "GET", object_path(API_VERSION, PLURAL, ns, name), timeout=self.timeout)
            same_pod = owner_uid(old) == req.uid
            if same_pod and state_of(old) != FAILED:
                if (old.get("spec") or {}).get("selectedNode") == req.node:
                    return
                raise SharingError("conflict", f"a BindRequest of this pod to "
                                   f"{(old.get('spec') or {}).get('selectedNode')} is pending")
            self._delete(old)

    def _groups(self, node: str, devices: tuple[int, ...]) -> list[str]:
        """The GPU group of each device (see the module docstring)."""
        known: dict[int, str] = {}
        _obj, pods, assumed = self.cache.node_view(node)
        for p in pods:
            if _finished(p) or _meta(p).get("deletionTimestamp"):
                continue
            meta = _meta(p)
            mine = groups_by_device(self.cache.get(API_VERSION, KIND, meta.get("namespace"), meta.get("name")))
            if not mine:  # bound without a BindRequest of ours: one device, one group label
                devs = parse_devices((meta.get("annotations") or {}).get(GPU_DEVICES_ANNOTATION))
                group = (meta.get("labels") or {}).get(GPU_GROUP_LABEL)
                mine = {devs[0]: group} if group and len(devs) == 1 else {}
            for d, g in mine.items():
                known.setdefault(d, g)
        for _uid, a in assumed:
            for d, g in groups_by_device(self.cache.get(API_VERSION, KIND, a.namespace, a.name)).items():
                known.setdefault(d, g)
        now = time.monotonic()
        out = []
        with self._lock:
            for key in [k for k, (_g, t) in self._recent.items() if now - t > SETTLE_S]:
                del self._recent[key]
            for d in devices:
                recent = self._recent.get((node, d))
                group = known.get(d) or (recent[0] if recent else None) or new_group()
                self._recent[(node, d)] = (group, now)
                out.append(group)
        return out

    def _delete(self, obj: dict[str, Any]) -> None:
        meta = _meta(obj)
        self.write()
        try:
            request(self.api, "DELETE", object_path(API_VERSION, PLURAL, meta.get("namespace"), meta.get("name")),
                    body={"preconditions": {"uid": meta.get("uid")}}, timeout=self.timeout)
        except ApiException as exc:
            if exc.status not in (404, 409):  # 409: a newer object of that name, not this one
                raise
        with self._lock:
            self._deleted.add(str(meta.get("uid")))

    # -- following them ---------------------------------------------------------------------------------------------
    def sync(self) -> None:
        """Look at every BindRequest of ours once (see the module docstring); one that cannot be handled now is
        looked at again next time."""
        now = time.monotonic()
        seen: set[str] = set()
        present: set[str] = set()
        for obj in self.cache.list(KIND, API_VERSION):
            if not is_ours(obj) or (self.shard is not None and not self.shard.matches(_meta(obj).get("labels"))):
                continue  # KAI's, or another shard's
            present.add(str(_meta(obj).get("uid")))
            uid = owner_uid(obj)
            if uid:
                seen.add(uid)
            try:
                self._sync_one(obj, uid, now)
            except Exception as exc:  # (not the leader, API errors): next time
                log.debug("BindRequest %s/%s: %s", _meta(obj).get("namespace"), _meta(obj).get("name"), exc)
        with self._lock:
            self._deleted &= present
            gone = [(uid, t) for uid, t in self._tracked.items() if uid not in seen and now - t.written > SETTLE_S]
        for uid, t in gone:
            pod = self.cache.pod(t.req.namespace, t.req.name)
            if pod is not None and _meta(pod).get("uid") == uid and (pod.get("spec") or {}).get("nodeName"):
                self._finish(uid, True)
            else:
                self._finish(uid, False, "bind-request-gone", "the BindRequest was deleted before the pod was bound")

    def _sync_one(self, obj: dict[str, Any], uid: str | None, now: float) -> None:
        meta, spec = _meta(obj), obj.get("spec") or {}
        if meta.get("deletionTimestamp") or str(meta.get("uid")) in self._deleted:
            return
        ns, pod_name, node = meta.get("namespace") or "default", spec.get("podName") or "", spec.get("selectedNode")
        pod = self.cache.pod(ns, pod_name)
        if pod is None or uid is None or _meta(pod).get("uid") != uid:
            self._delete(obj)  # its pod is gone
            if uid is not None:
                self._finish(uid, False, "not-found", "the pod is gone")
            return
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            if bound_to == node:
                self._finish(uid, True)
            else:
                self._finish(uid, False, "conflict", f"the pod was bound to {bound_to} meanwhile")
            if _finished(pod):
                self._delete(obj)  # KAI's binder frees the pod's GPU groups
            return
        state = state_of(obj)
        if state == FAILED:
            reason = " ".join(str((obj.get("status") or {}).get("reason") or "").split())[:300]
            self._delete(obj)
            self._finish(uid, False, "bind-request-failed", f"KAI's binder failed: {reason or 'no reason given'}")
            return
        devices = parse_devices((meta.get("annotations") or {}).get(GPU_DEVICES_ANNOTATION))
        with self._lock:
            t = self._tracked.get(uid)
            if t is None:  # written by an earlier run (or another replica): followed from now on
                t = self._tracked[uid] = _Tracked(self.make_request(ns, pod_name, uid, node, devices), now, now)
        if now - t.written > self.cfg.bind_timeout_s:
            self._delete(obj)
            self._finish(uid, False, "bind-request-timeout", f"KAI's binder did not bind the pod within "
                         f"{self.cfg.bind_timeout_s:g}s of its BindRequest; it was deleted")
            return
        # pending, or succeeded and the pod watch shows it bound soon: it counts as bound there meanwhile, its
        # claims allocated as the BindRequest says
        self.cache.hold_bound(uid, ns, pod_name, node, devices, held_claims(obj, pod))

    def _finish(self, uid: str, ok: bool, reason: str = "", message: str = "") -> None:
        with self._lock:
            t = self._tracked.pop(uid, None)
        if t is not None:
            self.done(t.req, t.start, ok=ok, reason=reason, message=message)
        elif not ok:
            self.cache.forget_bound(uid)  # a hold of ours without a bind in progress
