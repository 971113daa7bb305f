"""Sharing a cluster with other schedulers (KAI-Scheduler, kube-scheduler): which objects are kai-opt's to write,
and which pod failures are the kubelet refusing a placement.

- A PodGroup is kai-opt's when at least one pod that names it (any phase) has one of kai-opt's scheduler names.
  A PodGroup without such a pod, including one with no pods at all, belongs to whoever schedules its pods
  (KAI-Scheduler, or nobody yet): kai-opt writes no status, condition, annotation or Event on it.
- Queue status is KAI's queue controller's while KAI-Scheduler is installed, detected by KAI's BindRequest CRD
  (`bindrequests.scheduling.run.ai`, which only KAI installs) in API discovery; config `runtime.queue_status`
  (auto | always | never) decides, auto following the detection.
- The kubelet rejects a pod at admission by setting it Failed with `status.reason` `OutOf<resource>` (OutOfcpu,
  OutOfmemory, OutOfnvidia.com/gpu, ...) or `UnexpectedAdmissionError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from kubernetes.client.exceptions import ApiException

from kai_opt.api import Pod
from kai_opt.k8s.client import request

log = logging.getLogger(__name__)

KAI_MARKER_GROUP_VERSION = "scheduling.run.ai/v1alpha2"
KAI_MARKER_RESOURCE = "bindrequests"
ADMISSION_ERROR = "UnexpectedAdmissionError"


def owned_podgroups(pods: Iterable[Pod], scheduler_names: Collection[str]) -> set[str]:
    """`namespace/name` of the PodGroups kai-opt owns: named by at least one pod with one of `scheduler_names`."""
    ours = set(scheduler_names)
    return {p.group_key for p in pods if p.group_key and p.scheduler_name in ours}


def pod_is_ours(pod: dict[str, Any] | None, scheduler_names: Collection[str]) -> bool:
    return ((pod or {}).get("spec") or {}).get("schedulerName") in set(scheduler_names)


def kubelet_rejection(pod: dict[str, Any] | None) -> str | None:
    """The reason the kubelet gave for rejecting this bound pod at admission, or None."""
    if not pod or not (pod.get("spec") or {}).get("nodeName"):
        return None
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return None
    reason = status.get("reason")
    if isinstance(reason, str) and (reason.startswith("OutOf") or reason == ADMISSION_ERROR):
        return reason
    return None


class KaiDetector:
    """Whether KAI-Scheduler is installed: its BindRequest kind is served (one discovery GET, answered from memory
    for `recheck_s`). A failed look keeps the last answer; before any answer it counts as installed, so KAI's
    status is never overwritten because the API server was briefly unreachable."""

    def __init__(self, api: Any, recheck_s: float = 30.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.recheck_s = recheck_s
        self.clock = clock
        self._lock = threading.Lock()
        self._answer: bool | None = None
        self._checked = -float("inf")

    def installed(self) -> bool:
        with self._lock:
            now = self.clock()
            if self._answer is not None and now - self._checked < self.recheck_s:
                return self._answer
            self._checked = now
            try:
                found = self._look()
            except Exception as exc:  # keep the last answer; look again after recheck_s
                log.warning("looking for KAI-Scheduler (%s %s): %s", KAI_MARKER_RESOURCE, KAI_MARKER_GROUP_VERSION,
                            " ".join(str(exc).split())[:200])
                return True if self._answer is None else self._answer
            if found != self._answer:
                log.info("KAI-Scheduler %s (%s.%s %s)", "installed" if found else "not installed",
                         KAI_MARKER_RESOURCE, KAI_MARKER_GROUP_VERSION.split("/")[0],
                         "served" if found else "not served")
            self._answer = found
            return found

    def _look(self) -> bool:
        try:
            doc = request(self.api, "GET", f"/apis/{KAI_MARKER_GROUP_VERSION}", timeout=(5.0, 10.0))
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == KAI_MARKER_RESOURCE for r in (doc.get("resources") or [])
                   if isinstance(r, dict))


def writes_queue_status(mode: str, detector: KaiDetector | None) -> bool:
    """Whether kai-opt writes Queue status (config runtime.queue_status: always | never | auto)."""
    if mode == "always":
        return True
    if mode == "never":
        return False
    return detector is None or not detector.installed()
