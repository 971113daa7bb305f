"""The evictor: the plan's evictions through the Eviction API (policy/v1 `pods/eviction`, honouring
PodDisruptionBudgets), asynchronously on a bounded worker pool sharing the client's token bucket.

Every pod the plan evicts is evicted, so a gang planned out whole is evicted whole (one refusal does not stop the
others). The cache counts an accepted victim as releasing (being deleted) from acceptance on, so the next cycle
neither evicts it again nor gives its resources away twice. Answers:
- 200/201: evicted; the pod is deleted gracefully and the watch shows it go;
- 429 naming a disruption budget: refused; the victim keeps running and its beneficiary simply waits (the next
  cycle plans again; that victim's eviction is not tried again for `blocked_retry_s`); any other 429 (API
  throttling), 5xx, timeouts and connection errors are retried with backoff;
- 404: already gone; 409: the uid precondition failed (a new pod of that name): nothing to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kai_opt.k8s.cache import ClusterCache
from kai_opt.k8s.client import object_path, request
from kai_opt.k8s.workqueue import TokenBucket, WorkPool, backoff_delays, classify

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvictRequest:
    namespace: str
    name: str
    uid: str
    reason: str  # reclaim | preempt | consolidate | stale-gang
    node: str | None = None
    podgroup: str | None = None  # "namespace/name" of the victim's group
    beneficiary: str | None = None  # "namespace/name" of the podgroup the eviction makes room for

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class EvictResult:
    request: EvictRequest
    ok: bool
    blocked: bool = False  # refused by a PodDisruptionBudget
    reason: str = ""  # failure: blocked | conflict | forbidden | error | dropped; success: "" or gone
    message: str = ""


class Evictor:
    def __init__(self, api: client.ApiClient, cache: ClusterCache, limiter: TokenBucket, *, workers: int = 16,
                 retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 10.0, blocked_retry_s: float = 5.0,
                 fence: Callable[[], bool] = lambda: True,
                 on_result: Callable[[EvictResult], None] | None = None) -> None:
        self.api = api
        self.blocked_retry_s = blocked_retry_s
        self._blocked: dict[str, float] = {}  # uid -> monotonic time before which a refused eviction waits
        self.cache = cache
        self.limiter = limiter
        self.retries = retries
        self.backoff_s = backoff_s
        self.timeout = (5.0, timeout_s)
        self.fence = fence
        self.on_result = on_result
        self.pool = WorkPool("evictor", workers)
        self._stop = threading.Event()

    def submit(self, requests: Iterable[EvictRequest]) -> list[EvictRequest]:
        """Queue evictions; returns those accepted (a pod already queued or in flight is skipped)."""
        accepted = []
        now = time.monotonic()
        self._blocked = {uid: t for uid, t in self._blocked.items() if t > now}
        for req in requests:
            if self._stop.is_set() or self.pool.busy(req.uid) or req.uid in self._blocked:
                continue
            self.cache.assume_releasing(req.uid)
            if self.pool.submit(req.uid, lambda req=req: self._evict(req)):
                accepted.append(req)
            else:
                self.cache.forget_releasing(req.uid)
        return accepted

    def pending(self) -> int:
        return self.pool.pending()

    def wait_idle(self, timeout: float | None = None) -> bool:
        return self.pool.wait_idle(timeout)

    def stop(self) -> None:
        self._stop.set()
        self.pool.stop()

    def _evict(self, req: EvictRequest) -> None:
        delays = backoff_delays(self.backoff_s, self.retries)
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": req.name, "namespace": req.namespace},
                "deleteOptions": {"preconditions": {"uid": req.uid}}}
        path = object_path("v1", "pods", req.namespace, req.name) + "/eviction"
        attempt = 0
        while True:
            if self._stop.is_set() or not self.limiter.acquire(self._stop):
                return self._done(req, False, reason="dropped", message="stopping")
            if not self.fence():
                return self._done(req, False, reason="dropped", message="not the leader")
            try:
                request(self.api, "POST", path, body=body, timeout=self.timeout)
                return self._done(req, True)
            except Exception as exc:  # classified below
                failure = classify(exc)
                if failure.status == 429 and _disruption_budget(exc):
                    return self._done(req, False, blocked=True, reason="blocked", message=failure.message)
                if failure.status == 404:
                    return self._done(req, True, reason="gone")
                if failure.transient and attempt < len(delays):
                    if self._stop.wait(delays[attempt]):
                        return self._done(req, False, reason="dropped", message="stopping")
                    attempt += 1
                    continue
                reason = {409: "conflict", 403: "forbidden"}.get(failure.status, "error")
                return self._done(req, False, reason=reason, message=failure.message)

    def _done(self, req: EvictRequest, ok: bool, *, blocked: bool = False, reason: str = "",
              message: str = "") -> None:
        if ok:
            self.cache.eviction_accepted(req.uid)
        else:
            self.cache.forget_releasing(req.uid)
            if blocked:
                self._blocked[req.uid] = time.monotonic() + self.blocked_retry_s
                log.info("evict %s: refused by a disruption budget; it keeps running (%s)", req.key, message)
            elif reason != "dropped":
                log.warning("evict %s failed (%s): %s", req.key, reason, message)
        if self.on_result is not None:
            try:
                self.on_result(EvictResult(req, ok, blocked, reason, message))
            except Exception:
                log.exception("eviction result handler failed")


def _disruption_budget(exc: BaseException) -> bool:
    """A 429 of the Eviction API caused by a PodDisruptionBudget (not API throttling)."""
    if not isinstance(exc, ApiException):
        return False
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    return "DisruptionBudget" in body or "disruption budget" in body.lower()
