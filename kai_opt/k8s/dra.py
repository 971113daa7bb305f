"""DRA on the cluster: a pod's claims are allocated and reserved before its Binding, and released after it is gone.

As kube-scheduler's DRA plugin: the cycle chooses the devices (`ClaimDevices.for_bind`, from the plan's node and
the devices no claim holds, nor a write of ours in flight); before the Binding, `ClaimWriter.prepare` reads each
claim fresh, checks the slices it was planned on still have that generation, and writes the claim's
`status.allocation` (devices with driver, pool and device; the node as node selector) and `status.reservedFor`
with the pod through the status subresource with the claim's resourceVersion (optimistic concurrency). A conflict
(409), a claim allocated elsewhere meanwhile or a stale slice generation drops the bind (the pod is placed again
next cycle); claims this bind already wrote are put back. A claim from a template that has no claim yet is made
first, named as the resourceclaim controller names it (`<pod>-<claim>-` plus a generated suffix), owned by the
pod, and recorded in the pod's `status.resourceClaimStatuses`.

`release` (every cycle): a claim whose reservedFor names pods that are gone or finished drops them; a claim
nobody reserves any more loses its allocation, so its devices are free for the next pod.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from kai_opt.api.dra import API_VERSION, AllocationResult
from kai_opt.dra.allocate import choose
from kai_opt.dra.prepare import DraState
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import MERGE_PATCH, object_path, request

log = logging.getLogger(__name__)
INFLIGHT_S = 60.0  # a chosen device counts as taken this long, or until the watch shows its claim allocated
DeviceKey = tuple[str, str, str]  # (driver, pool, device)


class ClaimError(Exception):
    """A claim write that cannot go ahead: `reason` is the bind's failure reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class ClaimWrite:
    """One claim of a bind: which claim (or the pod's claim entry and its template), the devices chosen for it
    (None: it is allocated already) and the slices (name, generation) they were chosen from."""

    pod_claim: str  # the entry name in the pod's spec.resourceClaims
    name: str | None  # the ResourceClaim; None: to be made from `template`
    template: str | None
    results: tuple[AllocationResult, ...] | None
    slices: tuple[tuple[str, int], ...] = ()


