"""Queue capacity checks used by every engine: OverLimit and NonPreemptibleOverQuota, up the ancestors."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.share import FairShare
from kai_opt.state.resources import QR

UNLIMITED = -1.0
EPS = 1e-9


@dataclass(frozen=True)
class QuotaViolation:
    reason: str  # OverLimit | NonPreemptibleOverQuota
    queue: int  # the queue (the job's or an ancestor) whose bound is crossed
    resource: str
    bound: float  # the limit, or the deserved quota
    current: float  # allocated (or non-preemptible allocated) before the job
    requested: float

    def message(self, queue_names: list[str]) -> str:
        name = queue_names[self.queue]
        unit = {"gpu": "GPUs", "cpu": "millicores", "memory": "bytes"}[self.resource]
        if self.reason == "OverLimit":
            return (f"queue {name!r} would exceed its {self.resource} limit: limit {self.bound:g} {unit}, "
                    f"allocated {self.current:g}, this workload requests {self.requested:g}")
        return (f"non-preemptible workloads of queue {name!r} would exceed its {self.resource} quota: "
                f"quota {self.bound:g} {unit}, non-preemptible allocated {self.current:g}, "
                f"this workload requests {self.requested:g}")


def over_limit(fs: FairShare, ledger: QueueLedger, queue: int, request: np.ndarray) -> QuotaViolation | None:
    """The first queue on the way up whose limit allocated + request would cross."""
    for q in ledger.ancestors[queue]:
        for r in range(len(QR)):
            lim = fs.limit[q, r]
            if lim == UNLIMITED or request[r] == 0:
                continue
            if lim < ledger.allocated[q, r] + request[r] - EPS:
                return QuotaViolation("OverLimit", q, QR[r], float(lim), float(ledger.allocated[q, r]),
                                      float(request[r]))
    return None


def non_preemptible_over_quota(fs: FairShare, ledger: QueueLedger, queue: int,
                               request: np.ndarray) -> QuotaViolation | None:
    """Non-preemptible work may only use deserved (in-quota) resources, at the queue and every ancestor."""
    for q in ledger.ancestors[queue]:
        for r in range(len(QR)):
            quota = fs.deserved[q, r]
            if quota == UNLIMITED or request[r] == 0:
                continue
            if quota < ledger.allocated_np[q, r] + request[r] - EPS:
                return QuotaViolation("NonPreemptibleOverQuota", q, QR[r], float(quota),
                                      float(ledger.allocated_np[q, r]), float(request[r]))
    return None


def capacity_violation(fs: FairShare, ledger: QueueLedger, queue: int, request: np.ndarray, *,
                       preemptible: bool) -> QuotaViolation | None:
    """What KAI's IsJobOverQueueCapacity checks, in its order: limits first, then non-preemptible quota."""
    v = over_limit(fs, ledger, queue, request)
    if v is None and not preemptible:
        v = non_preemptible_over_quota(fs, ledger, queue, request)
    return v
