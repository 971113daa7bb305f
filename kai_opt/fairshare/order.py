"""Queue order for allocation (KAI's queue-order function); the first rule that tells two queues apart wins:

1. not over fair share before over (over = fair share < allocated in every resource);
2. within deserved with its next job before over deserved;
3. higher queue priority;
4. a queue using a resource it has no allocatable share of goes after one that does not;
5. smaller dominant (DRF) share counting its next job;
6. smaller dominant share without it;
7. smaller allocatable share (less in some resource and <= in all);
8. older, then name.
Siblings are compared at each level of the tree: the best top-level queue, then its best child, and so on.
"""

from __future__ import annotations

import math

import numpy as np

from kai_opt.fairshare.ledger import QueueLedger
from kai_opt.fairshare.quantities import le, less_all, less_somewhere
from kai_opt.fairshare.share import NO_SHARE_DRF_PENALTY, UNLIMITED, FairShare


def _drf(total: list[float], allocatable: list[float], allocated: list[float]) -> float:
    best = 0.0
    for t, share, used in zip(total, allocatable, allocated, strict=True):
        if share == UNLIMITED:
            share = t
        best = max(best, used * NO_SHARE_DRF_PENALTY if share == 0 else used / share)
    return best


class QueueOrder:
    """Compares sibling queues given the resources of the job each would run next."""

    def __init__(self, fs: FairShare, ledger: QueueLedger, names: list[str], creation: np.ndarray,
                 priority: np.ndarray) -> None:
        self.fs = fs
        self.ledger = ledger
        self.names = names
        self.creation = [c if not math.isnan(c) else math.inf for c in creation.tolist()]
        self.priority = priority.tolist()
        self.allocatable = fs.allocatable_share.tolist()
        self.fair_share = fs.fair_share.tolist()
        self.deserved = fs.deserved.tolist()
        self.total = fs.total.tolist()

    def compare(self, a: int, b: int, job_a: np.ndarray, job_b: np.ndarray) -> int:
        """-1 when queue a goes first, 1 when b does (never 0)."""
        alloc_a, alloc_b = self.ledger.allocated[a].tolist(), self.ledger.allocated[b].tolist()
        over_a = less_all(self.fair_share[a], alloc_a)
        over_b = less_all(self.fair_share[b], alloc_b)
        if over_a != over_b:
            return 1 if over_a else -1
        with_a = [x + y for x, y in zip(alloc_a, job_a.tolist(), strict=True)]
        with_b = [x + y for x, y in zip(alloc_b, job_b.tolist(), strict=True)]
        starved_a, starved_b = le(with_a, self.deserved[a]), le(with_b, self.deserved[b])
        if starved_a != starved_b:
            return -1 if starved_a else 1
        if self.priority[a] != self.priority[b]:
            return -1 if self.priority[a] > self.priority[b] else 1
        sa, sb = self.allocatable[a], self.allocatable[b]
        zero_a = any(s == 0 and w > 0 for s, w in zip(sa, with_a, strict=True))
        zero_b = any(s == 0 and w > 0 for s, w in zip(sb, with_b, strict=True))
        if zero_a != zero_b:
            return 1 if zero_a else -1
        da, db = _drf(self.total, sa, with_a), _drf(self.total, sb, with_b)
        if da != db:
            return -1 if da < db else 1
        da, db = _drf(self.total, sa, alloc_a), _drf(self.total, sb, alloc_b)
        if da != db:
            return -1 if da < db else 1
        if less_somewhere(sa, sb) and le(sa, sb):
            return -1
        if less_somewhere(sb, sa) and le(sb, sa):
            return 1
        ca, cb = self.creation[a], self.creation[b]
        if ca != cb:
            return -1 if ca < cb else 1
        return -1 if self.names[a] <= self.names[b] else 1

    def best(self, candidates: list[int], job: dict[int, np.ndarray]) -> int:
        """The queue that goes first among siblings (job[q]: resources of the job q would run next)."""
        best = candidates[0]
        for q in candidates[1:]:
            if self.compare(q, best, job[q], job[best]) < 0:
                best = q
        return best