class ClaimDevices:
    """The cycle side: devices for the claims of the pods the plan binds (not reusing devices in flight)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[DeviceKey, float] = {}
        # pod key -> (until, shares chosen for it): counted until the watch shows its claims allocated
        self._inflight_use: dict[str, tuple[float, dict[DeviceKey, dict[str, int]]]] = {}

    def seen(self, dra: DraState) -> None:
        """A cycle's view: devices it shows allocated are held by their allocation from now on, not as writes in
        flight, so once released (a reclaim victim's claim) they are free at once, not INFLIGHT_S after they were
        chosen."""
        with self._lock:
            self._inflight = {k: t for k, t in self._inflight.items() if k not in dra.allocated}

    def for_bind(self, dra: DraState, pod_key: str, node: str) -> tuple[ClaimWrite, ...] | None:
        """The claim writes of one bind, or None when the node lacks free devices now (the bind waits)."""
        now = time.monotonic()
        with self._lock:
            self._inflight = {k: t for k, t in self._inflight.items() if t > now and k not in dra.allocated}
            self._inflight_use = {k: v for k, v in self._inflight_use.items() if v[0] > now
                                  and not _all_allocated(dra, k)}
            taken = set(dra.allocated) | set(self._inflight)
            used = {k: dict(v) for k, v in dra.consumed.items()}
            for k in self._inflight:  # what devices in flight take of their counter sets
                if (di := dra.index_of(k)) is not None:
                    dra.take_counters(di, used)
            for _until, shares in self._inflight_use.values():
                for dev, amounts in shares.items():
                    mine = used.setdefault(dev, {})
                    for cap, v in amounts.items():
                        mine[cap] = mine.get(cap, 0) + v
            mine_now: dict[DeviceKey, dict[str, int]] = {}
            out = []
            chosen: list[DeviceKey] = []
            for i in dra.pod_claims.get(pod_key, []):
                cp = dra.claims[i]
                claim_name = cp.claim.meta.name if cp.claim is not None else None
                entry = cp.key.split("/", 1)[1]
                pod_name = pod_key.split("/", 1)[1]
                pod_claim = entry.removeprefix(f"{pod_name}-") if cp.claim is None else ""
                if cp.claim is not None and cp.claim.allocation is not None:
                    out.append(ClaimWrite(pod_claim, claim_name, None, None))
                    continue
                results = choose(dra, cp, node, taken, used)
                if results is None:
                    return None
                for r in results:
                    if r.consumed:
                        at = mine_now.setdefault((r.driver, r.pool, r.device), {})
                        for cap, v in r.consumed.items():
                            at[cap] = at.get(cap, 0) + v
                slices = {(dra.devices[d].slice_name, dra.devices[d].generation) for d, dev in
                          enumerate(dra.devices) if (dev.driver, dev.pool, dev.name) in
                          {(r.driver, r.pool, r.device) for r in results}}
                chosen += [(r.driver, r.pool, r.device) for r in results if not r.admin_access and not r.consumed]
                out.append(ClaimWrite(pod_claim, claim_name, cp.template, results, tuple(sorted(slices))))
            for k in chosen:
                self._inflight[k] = now + INFLIGHT_S
            if mine_now:
                self._inflight_use[pod_key] = (now + INFLIGHT_S, mine_now)
            return tuple(out)

    def forget(self, writes: tuple[ClaimWrite, ...], pod_key: str | None = None) -> None:
        """A bind that failed: its devices (and shares) are free again."""
        with self._lock:
            if pod_key is not None:
                self._inflight_use.pop(pod_key, None)
            for w in writes:
                for r in w.results or ():
                    self._inflight.pop((r.driver, r.pool, r.device), None)


def _all_allocated(dra: DraState, pod_key: str) -> bool:
    """Every claim of the pod is allocated in this cycle's view (its shares are in `dra.consumed` now)."""
    idx = dra.pod_claims.get(pod_key, [])
    return bool(idx) and all((c := dra.claims[i].claim) is not None and c.allocation is not None for i in idx)


def _result(r: AllocationResult) -> dict[str, Any]:
    """One allocation result as the API spells it (a share: its consumedCapacity, names as the slice gives
    them, and a fresh shareID)."""
    out: dict[str, Any] = {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device}
    if r.admin_access:
        out["adminAccess"] = True
    if r.consumed:
        out["consumedCapacity"] = {k.removeprefix(f"{r.driver}/"): str(v) for k, v in r.consumed.items()}
        out["shareID"] = r.share_id or str(uuid.uuid4())
    return out


def _claims_path(ns: str, name: str | None = None) -> str:
    return object_path(API_VERSION, "resourceclaims", ns, name)


def node_selector(node: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def new_allocation(results: tuple[AllocationResult, ...], node: str) -> dict[str, Any]:
    """A claim's `status.allocation` (resource.k8s.io/v1 AllocationResult): the devices, and the node."""
    return {"devices": {"results": [_result(r) for r in results]}, "nodeSelector": node_selector(node)}


class ClaimWriter:
    """The bind side: writes a pod's claims before its Binding (see the module doc)."""

    def __init__(self, api: client.ApiClient, cache: ClusterCache, timeout: Any) -> None:
        self.api = api
        self.cache = cache
        self.timeout = timeout

    def prepare(self, ns: str, pod_name: str, pod_uid: str, node: str,
                writes: tuple[ClaimWrite, ...]) -> list[tuple[str, dict[str, Any]]]:
        """Allocate and reserve the bind's claims; returns what `rollback` needs should the Binding fail."""
        done: list[tuple[str, dict[str, Any]]] = []  # (claim name, the claim as it was) for a rollback
        try:
            for w in writes:
                name = w.name or self._own_claim(ns, pod_name, pod_uid, w)
                claim = request(self.api, "GET", _claims_path(ns, name), timeout=self.timeout)
                before = {k: v for k, v in claim.items() if k in ("metadata", "status")}
                self._write(ns, pod_name, pod_uid, node, w, claim)
                done.append((name, before))
        except Exception:
            self.rollback(ns, pod_name, done)
            raise
        return done

    def _stale_slice(self, w: ClaimWrite) -> str | None:
        for name, generation in w.slices:
            s = self.cache.get(API_VERSION, "ResourceSlice", None, name)
            have = ((s or {}).get("spec") or {}).get("pool", {}).get("generation")
            if s is None or have != generation:
                return f"ResourceSlice {name} is at generation {have}, the devices were chosen at {generation}"
        return None

    def _write(self, ns: str, pod_name: str, uid: str, node: str, w: ClaimWrite, claim: dict[str, Any]) -> None:
        status = dict(claim.get("status") or {})
        reserved = list(status.get("reservedFor") or [])
        if status.get("allocation") is None:
            if w.results is None:
                raise ClaimError("claim-conflict", f"claim {ns}/{claim['metadata']['name']} lost its allocation")
            stale = self._stale_slice(w)
            if stale:
                raise ClaimError("stale-slice", stale)
            status["allocation"] = new_allocation(w.results, node)
        elif not _allocated_on(status["allocation"], node):
            raise ClaimError("claim-conflict", f"claim {ns}/{claim['metadata']['name']} is allocated elsewhere")
        if not any(r.get("uid") == uid for r in reserved):
            reserved.append({"resource": "pods", "name": pod_name, "uid": uid})
        status["reservedFor"] = reserved
        body = {**claim, "status": status}  # metadata carries the resourceVersion read: a conflict is a 409
        try:
            request(self.api, "PUT", _claims_path(ns, claim["metadata"]["name"]) + "/status", body=body,
                    timeout=self.timeout)
        except client.exceptions.ApiException as exc:
            if exc.status == 409:
                raise ClaimError("claim-conflict", f"claim {ns}/{claim['metadata']['name']} changed meanwhile") from exc
            raise

    def allocation_entry(self, ns: str, pod_name: str, uid: str, node: str, w: ClaimWrite) -> dict[str, Any]:
        """binder: kai: the claim's entry of the pod's BindRequest (`resourceClaimAllocations[]`, KAI's
        `ResourceClaimAllocation`): the pod's claim entry name and the allocation KAI's binder writes if the claim
        has none (it then adds the pod to reservedFor). The claim must exist and be named in the pod's status
        (KAI's binder looks it up there): a template's is made first. The same checks as `prepare`: allocated
        elsewhere, lost its allocation, a stale slice generation raise ClaimError."""
        name = w.name or self._own_claim(ns, pod_name, uid, w)
        claim = request(self.api, "GET", _claims_path(ns, name), timeout=self.timeout)
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation is not None:
            if not _allocated_on(allocation, node):
                raise ClaimError("claim-conflict", f"claim {ns}/{name} is allocated elsewhere")
        elif w.results is None:
            raise ClaimError("claim-conflict", f"claim {ns}/{name} lost its allocation")
        else:
            stale = self._stale_slice(w)
            if stale:
                raise ClaimError("stale-slice", stale)
            allocation = new_allocation(w.results, node)
        entry = w.pod_claim or self._pod_claim_entry(ns, pod_name, name)
        return {"name": entry, "allocation": allocation}

    def _pod_claim_entry(self, ns: str, pod_name: str, claim_name: str) -> str:
        """The name of the pod's `spec.resourceClaims` entry that resolves to `claim_name` (directly, or through
        the claim its template produced, as the pod's status records it)."""
        pod = self.cache.pod(ns, pod_name) or request(self.api, "GET", object_path("v1", "pods", ns, pod_name),
                                                       timeout=self.timeout)
        for e in (pod.get("spec") or {}).get("resourceClaims") or []:
            if e.get("resourceClaimName") == claim_name:
                return str(e.get("name"))
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if s.get("resourceClaimName") == claim_name:
                return str(s.get("name"))
        raise ClaimError("claim-conflict", f"pod {ns}/{pod_name} no longer names claim {claim_name}")

    def release_pod(self, ns: str, pod_name: str, uid: str) -> None:
        """binder: kai, a bind that failed: the claims reserved for the pod let it go (and lose their allocation
        when nobody is left), as `rollback` does for kai-opt's own binder; nothing while the pod is bound."""
        pod = self.cache.pod(ns, pod_name)
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid or (pod.get("spec") or {}).get("nodeName"):
            return
        for claim in self.cache.list("ResourceClaim", API_VERSION):
            meta = claim.get("metadata") or {}
            if (meta.get("namespace") or "default") != ns or not any(
                    r.get("uid") == uid for r in (claim.get("status") or {}).get("reservedFor") or []):
                continue
            try:
                fresh = request(self.api, "GET", _claims_path(ns, meta.get("name")), timeout=self.timeout)
                _release_one(self.api, fresh, {pod_name}, self.timeout)
            except Exception as exc:  # the release sweep finishes the job
                log.warning("claim %s/%s: release after a failed bind failed: %s", ns, meta.get("name"), exc)

    def _own_claim(self, ns: str, pod_name: str, uid: str, w: ClaimWrite) -> str:
        """The pod's claim of a template: the one its status names, else a new one made from the template."""
        pod = request(self.api, "GET", object_path("v1", "pods", ns, pod_name), timeout=self.timeout)
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if s.get("name") == w.pod_claim and s.get("resourceClaimName"):
                return str(s["resourceClaimName"])
        tmpl = request(self.api, "GET", object_path(API_VERSION, "resourceclaimtemplates", ns, w.template),
                       timeout=self.timeout)
        spec = tmpl.get("spec") or {}
        meta = spec.get("metadata") or {}
        body = {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": {
            "generateName": f"{pod_name}-{w.pod_claim}-"[:57], "namespace": ns,
            "labels": meta.get("labels") or {}, "annotations": {**(meta.get("annotations") or {}),
                                                                "resource.kubernetes.io/pod-claim-name": w.pod_claim},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": uid,
                                 "controller": True, "blockOwnerDeletion": True}]},
            "spec": spec.get("spec") or {}}
        made = request(self.api, "POST", _claims_path(ns), body=body, timeout=self.timeout)
        name = str(made["metadata"]["name"])
        statuses = [s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
                    if s.get("name") != w.pod_claim]
        statuses.append({"name": w.pod_claim, "resourceClaimName": name})
        request(self.api, "PATCH", object_path("v1", "pods", ns, pod_name) + "/status",
                body={"status": {"resourceClaimStatuses": statuses}}, content_type=MERGE_PATCH, timeout=self.timeout)
        return name

    def rollback(self, ns: str, pod_name: str, done: list[tuple[str, dict[str, Any]]]) -> None:
        """Put back the claims a failed bind wrote (best effort: the release sweep finishes the job)."""
        for name, _before in reversed(done):
            try:
                claim = request(self.api, "GET", _claims_path(ns, name), timeout=self.timeout)
                _release_one(self.api, claim, {pod_name}, self.timeout)
            except Exception as exc:
                log.warning("claim %s/%s: rollback after a failed bind failed: %s", ns, name, exc)


