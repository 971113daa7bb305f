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


def _drf(fs: FairShare, allocatable: np.ndarray, allocated: np.ndarray) -> float:
    best = 0.0
    for r in range(len(allocated)):
        share = allocatable[r]
        if share == UNLIMITED:
            share = fs.total[r]
        value = allocated[r] * NO_SHARE_DRF_PENALTY if share == 0 else allocated[r] / share
        best = max(best, value)
    return best


class QueueOrder:
    """Compares sibling queues given the resources of the job each would run next."""

    def __init__(self, fs: FairShare, ledger: QueueLedger, names: list[str], creation: np.ndarray,
                 priority: np.ndarray) -> None:
        self.fs = fs
        self.ledger = ledger
        self.names = names
        self.creation = creation
        self.priority = priority
        self.allocatable = fs.allocatable_share

    def compare(self, a: int, b: int, job_a: np.ndarray, job_b: np.ndarray) -> int:
        """-1 when queue a goes first, 1 when b does (never 0)."""
        fs, alloc = self.fs, self.ledger.allocated
        over_a = less_all(fs.fair_share[a], alloc[a])
        over_b = less_all(fs.fair_share[b], alloc[b])
        if over_a != over_b:
            return 1 if over_a else -1
        with_a, with_b = alloc[a] + job_a, alloc[b] + job_b
        starved_a, starved_b = le(with_a, fs.deserved[a]), le(with_b, fs.deserved[b])
        if starved_a != starved_b:
            return -1 if starved_a else 1
        if self.priority[a] != self.priority[b]:
            return -1 if self.priority[a] > self.priority[b] else 1
        zero_a = bool(np.any((self.allocatable[a] == 0) & (with_a > 0)))
        zero_b = bool(np.any((self.allocatable[b] == 0) & (with_b > 0)))
        if zero_a != zero_b:
            return 1 if zero_a else -1
        da, db = _drf(fs, self.allocatable[a], with_a), _drf(fs, self.allocatable[b], with_b)
        if da != db:
            return -1 if da < db else 1
        da, db = _drf(fs, self.allocatable[a], alloc[a]), _drf(fs, self.allocatable[b], alloc[b])
        if da != db:
            return -1 if da < db else 1
        sa, sb = self.allocatable[a], self.allocatable[b]
        if less_somewhere(sa, sb) and le(sa, sb):
            return -1
        if less_somewhere(sb, sa) and le(sb, sa):
            return 1
        ca = self.creation[a] if not math.isnan(self.creation[a]) else math.inf
        cb = self.creation[b] if not math.isnan(self.creation[b]) else math.inf
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
