"""The binder: binds the plan's placements asynchronously (bounded worker pool, client QPS token bucket).

Per pod, one request: POST the `pods/binding` subresource with the pod's uid as a precondition and, for a GPU pod,
the devices it was given as an annotation of the Binding (`kai-opt.io/gpu-devices`). The API server applies a
Binding in one atomic update of the pod: it checks the uid and that the pod is not bound yet (else 409), copies
the Binding's annotations onto the pod and sets `spec.nodeName`, so a pod is never seen bound without its devices
recorded. A stale devices record on a pod bound without GPUs is overwritten with "" (read as none). Transient
errors (throttling, server errors, timeouts, connection loss) are retried with exponential backoff; a 404 (pod
gone), 409/422 (bound meanwhile, or a different pod of that name) or any permanent error ends the attempt and the
cache's assumption is dropped, so the pod is placed again next cycle. A 409/422 is checked against the pod (one
GET): if it is bound to our node on our devices, an earlier attempt of ours went through.

Right before the request, `recheck` (kai_opt.k8s.recheck) may check the pod still fits its node in the newest
cache (other schedulers bind onto the same nodes); a bind that no longer fits is dropped with reason `no-fit` (its
assumption too), and the pod is placed again next cycle.

A pod is never bound twice: a pod is accepted once while queued or in flight (keyed by uid), the cache counts it
as bound from acceptance on (so the next cycle does not place it again), and the API server refuses to bind a
bound pod (409) as the final guard. Every write first asks `fence()` (leadership): a replica that lost its Lease
drops its queued work.

A pod sharing a GPU (`gpu-fraction` / `gpu-memory`) gets KAI's GPU-sharing contract before its Binding is posted
(kai_opt/k8s/sharing.py: GPU group labels, the device's reservation pod and its report, the pod's shared-GPU
ConfigMaps); the Binding then also records `received-resource-type` and the ConfigMap prefix. A reservation that
does not report in time fails the bind with reason `reservation-timeout`; a failed bind removes the group labels.

With `runtime.binder: kai` the bind is handed to KAI-Scheduler's binder instead (kai_opt/k8s/kaibind.py): the
worker writes the pod's BindRequest (after the same fence and re-check), the pod counts as bound while it is
pending, and the bind's result is reported when the watch shows it bound or its BindRequest failed (`sync`).

Pipelined placements are not bound: `nominate` writes `status.nominatedNodeName` (informational) and the engine
places the pod again in a later cycle once its victims are gone. Consolidation moves are only evicted (their owner
re-creates the pod, which is then placed like any other).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from kai_opt.api.pod import GPU_DEVICES_ANNOTATION
from kai_opt.config import GpuSharing, KaiBinder
from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import MERGE_PATCH, object_path, request
from kai_opt.k8s.dra import ClaimError, ClaimWrite, ClaimWriter
from kai_opt.k8s.kaibind import KaiBindRequests
from kai_opt.k8s.sharing import GpuSharingBinder, SharingError
from kai_opt.k8s.workqueue import TokenBucket, WorkPool, backoff_delays, classify

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BindRequest:
    """Bind pod namespace/name (uid) to `node`, on GPU `devices` (indexes within the node)."""

    namespace: str
    name: str
    uid: str
    node: str
    devices: tuple[int, ...] = ()
    podgroup: str | None = None  # "namespace/name", for events and logs
    claims: tuple[ClaimWrite, ...] = ()  # DRA claims to allocate and reserve before the Binding (kai_opt.k8s.dra)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class BindResult:
    request: BindRequest
    ok: bool
    latency_s: float
    reason: str = ""  # failure: not-found | conflict | forbidden | invalid | error | dropped | no-fit
    message: str = ""


class _Dropped(Exception):
    """Stopping, or no longer the leader: queued work is abandoned."""


class _NoFit(Exception):
    """The pre-bind re-check found the pod no longer fits its node."""


class Binder:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, limiter: TokenBucket, *, workers: int = 16,
                 retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 10.0,
                 fence: Callable[[], bool] = lambda: True,
                 on_result: Callable[[BindResult], None] | None = None,
                 recheck: Callable[[BindRequest], str | None] | None = None,
                 sharing: GpuSharing | None = None, kai: KaiBinder | None = None) -> None:
        self.api = api
        self.cache = cache
        self.limiter = limiter
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout = (5.0, timeout_s)
        self.fence = fence
        self.on_result = on_result
        self.recheck = recheck  # None when it fits, else why not
        self.pool = WorkPool("binder", workers)
        self.claims = ClaimWriter(api, cache, self.timeout)
        self._stop = threading.Event()
        # KAI's GPU-sharing contract (kai_opt/k8s/sharing.py): a shared pod's group, reservation and ConfigMaps
        # are made before its Binding is posted, and undone when the bind fails
        self.sharing = GpuSharingBinder(api, cache, sharing, write=self._write, stop=self._stop,
                                        timeout=self.timeout) if sharing is not None and sharing.enabled else None
        # binder: kai: KAI's binder binds (and does the GPU-sharing contract itself), from our BindRequests
        self.kai = KaiBindRequests(api, cache, kai, write=self._write, done=self._done, make_request=BindRequest,
                                   timeout=self.timeout, claims=self.claims) if kai is not None else None
        if self.kai is not None:
            self.sharing = None

    # -- API -----------------------------------------------------------------------------------------------------
    def submit(self, requests: Iterable[BindRequest]) -> list[BindRequest]:
        """Queue binds; returns those accepted (a pod already queued or in flight is skipped). The cache counts an
        accepted pod as bound on its node from now on."""
        accepted = []
        for req in requests:
            if self._stop.is_set() or self.pool.busy(req.uid) or (self.kai is not None and self.kai.tracking(req.uid)):
                continue
            self.cache.assume_bound(req.uid, req.namespace, req.name, req.node, req.devices)
            if self.pool.submit(req.uid, lambda req=req: self._bind(req)):
                accepted.append(req)
            else:
                self.cache.forget_bound(req.uid)
        return accepted

    def nominate(self, pods: Iterable[tuple[str, str, str]]) -> int:
        """Write `status.nominatedNodeName` on pipelined pods (namespace, name, node) where it differs."""
        n = 0
        for ns, name, node in pods:
            pod = self.cache.pod(ns, name)
            if pod is None or (pod.get("spec") or {}).get("nodeName"):
                continue
            if (pod.get("status") or {}).get("nominatedNodeName") == node:
                continue
            if self.pool.submit(f"nominate/{ns}/{name}", lambda ns=ns, name=name, node=node:
                                self._nominate(ns, name, node), replace=True):
                n += 1
        return n

    def busy(self, uid: str) -> bool:
        return self.pool.busy(uid)

    def pending(self) -> int:
        return self.pool.pending()

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.pool.wait_idle(timeout)

    def stop(self) -> None:
        """Drop queued binds (their assumptions too); binds in flight finish their current request."""
        self._stop.set()
        self.pool.stop()

    # -- one bind ------------------------------------------------------------------------------------------------
    def _bind(self, req: BindRequest) -> None:
        start = time.monotonic()
        delays = backoff_delays(self.backoff_s, self.retries)
        attempt = 0
        while True:
            try:
                if self.kai is not None:
                    self._hand_off(req, start)
                    return
                self._post_binding(req)
                self._done(req, start, ok=True)
                return
            except _Dropped as exc:
                self._done(req, start, ok=False, reason="dropped", message=str(exc))
                return
            except _NoFit as exc:
                self._done(req, start, ok=False, reason="no-fit", message=str(exc))
                return
            except (SharingError, ClaimError) as exc:
                self._done(req, start, ok=False, reason=exc.reason, message=str(exc))
                return
            except Exception as exc:  # classified below; unexpected errors end the attempt
                failure = classify(exc)
                if failure.status in (409, 422) and self._bound_here(req):
                    self._done(req, start, ok=True)  # an earlier attempt of ours went through
                    return
                if failure.transient and attempt < len(delays):
                    log.debug("bind %s: %s %s; retrying", req.key, failure.status, failure.message)
                    if self._stop.wait(delays[attempt]):
                        self._done(req, start, ok=False, reason="dropped", message="stopping")
                        return
                    attempt += 1
                    continue
                reason = {404: "not-found", 409: "conflict", 422: "conflict", 403: "forbidden",
                          400: "invalid"}.get(failure.status, "error")
                self._done(req, start, ok=False, reason=reason, message=failure.message)
                return

    def _write(self) -> None:
        """Before each write: a token, and still allowed to write."""
        if self._stop.is_set() or not self.limiter.acquire(self._stop):
            raise _Dropped("stopping")
        self._check()

    def _check(self) -> None:
        if self._stop.is_set():
            raise _Dropped("stopping")
        if not self.fence():
            raise _Dropped("not the leader")

    def _post_binding(self, req: BindRequest) -> None:
        self._write()
        misfit = self.recheck(req) if self.recheck is not None else None
        if misfit:
            raise _NoFit(misfit)
        meta: dict[str, Any] = {"name": req.name, "namespace": req.namespace, "uid": req.uid}
        pod = self.cache.pod(req.namespace, req.name)
        annotations = binding_annotations(pod, req)
        if self.sharing is not None:
            annotations.update(self.sharing.prepare(pod, req.node, req.devices))
        if annotations:
            meta["annotations"] = annotations
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": req.node}}
        # DRA: the claims are allocated and reserved for the pod first, as kube-scheduler's PreBind does
        written = self.claims.prepare(req.namespace, req.name, req.uid, req.node, req.claims) if req.claims else []
        try:
            request(self.api, "POST", object_path("v1", "pods", req.namespace, req.name) + "/binding", body=body,
                    timeout=self.timeout)
        except Exception as exc:
            if written and not (classify(exc).status in (409, 422) and self._bound_here(req)):
                self.claims.rollback(req.namespace, req.name, written)
            raise

    def _hand_off(self, req: BindRequest, start: float) -> None:
        """binder: kai: write the pod's BindRequest; its result comes from `KaiBindRequests.sync`."""
        assert self.kai is not None
        self._write()
        misfit = self.recheck(req) if self.recheck is not None else None
        if misfit:
            raise _NoFit(misfit)
        self.kai.hand_off(req, start)
        self.cache.bind_accepted(req.uid)

    def _bound_here(self, req: BindRequest) -> bool:
        try:
            pod = request(self.api, "GET", object_path("v1", "pods", req.namespace, req.name), timeout=self.timeout)
        except Exception:  # cannot tell: treat as not ours
            return False
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        devices = (meta.get("annotations") or {}).get(GPU_DEVICES_ANNOTATION) or ""
        # ours only with our devices too: a pod an earlier run bound to this node on other devices is a conflict,
        # so the cache drops our assumption and reads the devices the pod really has
        return (meta.get("uid") == req.uid and spec.get("nodeName") == req.node
                and devices == ",".join(str(d) for d in req.devices))

    def _done(self, req: BindRequest, start: float, *, ok: bool, reason: str = "", message: str = "") -> None:
        if ok:
            self.cache.bind_accepted(req.uid)
        else:
            if self.sharing is not None:
                self.sharing.rollback(self.cache.pod(req.namespace, req.name), req.node, req.devices)
            if self.kai is not None and reason != "dropped":  # KAI's binder may have reserved the pod's claims
                self.claims.release_pod(req.namespace, req.name, req.uid)
            self.cache.forget_bound(req.uid)
            if reason != "dropped":
                log.warning("bind %s to %s failed (%s): %s", req.key, req.node, reason, message)
        if self.on_result is not None:
            try:
                self.on_result(BindResult(req, ok, time.monotonic() - start, reason, message))
            except Exception:
                log.exception("bind result handler failed")

    def _nominate(self, ns: str, name: str, node: str) -> None:
        try:
            self._write()
            request(self.api, "PATCH", object_path("v1", "pods", ns, name) + "/status",
                    body={"status": {"nominatedNodeName": node}}, content_type=MERGE_PATCH, timeout=self.timeout)
        except _Dropped:
            return
        except Exception as exc:  # informational only
            f = classify(exc)
            log.debug("nominate %s/%s on %s: %s %s", ns, name, node, f.status, f.message)


def binding_annotations(pod: dict[str, Any] | None, req: BindRequest) -> dict[str, str]:
    """Annotations the Binding writes onto the pod as it binds it: the GPU devices given (indexes within the node),
    or "" over a stale record when the pod gets none; nothing for a pod without GPUs and without a record."""
    want = ",".join(str(d) for d in req.devices)
    have = (((pod or {}).get("metadata") or {}).get("annotations") or {}).get(GPU_DEVICES_ANNOTATION)
    if want or have:
        return {GPU_DEVICES_ANNOTATION: want}
    return {}