def _allocated_on(allocation: dict[str, Any], node: str) -> bool:
    terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or []
    if not terms:
        return True
    for t in terms:
        for f in t.get("matchFields") or []:
            if f.get("key") == "metadata.name" and node in (f.get("values") or []):
                return True
    return False


def _release_one(api: client.ApiClient, claim: dict[str, Any], gone: set[str], timeout: Any) -> bool:
    """Drop the `gone` pods from the claim's reservedFor (and its allocation when nobody is left)."""
    status = dict(claim.get("status") or {})
    reserved = status.get("reservedFor") or []
    rest = [r for r in reserved if not (r.get("resource", "pods") == "pods" and r.get("name") in gone)]
    if len(rest) == len(reserved):
        return False
    status["reservedFor"] = rest
    if not rest:
        status.pop("allocation", None)
    meta = claim["metadata"]
    request(api, "PUT", _claims_path(meta["namespace"], meta["name"]) + "/status",
            body={**claim, "status": status}, timeout=timeout)
    return True


def release(api: client.ApiClient, cache: ClusterCache, timeout: Any = 10.0) -> int:
    """Every claim reserved for pods that are gone or finished lets them go; returns the claims written."""
    live: dict[tuple[str, str], dict[str, Any]] = {}
    for p in cache.list("Pod", "v1"):
        m = p.get("metadata") or {}
        live[(m.get("namespace") or "default", m.get("name") or "")] = p
    n = 0
    for claim in cache.list("ResourceClaim", API_VERSION):
        meta = claim.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        gone = set()
        for r in (claim.get("status") or {}).get("reservedFor") or []:
            if r.get("resource", "pods") != "pods":
                continue
            pod = live.get((ns, r.get("name") or ""))
            phase = ((pod or {}).get("status") or {}).get("phase")
            other = r.get("uid") and (pod or {}).get("metadata", {}).get("uid") != r.get("uid")
            if pod is None or other or phase in ("Succeeded", "Failed"):
                gone.add(r.get("name"))
        if not gone:
            continue
        try:
            n += _release_one(api, claim, gone, timeout)
        except Exception as exc:
            log.debug("claim %s/%s: release failed: %s", ns, meta.get("name"), exc)
    return n
