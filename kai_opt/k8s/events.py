"""Kubernetes Events (core/v1) about pods, PodGroups, Queues and nodes, rate limited.

The same (object, reason, message) is not sent again within `repeat_s`; beyond a global budget (token bucket,
`qps`/`burst`) events are dropped and counted, never queued up. Writes run on the status pool, so recording never
blocks a cycle. Events of cluster-scoped objects (Queues, Nodes) go to namespace `default`, as kubectl expects.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from kai_opt.k8s.client import object_path, request
from kai_opt.k8s.workqueue import TokenBucket, WorkPool, classify

log = logging.getLogger(__name__)

COMPONENT = "kai-opt"
NORMAL, WARNING = "Normal", "Warning"


def object_ref(obj: dict[str, Any]) -> dict[str, Any]:
    """The involvedObject of an event about `obj` (a raw object, or a ref with apiVersion/kind/metadata)."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind"), "name": meta.get("name")}
    if meta.get("namespace"):
        ref["namespace"] = meta["namespace"]
    if meta.get("uid"):
        ref["uid"] = meta["uid"]
    return ref


def pod_ref(namespace: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": namespace, "name": name, "uid": uid}}


class EventRecorder:
    def __init__(self, api: client.ApiClient, pool: WorkPool, *, qps: float = 10.0, burst: int = 100,
                 repeat_s: float = 60.0, instance: str = "", client_limiter: TokenBucket | None = None,
                 fence: Callable[[], bool] = lambda: True, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.pool = pool
        self.budget = TokenBucket(qps, burst, clock=clock)
        self.repeat_s = repeat_s
        self.instance = instance
        self.client_limiter = client_limiter
        self.fence = fence
        self.clock = clock
        self.dropped = 0
        self.sent = 0
        self._last: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._pruned = clock()

    def emit(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> bool:
        """Record an event about `obj`; False when suppressed (repeat window or budget)."""
        ref = object_ref(obj)
        ident = ref.get("uid") or f"{ref.get('kind')}/{ref.get('namespace', '')}/{ref.get('name')}"
        key = (ident, reason, message)
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.repeat_s:
                return False
            if not self.budget.try_acquire():
                self.dropped += 1
                return False
            self._last[key] = now
            if now - self._pruned > max(self.repeat_s, 1.0):
                self._last = {k: t for k, t in self._last.items() if now - t < self.repeat_s}
                self._pruned = now
        event = _event(ref, type_, reason, message, self.instance)
        return self.pool.submit(f"event/{event['metadata']['name']}", lambda: self._send(event, key))

    def _send(self, event: dict[str, Any], key: tuple[str, str, str]) -> None:
        if not self.fence():
            return
        if self.client_limiter is not None:
            self.client_limiter.acquire()
        ns = event["metadata"]["namespace"]
        try:
            request(self.api, "POST", object_path("v1", "events", ns), body=event)
            with self._lock:
                self.sent += 1
        except Exception as exc:  # events are best effort
            f = classify(exc)
            log.debug("event %s on %s: %s %s", event["reason"], event["involvedObject"].get("name"), f.status,
                      f.message)
            with self._lock:
                self._last.pop(key, None)


def _event(ref: dict[str, Any], type_: str, reason: str, message: str, instance: str) -> dict[str, Any]:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = f"{ref.get('name')}.{uuid.uuid4().hex[:16]}"[-253:].lstrip(".-")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": ref.get("namespace") or "default"},
        "involvedObject": ref,
        "reason": reason,
        "message": message[:1024],
        "type": type_,
        "source": {"component": COMPONENT},
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "reportingComponent": COMPONENT,
        "reportingInstance": instance or COMPONENT,
    }
